//! The stable text form: one node per line in deterministic topological order. Snapshots, dumps
//! (`--print-after`) and error messages all use it.
//!
//! ```text
//! graph "gpt2-mlp" {
//!   %x = input : bf16[T,768]
//!   %fc1.weight = weight : bf16[3072,768]
//!   %w1t = transpose %fc1.weight : bf16[768,3072] strides=[1,768]
//!   %h = gemm.nt %x, %fc1.weight then bias(%fc1.bias), gelu_tanh : bf16[T,3072]
//!   %o = sparse_gemm.nt %h, %fc2.weight.bsr blocks=32x32 kept=576/2304 then bias(%fc2.bias) : bf16[T,768]
//!   return y = %h
//! }
//! ```

use crate::graph::{Graph, NodeId};
use crate::op::{Epilogue, Op, SparseGemm};
use std::fmt::{self, Write};

fn operand_name(g: &Graph, ops: &[NodeId], i: usize) -> String {
    match ops.get(i) {
        Some(&n) if g.contains(n) => format!("%{}", g.node(n).name),
        _ => format!("%<missing operand {i}>"),
    }
}

fn chain(g: &Graph, ops: &[NodeId], steps: &[Epilogue]) -> String {
    let parts: Vec<String> = steps
        .iter()
        .map(|s| match *s {
            Epilogue::Bias { operand } => format!("bias({})", operand_name(g, ops, operand)),
            Epilogue::Add { operand } => format!("add({})", operand_name(g, ops, operand)),
            Epilogue::Mul { operand } => format!("mul({})", operand_name(g, ops, operand)),
            Epilogue::Act(a) => a.name().to_string(),
        })
        .collect();
    parts.join(", ")
}

/// `%name = op operands [params] : type`
pub fn node_line(g: &Graph, id: NodeId) -> String {
    let n = g.node(id);
    let ops = g.operands(id);
    let mut s = format!("%{} = ", n.name);
    match &n.op {
        Op::Gemm(gm) | Op::SparseGemm(SparseGemm { gemm: gm, .. }) => {
            let _ = write!(s, "{}.{}{}", n.op.mnemonic(), gm.a.letter(), gm.b.letter());
            let m: Vec<String> = (0..gm.matrix_operands())
                .map(|i| operand_name(g, &ops, i))
                .collect();
            let _ = write!(s, " {}", m.join(", "));
            if let Op::SparseGemm(sp) = &n.op {
                let p = &sp.pattern;
                let _ = write!(
                    s,
                    " blocks={}x{} kept={}/{}",
                    p.block[0],
                    p.block[1],
                    p.kept.len(),
                    p.total_blocks()
                );
            }
            if let Some(d) = &gm.dual {
                let _ = write!(
                    s,
                    " gate[{}] up[{}] mul",
                    chain(g, &ops, &d.gate),
                    chain(g, &ops, &d.up)
                );
            }
            if !gm.epilogue.is_empty() {
                let _ = write!(s, " then {}", chain(g, &ops, &gm.epilogue));
            }
        }
        op => {
            s.push_str(op.mnemonic());
            let names: Vec<String> = (0..ops.len()).map(|i| operand_name(g, &ops, i)).collect();
            if !names.is_empty() {
                let _ = write!(s, " {}", names.join(", "));
            }
        }
    }
    let _ = write!(s, " : {}", n.ty);
    s
}

pub(crate) fn write_graph(g: &Graph, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(f, "graph {:?} {{", g.name)?;
    let order = match g.topo_order() {
        Ok(o) => o,
        // A cyclic graph still prints (in insertion order) so that error messages can show it.
        Err(_) => g.node_ids().collect(),
    };
    for id in order {
        writeln!(f, "  {}", node_line(g, id))?;
    }
    for o in g.outputs() {
        let target = if g.contains(o.node) {
            g.node(o.node).name.clone()
        } else {
            "<removed>".into()
        };
        if target == o.name {
            writeln!(f, "  return %{target}")?;
        } else {
            writeln!(f, "  return {} = %{target}", o.name)?;
        }
    }
    writeln!(f, "}}")
}
