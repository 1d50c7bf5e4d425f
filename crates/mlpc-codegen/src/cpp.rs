//! Small helpers for writing the generated C++: type names, run-time extents as expressions, and
//! the symbols those expressions use (which become kernel arguments).

use mlpc_ir::{Activation, DType, Extent, MatLayout};
use std::collections::BTreeSet;

/// The template element type of a dtype.
pub fn elem_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "mlpc::f16",
        DType::Bf16 => "mlpc::bf16",
    }
}

pub fn act_kind(a: Activation) -> &'static str {
    match a {
        Activation::Relu => "mlpc::ActKind::Relu",
        Activation::Gelu => "mlpc::ActKind::Gelu",
        Activation::GeluTanh => "mlpc::ActKind::GeluTanh",
        Activation::Silu => "mlpc::ActKind::Silu",
        Activation::Sigmoid => "mlpc::ActKind::Sigmoid",
        Activation::Tanh => "mlpc::ActKind::Tanh",
    }
}

pub fn layout(l: MatLayout) -> &'static str {
    match l {
        MatLayout::N => "mlpc::Layout::N",
        MatLayout::T => "mlpc::Layout::T",
    }
}

/// The C++ name of the kernel argument carrying symbol `s`.
pub fn sym_arg(s: &str) -> String {
    format!("sym_{s}")
}

/// Collects the symbols used by the extents written into one kernel.
#[derive(Default)]
pub struct Symbols {
    used: BTreeSet<String>,
}

impl Symbols {
    /// `e` as a C++ expression of type `long long`: a literal, or a product of symbol arguments
    /// (each a `long long`) and a constant.
    pub fn expr(&mut self, e: &Extent) -> String {
        let mut parts: Vec<String> = Vec::new();
        for s in &e.syms {
            self.used.insert(s.to_string());
            parts.push(sym_arg(s));
        }
        if parts.is_empty() {
            return literal(e.coeff);
        }
        if e.coeff != 1 {
            parts.push(literal(e.coeff));
        }
        parts.join(" * ")
    }

    /// The symbols used so far, in sorted order: the kernel's trailing arguments.
    pub fn into_sorted(self) -> Vec<String> {
        self.used.into_iter().collect()
    }
}

fn literal(v: u64) -> String {
    if v <= i32::MAX as u64 {
        v.to_string()
    } else {
        format!("{v}LL")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::Dim;

    #[test]
    fn extents_become_products_of_symbol_arguments() {
        let mut s = Symbols::default();
        let bt = Extent::of_dim(&Dim::sym("T"))
            .checked_mul(&Extent::of_dim(&Dim::sym("B")))
            .unwrap()
            .checked_mul(&Extent::constant(768))
            .unwrap();
        assert_eq!(s.expr(&bt), "sym_B * sym_T * 768");
        assert_eq!(s.expr(&Extent::constant(3072)), "3072");
        assert_eq!(s.expr(&Extent::constant(1 << 40)), "1099511627776LL");
        assert_eq!(s.into_sorted(), vec!["B".to_string(), "T".to_string()]);
    }
}
