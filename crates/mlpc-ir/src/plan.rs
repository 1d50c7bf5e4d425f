//! The kernel plan: what an optimised graph becomes once every compute node is a kernel. Kernels
//! in launch order, the buffers they read and write, and the guards the inputs must pass. It is
//! backend-neutral: the CUDA and CPU backends run the same plan, and `plan.json` is its serialised
//! form.
//!
//! Invariants (checked by [`Plan::check`]):
//! - buffer ids index `buffers`; every kernel argument and output names an existing buffer;
//! - a kernel reads only buffers that are inputs, weights, or written by an earlier kernel;
//! - every intermediate and output buffer is written by exactly one kernel;
//! - kernel names are unique.

use crate::op::Op;
use crate::types::{DType, Dim, Extent, Shape, Strides, TensorType};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

/// Index into [`Plan::buffers`].
pub type BufferId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// Supplied by the caller at run time; guarded.
    Input,
    /// A constant uploaded once, from the weights table.
    Weight,
    /// Written by one kernel, read by later ones, never seen by the caller.
    Intermediate,
    /// Returned to the caller.
    Output,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub kind: BufferKind,
    #[serde(flatten)]
    pub ty: TensorType,
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Readable and deterministic, e.g. `gemm_bias_gelu_tanh_bf16_nt_0`; unique in the plan.
    pub name: String,
    /// What the kernel computes: a fused `gemm`/`dual_gemm`, or an elementwise op
    /// (`add`, `mul`, an activation) over possibly strided operands; `transpose` materialises a
    /// view that is returned as an output.
    pub op: Op,
    /// Names of the source-graph nodes this kernel computes (fused or folded into it).
    pub covers: Vec<String>,
    /// Operands in the order of the op's operand slots.
    pub args: Vec<BufferId>,
    pub out: BufferId,
}

/// What a run-time input must satisfy for the kernels to be correct.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Guard {
    pub tensor: String,
    pub dtype: DType,
    pub shape: Shape,
    pub strides: Strides,
    /// Required alignment of the base address in bytes (vector loads).
    pub align_bytes: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub name: String,
    pub dtype: DType,
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<Kernel>,
    /// Output name → buffer.
    pub outputs: Vec<(String, BufferId)>,
    pub guards: Vec<Guard>,
}

impl Plan {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id]
    }

    pub fn buffer_id(&self, name: &str) -> Option<BufferId> {
        self.buffers.iter().position(|b| b.name == name)
    }

    /// Checks the invariants listed in the module documentation; returns each violation.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut errs = Vec::new();
        let mut written = vec![0usize; self.buffers.len()];
        let mut names = std::collections::BTreeSet::new();
        for k in &self.kernels {
            if !names.insert(k.name.as_str()) {
                errs.push(format!("kernel name `{}` appears twice", k.name));
            }
            // Names become file names (`kernels/<name>.cu`) and C++ identifiers: letters, digits
            // and `_` only, so that a plan read from a directory names no file outside it.
            let ident = !k.name.is_empty()
                && k.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ident {
                errs.push(format!(
                    "kernel name `{}` is not made of letters, digits and `_`",
                    k.name
                ));
            }
            for &a in &k.args {
                match self.buffers.get(a) {
                    None => errs.push(format!(
                        "kernel `{}` reads buffer {a}, which does not exist",
                        k.name
                    )),
                    Some(b) => {
                        let ready = matches!(b.kind, BufferKind::Input | BufferKind::Weight)
                            || written[a] > 0;
                        if !ready {
                            errs.push(format!(
                                "kernel `{}` reads `{}` before any kernel writes it",
                                k.name, b.name
                            ));
                        }
                    }
                }
            }
            match self.buffers.get(k.out) {
                None => errs.push(format!(
                    "kernel `{}` writes buffer {}, which does not exist",
                    k.name, k.out
                )),
                Some(b) if matches!(b.kind, BufferKind::Input | BufferKind::Weight) => {
                    errs.push(format!(
                        "kernel `{}` writes `{}`, which is read-only",
                        k.name, b.name
                    ))
                }
                Some(_) => written[k.out] += 1,
            }
        }
        for (i, b) in self.buffers.iter().enumerate() {
            if matches!(b.kind, BufferKind::Intermediate | BufferKind::Output) && written[i] != 1 {
                errs.push(format!(
                    "buffer `{}` is written by {} kernels, expected 1",
                    b.name, written[i]
                ));
            }
        }
        for (name, id) in &self.outputs {
            if self.buffers.get(*id).is_none() {
                errs.push(format!(
                    "output `{name}` names buffer {id}, which does not exist"
                ));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }
}

// ---- serde for types: dims are numbers or symbol names; strides are numbers or "768*T" ----

impl Serialize for Dim {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Dim::Fixed(n) => s.serialize_u64(*n),
            Dim::Sym(v) => s.serialize_str(v),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Num(u64),
    Str(String),
}

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dim, D::Error> {
        Ok(match NumOrStr::deserialize(d)? {
            NumOrStr::Num(n) => Dim::Fixed(n),
            NumOrStr::Str(s) => Dim::sym(&s),
        })
    }
}

impl Serialize for Extent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.as_constant() {
            Some(n) => s.serialize_u64(n),
            None => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Extent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Extent, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Num(n) => Ok(Extent::constant(n)),
            NumOrStr::Str(s) => {
                let mut e = Extent::constant(1);
                for part in s.split('*') {
                    let f = match part.parse::<u64>() {
                        Ok(n) => Extent::constant(n),
                        Err(_) if crate::types::is_valid_symbol(part) => {
                            Extent::of_dim(&Dim::sym(part))
                        }
                        Err(_) => {
                            return Err(serde::de::Error::custom(format!("bad stride `{s}`")))
                        }
                    };
                    e = e.checked_mul(&f).ok_or_else(|| {
                        serde::de::Error::custom(format!("stride `{s}` overflows"))
                    })?;
                }
                Ok(e)
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct TensorTypeRepr {
    dtype: DType,
    shape: Vec<Dim>,
    strides: Vec<Extent>,
}

impl Serialize for TensorType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TensorTypeRepr {
            dtype: self.dtype,
            shape: self.shape.to_vec(),
            strides: self.strides.to_vec(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TensorType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TensorType, D::Error> {
        let r = TensorTypeRepr::deserialize(d)?;
        if r.shape.len() != r.strides.len() {
            return Err(serde::de::Error::custom(
                "shape and strides differ in length",
            ));
        }
        Ok(TensorType {
            dtype: r.dtype,
            shape: SmallVec::from_vec(r.shape),
            strides: SmallVec::from_vec(r.strides),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    #[test]
    fn tensor_type_roundtrips_through_json() {
        let mut t = TensorType::contiguous(
            DType::Bf16,
            smallvec![Dim::Fixed(768), Dim::sym("T")] as Shape,
        );
        t.shape.swap(0, 1);
        t.strides.swap(0, 1);
        let j = serde_json::to_string(&t).unwrap();
        assert_eq!(j, r#"{"dtype":"bf16","shape":["T",768],"strides":[1,"T"]}"#);
        let back: TensorType = serde_json::from_str(&j).unwrap();
        assert_eq!(back, t);
        let e: Extent = serde_json::from_str(r#""768*B*T""#).unwrap();
        assert_eq!(e.to_string(), "768*B*T");
        assert!(serde_json::from_str::<Extent>(r#""7x""#).is_err());
    }
}
