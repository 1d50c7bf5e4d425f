//! Choosing the tile of a Hopper GEMM from outside the heuristic.
//!
//! `wgmma.rs` picks a tile per GEMM from its shape ([`TileChoice`]: the tile width `bn` and the
//! CTAs per SM); a caller that measured better choices hands them in as [`TileOverrides`], keyed
//! by what the heuristic itself looks at ([`TileKey`]: dtype, dual or plain, constant K and N).
//! An override is checked with the same rules as the heuristic's own choices: an invalid one is a
//! [`crate::CodegenError::TileChoice`], never a silent fallback. [`tile_candidates`] lists the
//! valid choices of a plan kernel (the heuristic's first), so that a tuner never restates the
//! rules. With no overrides, code generation is exactly the heuristic's.
//!
//! Only GEMMs whose K and N are constants have a key, and of those the ones that take the TMA
//! kernel (sm_90a, f16 / bf16, K-major operands with constant row strides) and the f32 GEMMs
//! (plain or dual) with K-major operands on sm_90 / sm_90a, whose choices are the FP64 tensor-core
//! kernel (the heuristic's, [`TileChoice::on_fp64_tensor_cores`]) and the FFMA kernel on the same
//! tile (named by its tile, e.g. `128x128 x1 CTA`),
//! and the plain f32 block-sparse GEMMs with A k-contiguous and blocks the FP64 tensor-core
//! kernel takes (heights 8 to 32 in multiples of 8, widths in multiples of 4; [`TileKey::sparse`],
//! the same two choices); every other kernel is not tunable.

use mlpc_ir::{DType, Kernel, Op, Plan};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

use crate::{CodegenError, CodegenOptions, Ctx};

/// What a Hopper GEMM's tile choice depends on, besides the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TileKey {
    pub dtype: DType,
    /// A dual (gated) GEMM: two accumulators per tile.
    pub dual: bool,
    /// The reduction depth.
    pub k: u64,
    /// The output's column count.
    pub n: u64,
    /// A block-sparse GEMM (an f32 one: FFMA or FP64 tensor cores). Absent in caches written
    /// before it existed: `false`.
    #[serde(default, skip_serializing_if = "crate::is_false")]
    pub sparse: bool,
    /// A block-sparse GEMM's block shape (rows, columns of `B^T`'s blocks), `[0, 0]` for a dense
    /// one: its tiles depend on the block height, so two weights of one K and N but other blocks
    /// must not share a choice. Absent in caches written before it existed: `[0, 0]`, which no
    /// block-sparse key has (such entries are skipped).
    #[serde(default, skip_serializing_if = "is_dense_block")]
    pub block: [u32; 2],
}

fn is_dense_block(b: &[u32; 2]) -> bool {
    *b == [0, 0]
}

impl fmt::Display for TileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{} K={} N={}",
            self.dtype.name(),
            if self.dual { "dual" } else { "plain" },
            if self.sparse {
                format!(" block-sparse ({}x{} blocks)", self.block[0], self.block[1])
            } else {
                String::new()
            },
            self.k,
            self.n
        )
    }
}

/// A Hopper GEMM tile: `bm` rows (128, or 256 with two consumer warpgroups of 128 rows each) by
/// `bn` columns, `ctas` CTAs per SM (1 or 2), and with `pingpong` the schedule in which two
/// consumer warpgroups take whole tiles in turn (one's epilogue under the other's wgmmas). The
/// pipeline depth follows: as many stages (2 to 5) as the shared memory of one CTA's share
/// holds beside the epilogue's staging buffers, where it has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TileChoice {
    pub bn: u32,
    pub ctas: u32,
    /// Absent in caches written before the schedule existed: `false`.
    #[serde(default)]
    pub pingpong: bool,
    /// CTAs per cluster: 1, or 2 sharing the A tile's loads (TMA multicast). Absent in caches
    /// written before clusters existed: 1.
    #[serde(default = "crate::one", skip_serializing_if = "crate::is_one")]
    pub cluster: u32,
    /// With clusters of 2: the CTAs take neighbouring row tiles of one column tile and share the
    /// B tile's loads instead. Absent in caches written before it existed: `false`.
    #[serde(default, skip_serializing_if = "crate::is_false")]
    pub share_b: bool,
    /// Rows of the tile. Absent in caches written before 256-row tiles existed: 128.
    #[serde(default = "crate::rows_128", skip_serializing_if = "crate::is_128")]
    pub bm: u32,
    /// An f32 GEMM on the FP64 tensor cores (`gemm_dmma.cuh`) instead of the FFMA pipes. Absent
    /// in caches written before it existed: `false`.
    #[serde(default, skip_serializing_if = "crate::is_false")]
    pub fp64_tensor: bool,
}

impl TileChoice {
    /// A choice with the cooperative schedule (every consumer warpgroup on the same tile), no
    /// cluster.
    pub fn new(bn: u32, ctas: u32) -> TileChoice {
        TileChoice {
            bn,
            ctas,
            pingpong: false,
            cluster: 1,
            share_b: false,
            bm: 128,
            fp64_tensor: false,
        }
    }

    /// The same tile of an f32 GEMM on the FP64 tensor cores instead of the FFMA pipes.
    pub fn on_fp64_tensor_cores(self) -> TileChoice {
        TileChoice {
            fp64_tensor: true,
            ..self
        }
    }
}

impl fmt::Display for TileChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{} x{} CTA", self.bm, self.bn, self.ctas)?;
        if self.pingpong {
            write!(f, " ping-pong")?;
        }
        if self.cluster > 1 {
            write!(f, ", clusters of {}", self.cluster)?;
            if self.share_b {
                write!(f, " sharing B")?;
            }
        }
        if self.fp64_tensor {
            write!(f, ", FP64 tensor cores")?;
        }
        Ok(())
    }
}

/// Forced tile choices, by key. Serialised as a list of `{ "key": .., "choice": .. }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<TileOverride>", into = "Vec<TileOverride>")]
pub struct TileOverrides {
    map: BTreeMap<TileKey, TileChoice>,
}

/// One entry of [`TileOverrides`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileOverride {
    pub key: TileKey,
    pub choice: TileChoice,
}

impl From<Vec<TileOverride>> for TileOverrides {
    fn from(v: Vec<TileOverride>) -> TileOverrides {
        TileOverrides {
            map: v.into_iter().map(|o| (o.key, o.choice)).collect(),
        }
    }
}

impl From<TileOverrides> for Vec<TileOverride> {
    fn from(t: TileOverrides) -> Vec<TileOverride> {
        t.map
            .into_iter()
            .map(|(key, choice)| TileOverride { key, choice })
            .collect()
    }
}

impl TileOverrides {
    pub fn new() -> TileOverrides {
        TileOverrides::default()
    }

    /// Forces `choice` for every GEMM with `key`; returns the choice it replaces.
    pub fn insert(&mut self, key: TileKey, choice: TileChoice) -> Option<TileChoice> {
        self.map.insert(key, choice)
    }

    pub fn get(&self, key: &TileKey) -> Option<TileChoice> {
        self.map.get(key).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&TileKey, &TileChoice)> {
        self.map.iter()
    }
}

/// The tile choices of one tunable kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileCandidates {
    pub kernel: String,
    pub key: TileKey,
    /// Every valid choice, the heuristic's first.
    pub choices: Vec<TileChoice>,
}

/// The tile candidates of `kernel`, or `None` when it is not a tunable GEMM (see the module
/// docs). Errors are those code generation would report for the kernel.
pub fn tile_candidates(
    plan: &Plan,
    kernel: &Kernel,
    opts: &CodegenOptions,
) -> Result<Option<TileCandidates>, CodegenError> {
    let none = TileOverrides::default();
    let ctx = Ctx::new(plan, kernel, opts, &none)?;
    let found = match &kernel.op {
        Op::Gemm(g) => crate::gemm::tile_candidates(&ctx, g)?,
        Op::MatMul => crate::gemm::tile_candidates(&ctx, &crate::gemm::plain_matmul())?,
        Op::SparseGemm(s) => crate::bsr::tile_candidates(&ctx, s),
        Op::Input | Op::Weight | Op::Transpose | Op::Add | Op::Mul | Op::Act(_) => None,
    };
    Ok(found.map(|(key, choices)| TileCandidates {
        kernel: kernel.name.clone(),
        key,
        choices,
    }))
}

/// [`tile_candidates`] for every kernel of `plan`, in launch order.
pub fn plan_tile_candidates(
    plan: &Plan,
    opts: &CodegenOptions,
) -> Result<Vec<TileCandidates>, CodegenError> {
    let mut out = Vec::new();
    for k in &plan.kernels {
        out.extend(tile_candidates(plan, k, opts)?);
    }
    Ok(out)
}
