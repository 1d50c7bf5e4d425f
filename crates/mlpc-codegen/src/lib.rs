//! mlpc's CUDA code generator: every kernel of a [`Plan`] becomes a small CUDA C++ file that
//! instantiates the templates of `kernels-templates/` from a typed parameter struct.
//!
//! **Architecture invariant:** this crate is pure. A plan goes in, CUDA text and a launch
//! description come out, deterministically; it touches no file, no NVRTC and no driver. The
//! templates are compiled into the crate ([`headers`]) and handed to NVRTC as in-memory headers by
//! `mlpc-jit`.
//!
//! # Kernel families
//! - `gemm` / `dual_gemm` plan kernels (and unfused `matmul`): f16 and bf16 on tensor cores
//!   (`gemm_mma.cuh`, `mma.sync` m16n8k16, f32 accumulation); f32 on the FFMA pipes
//!   (`gemm_simt.cuh`, exact f32: `allow_tf32` permits but never forces TF32, and no TF32 path
//!   exists yet), except that f32 GEMMs with k-contiguous operands and constant K and N on sm_90 /
//!   sm_90a run on the FP64 tensor cores (`gemm_dmma.cuh`: exact products summed in f64, rounded
//!   to f32 once) unless a tile choice asks for the FFMA kernel ([`TileChoice::fp64_tensor`]).
//!   The epilogue chain (bias, activations, residual add, mul, and the dual form
//!   `epi(gate(A Bg) * up(A Bu))`) is a compile-time type applied in registers.
//!   When A and the weight are k-contiguous (`x W^T` with an nn.Linear weight), the module also
//!   holds weight-streaming entries for small M (`gemv.cuh`, see [`SmallM`]).
//!   For [`Arch::Sm90a`], f16 / bf16 GEMMs whose A and weight are both k-contiguous use
//!   `gemm_wgmma.cuh` instead of `gemm_mma.cuh` (warpgroup `wgmma.mma_async` from 128B-swizzled
//!   shared memory; see `wgmma.rs`); other layouts and every other target keep `gemm_mma.cuh`.
//!   Their tile is the heuristic's unless [`generate_tiled`] forces one per [`TileKey`]
//!   (validated by the same rules; [`tile_candidates`] lists the valid ones).
//! - `sparse_gemm` / `sparse_dual_gemm` (a weight packed to its kept blocks): `gemm_bsr.cuh`,
//!   tensor cores for f16 / bf16 and FFMA for f32 like the dense families, with the kept-block
//!   lists compiled into the source as constant arrays. One CTA per `BM` rows and per share of a
//!   block row of the weight; the grid is a [`Grid::Tiles`] with `tile_n = 1` over the number of
//!   such column tiles. For [`Arch::Sm90a`], f16 / bf16 with A stored `[M, K]` and a block height
//!   that is a wgmma N, `gemm_bsr_wgmma.cuh` instead: one CTA per 128 rows and per group of
//!   consecutive block rows (up to 256 output columns), wgmma from swizzled shared memory, the k
//!   loop over the union of the group's kept block columns (see `bsr.rs`); `tile_n = 1` over the
//!   number of groups.
//! - `add`, `mul`, activations and `transpose` (materialising a view): `elementwise.cuh`, over
//!   rank <= 4 operands with any strides and right-aligned broadcasting.
//!
//! # Kernel ABI
//! Everything a runtime needs to launch a kernel is in [`CudaKernel`] (serde-serialisable); it
//! never needs to know the templates.
//! - Arguments, in [`CudaKernel::params`] order: one device pointer per plan-kernel argument
//!   (`Kernel::args`, in operand order), then one for the output buffer (`Kernel::out`), each
//!   pointing at the buffer's first element; then one `long long` (i64) per symbolic dimension the
//!   kernel uses, in sorted order of the symbol names. Fixed dims are literals in the source.
//! - Launch: `block` threads, `smem_bytes` of dynamic shared memory, grid from [`Grid`] (see
//!   [`Launch::grid`]). A grid with a zero dimension means there is nothing to compute: skip the
//!   launch. When `smem_bytes` exceeds 48 KiB (the tensor-core GEMMs use up to 60 KiB, the
//!   sm_90a ones up to the 227 KiB limit) the runtime must first raise the function's
//!   `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to `smem_bytes`.
//! - Kernels are correct for any base alignment and any dims; aligned operands (16 bytes, row
//!   strides multiples of 16 bytes) take vectorised paths.
//! - Small-M variants ([`CudaKernel::small_m`], dense GEMMs, and block-sparse ones where
//!   [`CodegenOptions::sparse_gemv`] asks for them): further entries of the same
//!   module, taking the same arguments, each for outputs of at most [`SmallMVariant::max_m`] rows
//!   (`M`, the output's leading dims flattened: [`SmallM::m`]). Before each launch the runtime asks
//!   [`CudaKernel::choose_entry`], the one rule over all the entries below, which asks
//!   [`CudaKernel::small_m_variant`] for the bindings' `M` first: it names the first variant with
//!   `0 < M <= max_m`, whose entry and [`Launch`] then replace the kernel's own; with none, the
//!   kernel's entry runs. Every variant is correct for any `M` (larger ones take several passes
//!   over the weights), so the choice is one of speed only. JSON without `small_m` is a kernel
//!   without variants. A variant's own [`Launch`] holds its dynamic shared memory (the rule above
//!   applies to each entry) and its grid; a grid with `y > 1` belongs to an entry compiled with
//!   that many CTAs per cluster along y (`__cluster_dims__`), which ordinary launches honour.
//! - Short grids ([`CudaKernel::short_grids`], deep dense GEMMs on wide tiles and sm_90a
//!   block-sparse GEMMs, widest first): further entries of the same module on smaller tiles,
//!   taking the same arguments (the module's tensor maps include the ones their tiles read,
//!   which the other entries ignore), each with its own [`Launch`]. The runtime launches one
//!   instead of the kernel's entry when [`CudaKernel::short_grid_for`] names it (the kernel's own
//!   grid would split K, or its waves of wide tiles would take longer than a short grid's); its
//!   launch may in turn name its own split entry ([`Launch::alternate_entry`]). JSON without
//!   `short_grids` is a kernel without any; `short_grid`, one object, is read as a list of one.
//! - Relayouts ([`CudaKernel::relayouts`], sm_90a block-sparse kernels): a weight the kernel reads
//!   with its bytes permuted within fixed periods ([`Relayout`]). The runtime uploads the permuted
//!   copy once, when it loads the kernel, and passes its address (and describes it in tensor
//!   maps) wherever the kernel's arguments name that buffer; the plan's weight itself is
//!   unchanged. JSON without `relayouts` is a kernel that reads its weights as the plan has them.

mod bsr;
mod cpp;
mod elementwise;
mod error;
mod gemm;
mod gemv;
pub mod samples;
mod tile;
mod view;
mod wgmma;

pub use error::{CodegenError, LaunchError};
pub use tile::{
    plan_tile_candidates, tile_candidates, TileCandidates, TileChoice, TileKey, TileOverride,
    TileOverrides,
};

use mlpc_ir::{Bindings, BufferId, Extent, Kernel, Op, Plan};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Target GPU architecture, passed on to NVRTC (`--gpu-architecture`). With `Sm90a` some GEMMs
/// use wgmma, which exists on Hopper only; the other targets emit the same portable templates.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Arch {
    /// Ampere (A100).
    #[serde(rename = "sm_80")]
    Sm80,
    /// Hopper (H100, H200), portable PTX features only.
    #[default]
    #[serde(rename = "sm_90")]
    Sm90,
    /// Hopper with the arch-specific features (wgmma, setmaxnreg).
    #[serde(rename = "sm_90a")]
    Sm90a,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm80, Arch::Sm90, Arch::Sm90a];

    /// The NVRTC name, e.g. `sm_90`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// Parses `sm_80`, `sm_90`, `sm_90a` (also with a `cuda:` prefix, as in `--target cuda:sm_90`).
    pub fn parse(s: &str) -> Option<Arch> {
        let s = s.strip_prefix("cuda:").unwrap_or(s);
        Arch::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodegenOptions {
    pub arch: Arch,
    /// Permission (from the model) to compute f32 GEMMs in TF32. Not used yet: f32 stays exact.
    pub allow_tf32: bool,
    /// Give the f16 / bf16 block-sparse GEMMs (plain and dual) weight-streaming small-M entries
    /// (`gemv_bsr.cuh`: one CTA a block row, its kept blocks streamed once), which the runtime
    /// then launches for outputs of at most 64 rows. On by default: on the H200 they run the
    /// 4096^2 layer faster than the tiled kernel at every T <= 64 and density measured, 2.6-3.8x
    /// at T <= 16 (docs/perf-notes.md, "Block-sparse at small M").
    pub sparse_gemv: bool,
    /// Give the Hopper block-sparse GEMMs' persistent entries a work-item table the runtime
    /// computes for each grid ([`Param::Walk`], [`walk_table`]): each round of tiles handed to
    /// the CTAs least loaded so far by the groups' modelled costs, instead of the fixed snake.
    /// Off by default until it has been checked and timed on a GPU (docs/perf-notes.md,
    /// block-sparse variant 47); off, the generated sources are what they were without it.
    pub bsr_walk: bool,
}

impl Default for CodegenOptions {
    fn default() -> CodegenOptions {
        CodegenOptions {
            arch: Arch::default(),
            allow_tf32: false,
            sparse_gemv: true,
            bsr_walk: false,
        }
    }
}

/// One generated kernel: source, entry point and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaKernel {
    /// The plan kernel's name (unique in the plan); artifact files are named after it.
    pub name: String,
    /// The `extern "C"` symbol of the entry point, e.g. `mlpc_gemm_bias_gelu_tanh_bf16_nt_128x128x32`.
    pub entry: String,
    /// The `.cu` text; it includes the headers of [`headers`].
    pub source: String,
    pub launch: Launch,
    /// The entry's arguments, in order.
    pub params: Vec<Param>,
    /// Entries for small `M` in the same module (see the crate's ABI notes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_m: Option<SmallM>,
    /// Weights this kernel reads in a byte order of its own (see the crate's ABI notes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relayouts: Vec<Relayout>,
    /// A persistent GEMM's entries on smaller tiles, widest first, for grids that split K or
    /// fill the device poorly (see the crate's ABI notes).
    #[serde(
        default,
        alias = "short_grid",
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub short_grids: Vec<ShortGrid>,
    /// What one of the kernel's persistent tiles costs beyond its area, in output columns at
    /// its rows, for the choice among its own grid and its short grids
    /// ([`CudaKernel::short_grid_for`]): 0 where a tile costs its area (the dense GEMMs), more
    /// where each tile pays a fixed part whatever its width (the block-sparse tiles' A pieces).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tile_fixed_cols: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// `short_grids` as a list, or as the one object of `short_grid` in older descriptions.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ShortGrid>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Box<ShortGrid>),
        Many(Vec<ShortGrid>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![*s],
        OneOrMany::Many(v) => v,
    })
}

/// Which entry of a kernel a run launches ([`CudaKernel::choose_entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChosenEntry<'a> {
    /// The entry's symbol.
    pub entry: &'a str,
    /// Whose launch it runs on.
    pub from: EntryBase,
    pub launch: &'a Launch,
    pub grid: [u32; 3],
    /// The run's workspace this launch needs ([`Launch::workspace_bytes`]).
    pub workspace_bytes: u64,
}

/// The launch a chosen entry runs on: the kernel's own, a small-M variant's or a short grid's
/// (by index). The split-K and one-tile entries run on the launch of the main or short-grid
/// entry they stand in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryBase {
    Main,
    SmallM(usize),
    Short(usize),
}

/// The entry of a persistent GEMM on smaller tiles than its own, in the same module with the
/// same arguments, launched instead of the kernel's entry when that entry's grid would split K
/// or leave much of its last wave idle ([`CudaKernel::short_grid_for`]): smaller tiles then
/// fill the device with fewer splits (less of the split exchange) or none, or in fuller waves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShortGrid {
    pub entry: String,
    /// Its own launch: threads, shared memory and a persistent grid of its tiles (which may
    /// split K in turn, through its own split entry).
    pub launch: Launch,
}

/// A weight buffer a kernel reads rearranged: the runtime gives this kernel's arguments naming
/// `buffer` a copy of the weight in which chunk `i` of every period of `perm.len()` chunks of
/// `chunk_bytes` bytes is chunk `perm[i]` of the same period of the plan's weight. The weight's
/// size is a whole number of periods and `perm` is a permutation of `0 .. perm.len()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relayout {
    pub buffer: BufferId,
    pub chunk_bytes: u32,
    pub perm: Vec<u32>,
}

impl Relayout {
    /// The period in bytes.
    pub fn period_bytes(&self) -> usize {
        self.perm.len() * self.chunk_bytes as usize
    }

    /// `bytes` rearranged; `None` when they are not a whole number of periods or `perm` is not
    /// a permutation.
    pub fn apply(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let (chunk, period) = (self.chunk_bytes as usize, self.period_bytes());
        let mut seen = vec![false; self.perm.len()];
        for &p in &self.perm {
            let slot = seen.get_mut(p as usize)?;
            if std::mem::replace(slot, true) {
                return None;
            }
        }
        if chunk == 0 || period == 0 || !bytes.len().is_multiple_of(period) {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len());
        for src in bytes.chunks_exact(period) {
            for &p in &self.perm {
                let at = p as usize * chunk;
                out.extend_from_slice(&src[at..at + chunk]);
            }
        }
        Some(out)
    }
}

/// The small-M entries of a GEMM kernel: weight-streaming variants for few output rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallM {
    /// `M`: the number of rows of the output matrix (its leading dims flattened).
    pub m: Extent,
    /// In increasing `max_m`.
    pub variants: Vec<SmallMVariant>,
}

/// One small-M entry: same source and arguments as its kernel, its own symbol and launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmallMVariant {
    /// The largest `M` this entry is meant for.
    pub max_m: u64,
    pub entry: String,
    pub launch: Launch,
}

impl CudaKernel {
    /// Bytes of the integer tables compiled into the kernel's image (the block-sparse kernels'
    /// kept-block lists and schedules: `bsr.rs` and `gemv.rs` emit each as one `__device__ const
    /// int`, `__device__ const unsigned short` or `__constant__ int` array); 0 for the other
    /// kernels.
    pub fn table_bytes(&self) -> u64 {
        self.source
            .lines()
            .filter_map(|l| {
                let (rest, size) = [
                    ("__device__ const int ", 4),
                    ("__device__ const unsigned short ", 2),
                    ("__constant__ int ", 4),
                ]
                .into_iter()
                .find_map(|(prefix, size)| Some((l.strip_prefix(prefix)?, size)))?;
                let len = rest.split_once('[')?.1.split_once(']')?.0;
                Some(len.parse::<u64>().ok()? * size)
            })
            .sum::<u64>()
    }

    /// The kernel as one reviewable text: entry, launch rule and arguments as JSON, then the
    /// source. Snapshot tests store this.
    pub fn listing(&self) -> String {
        // Serialising these plain structs cannot fail.
        let launch = serde_json::to_string(&self.launch).unwrap_or_default();
        let params = serde_json::to_string(&self.params).unwrap_or_default();
        let small = self.small_m.as_ref().map_or_else(String::new, |s| {
            format!(
                "small_m: {}\n",
                serde_json::to_string(s).unwrap_or_default()
            )
        });
        let short: String = self
            .short_grids
            .iter()
            .map(|s| {
                format!(
                    "short_grid: {}\n",
                    serde_json::to_string(s).unwrap_or_default()
                )
            })
            .collect();
        let fixed = match self.tile_fixed_cols {
            0 => String::new(),
            n => format!("tile_fixed_cols: {n}\n"),
        };
        let relayouts: String = self
            .relayouts
            .iter()
            .map(|r| {
                format!(
                    "relayout: buffer {}, {}-byte chunks, period {:?}\n",
                    r.buffer, r.chunk_bytes, r.perm
                )
            })
            .collect();
        format!(
            "entry: {}\nlaunch: {launch}\nparams: {params}\n{small}{short}{fixed}{relayouts}\n{}",
            self.entry, self.source
        )
    }

    /// Every entry of the module beyond the kernel's own and its small-M variants: the
    /// alternates of its launch ([`Launch::alternate_entries`]), its short-grid entries and
    /// their alternates.
    pub fn other_entries(&self) -> Vec<&str> {
        let mut names = self.launch.alternate_entries();
        for s in &self.short_grids {
            names.push(&s.entry);
            names.extend(s.launch.alternate_entries());
        }
        names
    }

    /// The entry a run under `bindings` launches, on a device of `sms` multiprocessors that
    /// holds `resident_ctas` CTAs of the kernel's own launch at once where that is not `sms`
    /// (clusters: `cuOccupancyMaxActiveClusters` x the cluster size), with its launch and grid:
    /// a small-M variant where one fits `M` ([`CudaKernel::small_m_variant`]), else the
    /// short-grid entry [`CudaKernel::short_grid_for`] names, else the kernel's own;
    /// then, for the latter two, the alternate their launch names ([`Launch::alternate_entry`]).
    /// The one place the runtime's choice is made; the same answer on the host explains it.
    pub fn choose_entry(
        &self,
        bindings: &Bindings,
        sms: u32,
        resident_ctas: Option<u32>,
    ) -> Result<ChosenEntry<'_>, LaunchError> {
        let small = self.small_m_variant(bindings)?.and_then(|i| {
            let v = self.small_m.as_ref()?.variants.get(i)?;
            Some((EntryBase::SmallM(i), v.entry.as_str(), &v.launch))
        });
        let short = match small {
            Some(_) => None,
            None => self
                .short_grid_for(bindings, sms)?
                .and_then(|i| Some((EntryBase::Short(i), self.short_grids.get(i)?))),
        };
        let (from, entry, launch) = match (small, short) {
            (Some(small), _) => small,
            (None, Some((from, s))) => (from, s.entry.as_str(), &s.launch),
            (None, None) => (EntryBase::Main, self.entry.as_str(), &self.launch),
        };
        let slots = match from {
            EntryBase::Main => resident_ctas.unwrap_or(sms),
            _ => sms,
        };
        let entry = match from {
            EntryBase::SmallM(_) => entry,
            _ => launch.alternate_entry(bindings, slots)?.unwrap_or(entry),
        };
        Ok(ChosenEntry {
            entry,
            from,
            launch,
            grid: launch.grid(bindings, slots)?,
            workspace_bytes: launch.workspace_bytes(bindings, slots)?,
        })
    }

    /// The [`CudaKernel::short_grids`] entry (by index) a run under `bindings` on `sms`
    /// multiprocessors launches, or `None` for the kernel's own: the first where the kernel's
    /// own launch would split K; else, of the short grids whose tiles finish at least a tenth
    /// sooner than the kernel's own by the outputs the busiest block computes (its waves of
    /// tiles times the tile's area, the tile's columns counted with
    /// [`CudaKernel::tile_fixed_cols`]: gpt2's down projection at T = 5000 runs 160 tiles of
    /// 128 x 192 on 132 blocks, two waves, against 240 tiles of 128 x 128, two waves too), the
    /// one whose busiest block computes fewest, the widest of those that tie. Ties with the
    /// kernel's own keep its wider tiles. (The 4096^2 block-sparse weight at T = 512, 128
    /// fixed columns: 48 tiles of 128 x 352 in one wave, 128 of 128 x 128 in one, 256 of 128 x
    /// 64 in two: the 128-column tiles, 256 columns a wave against 480 and 2 x 192.)
    pub fn short_grid_for(
        &self,
        bindings: &Bindings,
        sms: u32,
    ) -> Result<Option<usize>, LaunchError> {
        if self.short_grids.is_empty() {
            return Ok(None);
        }
        let own = self.launch.shape(bindings, sms)?;
        if own.splits > 1 {
            return Ok(Some(0));
        }
        // The outputs the busiest block computes: its waves of tiles times the tile's area (with
        // the tile's fixed cost as further columns).
        let fixed = u128::from(self.tile_fixed_cols);
        let span = |launch: &Launch, shape: Shape| match (&launch.grid, shape.tiles) {
            (Grid::Persistent { tile_m, tile_n, .. }, Some(tiles)) if shape.grid[0] > 0 => Some(
                u128::from(tiles.div_ceil(u64::from(shape.grid[0])))
                    * u128::from(*tile_m)
                    * (u128::from(*tile_n) + fixed),
            ),
            _ => None,
        };
        let Some(own) = span(&self.launch, own) else {
            return Ok(None);
        };
        let mut best: Option<(usize, u128)> = None;
        for (i, s) in self.short_grids.iter().enumerate() {
            let Some(area) = span(&s.launch, s.launch.shape(bindings, sms)?) else {
                continue;
            };
            if area * 10 <= own * 9 && best.is_none_or(|(_, b)| area < b) {
                best = Some((i, area));
            }
        }
        Ok(best.map(|(i, _)| i))
    }

    /// The small-M variant to launch for `bindings`: the index in `small_m.variants` of the first
    /// with `0 < M <= max_m`, or `None` to launch the kernel's own entry (no variants, `M` zero
    /// or above them all).
    pub fn small_m_variant(&self, bindings: &Bindings) -> Result<Option<usize>, LaunchError> {
        let Some(small) = &self.small_m else {
            return Ok(None);
        };
        if let Some(s) = small.m.syms.iter().find(|s| bindings.get(s).is_none()) {
            return Err(LaunchError::Unbound {
                symbol: s.to_string(),
            });
        }
        // Bound symbols whose product overflows: far above any variant.
        let m = small.m.resolve(bindings).unwrap_or(u64::MAX);
        Ok((m > 0)
            .then(|| small.variants.iter().position(|v| m <= v.max_m))
            .flatten())
    }
}

/// One argument of a kernel entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Param {
    /// A device pointer to the first element of a plan buffer.
    Buffer { buffer: BufferId },
    /// The run-time value of a symbolic dimension, as a signed 64-bit integer (`long long`).
    Dim { symbol: String },
    /// A CUDA tensor map (`CUtensorMap`: 128 bytes, 128-byte aligned, passed by value as a
    /// `const __grid_constant__` parameter) over `buffer` (whose element type is the buffer's
    /// dtype) read as a 2-D matrix of `rows` x `cols` elements, columns contiguous, `row_stride`
    /// elements from one row to the next; the copy engine reads boxes of `box_rows` x `box_cols`
    /// elements into shared memory with the swizzle whose span is one box row (`box_cols` elements
    /// of 32, 64 or 128 bytes: the 32B, 64B or 128B mode) and fills elements outside the matrix
    /// with zeros. The runtime encodes it (`cuTensorMapEncodeTiled`) for each launch from the
    /// buffer's address and the bound symbols; it needs a 16-byte aligned address and a row
    /// stride of a multiple of 16 bytes.
    TensorMap {
        buffer: BufferId,
        rows: Extent,
        cols: Extent,
        row_stride: Extent,
        box_rows: u32,
        box_cols: u32,
    },
    /// A device pointer to the run's workspace: [`Launch::workspace_bytes`] bytes, zero when
    /// first allocated, shared by the kernels of a run (they run one after the other), each of
    /// which leaves it fit for the next (a split-K GEMM's counters back at zero).
    Workspace,
    /// A persistent walk's work-item table ([`WALK_ARG_BYTES`] bytes, `mlpc::BsrWalk` in
    /// `gemm_bsr_wgmma.cuh`, passed by value as a `const __grid_constant__` parameter): the
    /// runtime fills it for the launch it chooses from that launch's [`Launch::walk_costs`]
    /// ([`walk_table`]), or with zero rounds (the kernel's own snake) where the launch has no
    /// costs or its grid more items than the table holds.
    Walk,
}

/// Items a [`Param::Walk`] table holds: `rounds x grid` at most (nine rounds of 132 CTAs).
pub const WALK_CAP: usize = 1188;
// Every item index of a table fits below the "none" mark, 0xffff.
const _: () = assert!(WALK_CAP < 0xffff);

/// Bytes of a [`Param::Walk`] argument: a 32-bit round count, then [`WALK_CAP`] 16-bit items.
pub const WALK_ARG_BYTES: usize = 4 + 2 * WALK_CAP;

/// The [`Param::Walk`] argument of a persistent grid of `ctas` CTAs over `row_tiles` row tiles
/// of `costs.len()` groups, item `w` being row tile `w / groups` and the group at position `w %
/// groups` of the kernel's `grp_order`, which costs `costs[w % groups]`. The items come in
/// rounds of `ctas` as the kernel's snake takes them (round `r`: items `r ctas ..`), so that the
/// CTAs running at once share their row tiles' A pieces in L2 as before; each round's items,
/// costliest first, go to the CTAs least loaded by the rounds before (ties to the lower CTA).
/// Entry `r ctas + b` is CTA `b`'s item of round `r`, `0xffff` for none (only in the last
/// round, whose items are fewer than the CTAs). `None` when the table would exceed
/// [`WALK_CAP`] items: the kernel then walks its snake.
pub fn walk_table(costs: &[u32], row_tiles: u32, ctas: u32) -> Option<Vec<u16>> {
    let items = u64::from(row_tiles) * costs.len() as u64;
    let ctas = u64::from(ctas);
    if items == 0 || ctas == 0 {
        return None;
    }
    let rounds = items.div_ceil(ctas);
    if rounds * ctas > WALK_CAP as u64 {
        return None;
    }
    let (items, ctas) = (items as usize, ctas as usize);
    let cost = |w: usize| u64::from(costs[w % costs.len()]);
    let mut table = vec![0xffffu16; rounds as usize * ctas];
    let mut load = vec![0u64; ctas];
    let mut by_load: Vec<usize> = (0..ctas).collect();
    for (r, first) in (0..items).step_by(ctas).enumerate() {
        let mut round: Vec<usize> = (first..items.min(first + ctas)).collect();
        round.sort_by_key(|&w| (std::cmp::Reverse(cost(w)), w));
        by_load.sort_by_key(|&b| (load[b], b));
        for (&w, &b) in round.iter().zip(&by_load) {
            table[r * ctas + b] = w as u16;
            load[b] += cost(w);
        }
    }
    Some(table)
}

/// The bytes of a [`Param::Walk`] argument holding `table` ([`walk_table`]) for a grid of `ctas`
/// CTAs, or zero rounds for `None`.
pub fn walk_arg_bytes(table: Option<&[u16]>, ctas: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; WALK_ARG_BYTES];
    if let Some(t) = table.filter(|t| t.len() <= WALK_CAP && ctas > 0) {
        let rounds = (t.len() / ctas as usize) as u32;
        bytes[..4].copy_from_slice(&rounds.to_le_bytes());
        for (i, v) in t.iter().enumerate() {
            bytes[4 + 2 * i..6 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// How to launch a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// Threads per block.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub smem_bytes: u32,
    pub grid: Grid,
    /// The entry waits for the kernels before it in the stream itself (`griddepcontrol.wait`,
    /// `wait_for_predecessors()` in `common.cuh`) before it reads anything but constant weights
    /// or writes anything, so the runtime may launch it while the kernel before still runs
    /// (programmatic dependent launch, sm_90 and later): its first weight loads and its launch
    /// overlap the tail of the kernel before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub early_launch: bool,
    /// A persistent block-sparse entry's modelled cycles a work item, by the item's position in
    /// its row tile (the kernel's `grp_order`): what [`walk_table`] assigns the items by, for
    /// the kernel's [`Param::Walk`] argument. Empty where the entry takes no such argument.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub walk_costs: Vec<u32>,
}

/// How the grid follows from the problem size, which may depend on symbols.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Grid {
    /// One block per `tile_m x tile_n` tile of an `[m, n]` output:
    /// `[ceil(m / tile_m), ceil(n / tile_n), 1]`.
    Tiles {
        m: Extent,
        n: Extent,
        tile_m: u32,
        tile_n: u32,
    },
    /// One block per `tile_m x tile_n` tile of an `[m, n]` output, a row tile's column tiles
    /// consecutive in launch order (the blocks resident at once then share their rows of the
    /// input): `[ceil(n / tile_n), r, ceil(R / r)]`, with `R = ceil(m / tile_m)` row tiles and
    /// `r = min(R, 65535)`. A block's row tile is `blockIdx.y + blockIdx.z * gridDim.y`; blocks
    /// of the last `z` layer past `R` have no tile.
    RowTiles {
        m: Extent,
        n: Extent,
        tile_m: u32,
        tile_n: u32,
    },
    /// One block per `per_block` consecutive elements: `[ceil(numel / per_block), 1, 1]`.
    Elements { numel: Extent, per_block: u32 },
    /// A persistent kernel over the `tile_m x tile_n` tiles of an `[m, n]` output: `per_sm`
    /// blocks per multiprocessor, at most one per tile: `[min(tiles, per_sm x SMs), 1, 1]`. Each
    /// block loops over tiles itself. With `cluster` > 1 (compiled into the entry) a cluster
    /// takes `cluster` neighbouring column tiles at a time: `[cluster x min(ceil(m / tile_m) x
    /// ceil(tiles_n / cluster), per_sm x SMs / cluster), 1, 1]`; with `cluster_rows`,
    /// neighbouring row tiles (`ceil(tiles_m / cluster) x ceil(n / tile_n)` cluster tiles).
    Persistent {
        m: Extent,
        n: Extent,
        tile_m: u32,
        tile_n: u32,
        per_sm: u32,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        cluster: u32,
        #[serde(default, skip_serializing_if = "is_false")]
        cluster_rows: bool,
        /// The module has a second entry ([`SplitK::entry`]) that splits each tile's k slices
        /// over several CTAs (no clusters): when the tiles would fill at most half of the
        /// blocks the device holds, the grid is `tiles x splits` blocks ([`SplitK::splits`]),
        /// each taking one split, the runtime launches that entry instead
        /// ([`Launch::alternate_entry`]) and it needs [`Launch::workspace_bytes`] of workspace
        /// (`Param::Workspace`, an argument of every entry of the module).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        split_k: Option<SplitK>,
        /// A ping-pong GEMM's entry on the cooperative schedule with the same tile, launch and
        /// arguments, run instead when the grid gives every block at most one tile (the tiles
        /// fit the blocks the device holds, and the grid does not split K): both consumer
        /// warpgroups then work on the tile, where one of the ping-pong pair would have none
        /// ([`Launch::alternate_entry`] names it then).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        one_tile: Option<String>,
    },
}

/// Split K of a persistent GEMM (`WgmmaTmaConfig::kSplitK` in `gemm_wgmma.cuh`): the work item
/// of a CTA is one of `splits` consecutive ranges of a tile's k slices; its partial tile (f32)
/// goes to the workspace, and the CTA that completes a tile's count sums every partial in split
/// order and runs the epilogue. The kernel finds `splits` as `gridDim.x / tiles` when the grid
/// has at least two blocks per tile, so the rule lives here, on the host, once. It is compiled
/// into an entry of its own: the kernel without it keeps its code for the grids that do not
/// split (with it compiled in, the same GEMMs at T = 8192 measured 0.5-5 % slower).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitK {
    /// The k slices (64 deep) of one tile.
    pub k_slices: u32,
    /// Bytes of one work item's partial tile.
    pub partial_bytes: u32,
    /// The entry with split K (same module, same arguments and launch but the grid).
    pub entry: String,
}

impl SplitK {
    /// The most splits of a tile: the CTA that sums them reads every partial tile, so its share
    /// grows with the count.
    pub const MAX_SPLITS: u64 = 4;
    /// The fewest k slices a split takes.
    pub const MIN_SLICES: u64 = 4;
    /// The fewest k slices of a tile for split K to be compiled in (two splits of
    /// [`SplitK::MIN_SLICES`] would do, but shallower GEMMs lose less to a short grid).
    pub const MIN_K_SLICES: u32 = 16;
    /// Bytes of the workspace before the partial tiles: the kernel's counters
    /// (`wgmma_detail::kSplitCounters`, 4096 of 4 bytes), which bound the work items.
    pub const COUNTER_BYTES: u64 = 4 * 4096;

    /// The splits of each of `tiles` tiles when the device holds `slots` blocks at once: 1 unless
    /// the tiles fill at most half of the slots; then as many as fit the slots, at most
    /// [`SplitK::MAX_SPLITS`], each of at least [`SplitK::MIN_SLICES`] slices.
    pub fn splits(&self, tiles: u64, slots: u64) -> u64 {
        if tiles == 0 || tiles.saturating_mul(2) > slots {
            return 1;
        }
        let s = (slots / tiles)
            .min(u64::from(self.k_slices) / Self::MIN_SLICES)
            .min(Self::MAX_SPLITS)
            .min(Self::COUNTER_BYTES / 4 / tiles);
        s.max(1)
    }
}

/// The default of optional counts in serialised plans and tile choices (absent: 1).
pub(crate) fn one() -> u32 {
    1
}

pub(crate) fn is_one(v: &u32) -> bool {
    *v == 1
}

pub(crate) fn rows_128() -> u32 {
    128
}

pub(crate) fn is_128(v: &u32) -> bool {
    *v == 128
}

pub(crate) fn is_false(v: &bool) -> bool {
    !*v
}

impl Launch {
    /// The grid for the symbol values in `bindings` on a device with `sms` multiprocessors (for a
    /// persistent grid of clusters, the runtime passes the CTAs of the clusters the device holds
    /// at once instead). A zero dimension means an empty problem: the launch must be skipped.
    pub fn grid(&self, bindings: &Bindings, sms: u32) -> Result<[u32; 3], LaunchError> {
        Ok(self.shape(bindings, sms)?.grid)
    }

    /// The [`Param::Walk`] argument of this launch under `bindings` on a grid of `ctas` CTAs
    /// ([`Launch::grid`]'s first axis): the [`walk_table`] of its [`Launch::walk_costs`] over
    /// its row tiles, or zero rounds (the kernel's snake) where it has no costs, its grid is not
    /// persistent or the table would not fit.
    pub fn walk_arg(&self, bindings: &Bindings, ctas: u32) -> Vec<u8> {
        let table = match &self.grid {
            Grid::Persistent { m, tile_m, .. } if !self.walk_costs.is_empty() => m
                .resolve(bindings)
                .and_then(|rows| u32::try_from(rows.div_ceil(u64::from((*tile_m).max(1)))).ok())
                .and_then(|row_tiles| walk_table(&self.walk_costs, row_tiles, ctas)),
            _ => None,
        };
        walk_arg_bytes(table.as_deref(), ctas)
    }

    /// The entries [`Launch::alternate_entry`] may name: a persistent grid's split and one-tile
    /// entries.
    pub fn alternate_entries(&self) -> Vec<&str> {
        match &self.grid {
            Grid::Persistent {
                split_k, one_tile, ..
            } => split_k
                .iter()
                .map(|s| s.entry.as_str())
                .chain(one_tile.as_deref())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The entry that runs the launch under `bindings` on `sms` multiprocessors instead of the
    /// kernel's own: a split-K GEMM's split entry when the grid splits its tiles, else a
    /// ping-pong GEMM's one-tile entry when every block has at most one tile.
    pub fn alternate_entry(
        &self,
        bindings: &Bindings,
        sms: u32,
    ) -> Result<Option<&str>, LaunchError> {
        let shape = self.shape(bindings, sms)?;
        Ok(match (&self.grid, shape.tiles) {
            (
                Grid::Persistent {
                    split_k: Some(s), ..
                },
                _,
            ) if shape.splits > 1 => Some(&s.entry),
            // Every block has at most one tile when the grid is not smaller than the tiles.
            (
                Grid::Persistent {
                    one_tile: Some(e), ..
                },
                Some(tiles),
            ) => (tiles > 0 && u64::from(shape.grid[0]) >= tiles).then_some(e.as_str()),
            _ => None,
        })
    }

    /// The workspace the launch under `bindings` on `sms` multiprocessors needs
    /// (`Param::Workspace`): when a split-K GEMM's grid splits its tiles, the kernel's counters
    /// and one partial tile per block; else nothing.
    pub fn workspace_bytes(&self, bindings: &Bindings, sms: u32) -> Result<u64, LaunchError> {
        let Shape { grid, splits, .. } = self.shape(bindings, sms)?;
        Ok(match &self.grid {
            Grid::Persistent {
                split_k: Some(s), ..
            } if splits > 1 => {
                SplitK::COUNTER_BYTES + u64::from(grid[0]) * u64::from(s.partial_bytes)
            }
            _ => 0,
        })
    }

    /// The grid, the splits of each tile and, for a persistent grid, its tiles.
    fn shape(&self, bindings: &Bindings, sms: u32) -> Result<Shape, LaunchError> {
        let resolve = |e: &Extent| {
            e.syms
                .iter()
                .find(|s| bindings.get(s).is_none())
                .map(|s| LaunchError::Unbound {
                    symbol: s.to_string(),
                })
                .map_or_else(|| Ok(e.resolve(bindings).unwrap_or(u64::MAX)), Err)
        };
        let blocks = |axis: usize, n: u64, per: u32, limit: u64| {
            let b = n.div_ceil(u64::from(per.max(1)));
            if b > limit {
                Err(LaunchError::GridTooLarge {
                    axis,
                    blocks: b,
                    limit,
                })
            } else {
                Ok(b as u32)
            }
        };
        match &self.grid {
            Grid::Tiles {
                m,
                n,
                tile_m,
                tile_n,
            } => Ok(Shape::plain([
                blocks(0, resolve(m)?, *tile_m, (1 << 31) - 1)?,
                blocks(1, resolve(n)?, *tile_n, 65535)?,
                1,
            ])),
            Grid::RowTiles {
                m,
                n,
                tile_m,
                tile_n,
            } => {
                let rows = resolve(m)?.div_ceil(u64::from((*tile_m).max(1)));
                let layer = rows.min(65535);
                Ok(Shape::plain([
                    blocks(0, resolve(n)?, *tile_n, (1 << 31) - 1)?,
                    layer as u32,
                    blocks(2, rows, layer.max(1) as u32, 65535)?,
                ]))
            }
            Grid::Elements { numel, per_block } => Ok(Shape::plain([
                blocks(0, resolve(numel)?, *per_block, (1 << 31) - 1)?,
                1,
                1,
            ])),
            Grid::Persistent {
                m,
                n,
                tile_m,
                tile_n,
                per_sm,
                cluster,
                cluster_rows,
                split_k,
                one_tile: _,
            } => {
                let c = u64::from((*cluster).max(1));
                let tiles_n = resolve(n)?.div_ceil(u64::from((*tile_n).max(1)));
                let tiles_m = resolve(m)?.div_ceil(u64::from((*tile_m).max(1)));
                let tiles = if *cluster_rows {
                    tiles_m.div_ceil(c).saturating_mul(tiles_n)
                } else {
                    tiles_m.saturating_mul(tiles_n.div_ceil(c))
                };
                let most = (u64::from(sms.max(1)) * u64::from((*per_sm).max(1)) / c).max(1);
                let splits = match split_k {
                    Some(s) if c == 1 => s.splits(tiles, most),
                    _ => 1,
                };
                // At most `most` blocks: the splits fit the slots.
                let blocks = if splits > 1 {
                    tiles * splits
                } else {
                    tiles.min(most) * c
                };
                Ok(Shape {
                    grid: [blocks as u32, 1, 1],
                    splits,
                    tiles: Some(tiles),
                })
            }
        }
    }
}

/// A launch resolved under bindings ([`Launch::shape`]).
#[derive(Clone, Copy, Debug)]
struct Shape {
    grid: [u32; 3],
    /// The splits of each tile: 1 but for a split-K GEMM's split grid.
    splits: u64,
    /// A persistent grid's tiles (cluster tiles where the grid runs clusters).
    tiles: Option<u64>,
}

impl Shape {
    fn plain(grid: [u32; 3]) -> Shape {
        Shape {
            grid,
            splits: 1,
            tiles: None,
        }
    }
}

/// The kernel templates as `(include name, text)` pairs, for NVRTC's in-memory headers.
pub fn headers() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "common.cuh",
            include_str!("../../../kernels-templates/common.cuh"),
        ),
        (
            "gemm_mma.cuh",
            include_str!("../../../kernels-templates/gemm_mma.cuh"),
        ),
        (
            "gemm_wgmma.cuh",
            include_str!("../../../kernels-templates/gemm_wgmma.cuh"),
        ),
        (
            "gemm_simt.cuh",
            include_str!("../../../kernels-templates/gemm_simt.cuh"),
        ),
        (
            "gemm_dmma.cuh",
            include_str!("../../../kernels-templates/gemm_dmma.cuh"),
        ),
        (
            "gemv_bsr.cuh",
            include_str!("../../../kernels-templates/gemv_bsr.cuh"),
        ),
        (
            "gemm_bsr.cuh",
            include_str!("../../../kernels-templates/gemm_bsr.cuh"),
        ),
        (
            "gemm_bsr_wgmma.cuh",
            include_str!("../../../kernels-templates/gemm_bsr_wgmma.cuh"),
        ),
        (
            "elementwise.cuh",
            include_str!("../../../kernels-templates/elementwise.cuh"),
        ),
        (
            "gemv.cuh",
            include_str!("../../../kernels-templates/gemv.cuh"),
        ),
    ]
}

/// Generates every kernel of `plan`, in launch order, with the heuristic's Hopper tiles.
pub fn generate(plan: &Plan, opts: &CodegenOptions) -> Result<Vec<CudaKernel>, CodegenError> {
    generate_tiled(plan, opts, &TileOverrides::default())
}

/// [`generate`], with the Hopper GEMM tiles `tiles` forces (see [`TileOverrides`]): a GEMM whose
/// [`TileKey`] has an entry takes that tile, or fails with [`CodegenError::TileChoice`] when it
/// is not valid for it; every other kernel is generated as by [`generate`].
pub fn generate_tiled(
    plan: &Plan,
    opts: &CodegenOptions,
    tiles: &TileOverrides,
) -> Result<Vec<CudaKernel>, CodegenError> {
    plan.kernels
        .iter()
        .map(|k| generate_kernel_tiled(plan, k, opts, tiles))
        .collect()
}

/// Generates one kernel of `plan`.
pub fn generate_kernel(
    plan: &Plan,
    kernel: &Kernel,
    opts: &CodegenOptions,
) -> Result<CudaKernel, CodegenError> {
    generate_kernel_tiled(plan, kernel, opts, &TileOverrides::default())
}

/// Generates one kernel of `plan` with forced Hopper tiles (see [`generate_tiled`]).
pub fn generate_kernel_tiled(
    plan: &Plan,
    kernel: &Kernel,
    opts: &CodegenOptions,
    tiles: &TileOverrides,
) -> Result<CudaKernel, CodegenError> {
    let ctx = Ctx::new(plan, kernel, opts, tiles)?;
    match &kernel.op {
        Op::Gemm(g) => gemm::generate(&ctx, g),
        Op::MatMul => gemm::generate(&ctx, &gemm::plain_matmul()),
        Op::SparseGemm(s) => bsr::generate(&ctx, s),
        Op::Add | Op::Mul | Op::Act(_) | Op::Transpose => elementwise::generate(&ctx),
        Op::Input | Op::Weight => Err(CodegenError::UnsupportedOp {
            kernel: kernel.name.clone(),
            op: kernel.op.mnemonic().to_string(),
        }),
    }
}

/// What every kernel generator needs: the plan kernel and its buffers, resolved and checked.
pub(crate) struct Ctx<'a> {
    pub kernel: &'a Kernel,
    pub opts: &'a CodegenOptions,
    /// Forced Hopper GEMM tiles (empty: the heuristic's).
    pub tiles: &'a TileOverrides,
    pub args: Vec<&'a mlpc_ir::Buffer>,
    pub out: &'a mlpc_ir::Buffer,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        plan: &'a Plan,
        kernel: &'a Kernel,
        opts: &'a CodegenOptions,
        tiles: &'a TileOverrides,
    ) -> Result<Ctx<'a>, CodegenError> {
        let get = |id: BufferId| {
            plan.buffers
                .get(id)
                .ok_or_else(|| CodegenError::NoSuchBuffer {
                    kernel: kernel.name.clone(),
                    buffer: id,
                })
        };
        let args = kernel
            .args
            .iter()
            .map(|&id| get(id))
            .collect::<Result<Vec<_>, _>>()?;
        let out = get(kernel.out)?;
        let expected = kernel.op.arity();
        if args.len() != expected {
            return Err(CodegenError::Arity {
                kernel: kernel.name.clone(),
                op: kernel.op.mnemonic().to_string(),
                expected,
                actual: args.len(),
            });
        }
        let dtype = out.ty.dtype;
        if let Some(b) = args.iter().find(|b| b.ty.dtype != dtype) {
            return Err(CodegenError::DType {
                kernel: kernel.name.clone(),
                buffer: b.name.clone(),
                expected: dtype,
                actual: b.ty.dtype,
            });
        }
        Ok(Ctx {
            kernel,
            opts,
            tiles,
            args,
            out,
        })
    }

    pub fn name(&self) -> String {
        self.kernel.name.clone()
    }

    /// The params for the buffers: args in order, then the output.
    pub fn buffer_params(&self) -> Vec<Param> {
        self.kernel
            .args
            .iter()
            .chain(std::iter::once(&self.kernel.out))
            .map(|&buffer| Param::Buffer { buffer })
            .collect()
    }

    /// The header comment common to every generated file.
    pub fn header(&self, summary: &str, arg_names: &[String]) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "// mlpc kernel `{}` ({}), target {}.\n",
            self.kernel.name,
            self.kernel.op.mnemonic(),
            self.opts.arch
        ));
        if !self.kernel.covers.is_empty() {
            s.push_str(&format!("// Covers: {}.\n", self.kernel.covers.join(", ")));
        }
        s.push_str(&format!("// {summary}\n"));
        let width = arg_names.iter().map(|n| n.len()).max().unwrap_or(0);
        for (name, b) in arg_names.iter().zip(&self.args) {
            s.push_str(&format!("//   {name:width$} <- `{}` {}\n", b.name, b.ty));
        }
        if let Some(name) = arg_names.get(self.args.len()) {
            s.push_str(&format!(
                "//   {name:width$} -> `{}` {}\n",
                self.out.name, self.out.ty
            ));
        }
        s.push_str("// Generated by mlpc-codegen from kernels-templates/; do not edit.\n");
        s
    }
}

/// The C++ signature lines of an entry: buffer pointers (the output last, non-const), then one
/// `long long` per symbol, then one `const __grid_constant__ mlpc::TensorMap` per name of `maps`
/// (the order of `Param::TensorMap` arguments).
pub(crate) fn signature(
    elem: &str,
    arg_names: &[String],
    n_inputs: usize,
    symbols: &[String],
    maps: &[&str],
) -> String {
    let mut lines: Vec<String> = Vec::new();
    for (i, name) in arg_names.iter().enumerate() {
        if i < n_inputs {
            lines.push(format!("    const {elem}* __restrict__ {name}"));
        } else {
            lines.push(format!("    {elem}* __restrict__ {name}"));
        }
    }
    for s in symbols {
        lines.push(format!("    long long {}", cpp::sym_arg(s)));
    }
    for name in maps {
        lines.push(format!(
            "    const __grid_constant__ mlpc::TensorMap {name}"
        ));
    }
    lines.join(",\n")
}

/// Params for symbol arguments, in the order of [`signature`].
pub(crate) fn dim_params(symbols: &[String]) -> impl Iterator<Item = Param> + '_ {
    symbols.iter().map(|s| Param::Dim { symbol: s.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::Dim;

    #[test]
    fn grids_follow_the_bindings() {
        let launch = Launch {
            block: [256, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::Tiles {
                m: Extent::of_dim(&Dim::sym("T")),
                n: Extent::constant(3072),
                tile_m: 128,
                tile_n: 128,
            },
        };
        let mut b = Bindings::new();
        assert_eq!(
            launch.grid(&b, 132),
            Err(LaunchError::Unbound {
                symbol: "T".to_string()
            })
        );
        b.bind(&"T".into(), 129).unwrap();
        assert_eq!(launch.grid(&b, 132), Ok([2, 24, 1]));
        let mut z = Bindings::new();
        z.bind(&"T".into(), 0).unwrap();
        assert_eq!(launch.grid(&z, 132), Ok([0, 24, 1]));
    }

    #[test]
    fn row_tile_grids_put_column_tiles_first_and_spill_rows_into_z() {
        let launch = Launch {
            block: [128, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::RowTiles {
                m: Extent::of_dim(&Dim::sym("T")),
                n: Extent::constant(4096),
                tile_m: 64,
                tile_n: 32,
            },
        };
        let grid = |t: u64| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            launch.grid(&b, 132)
        };
        assert_eq!(grid(129), Ok([128, 3, 1]));
        assert_eq!(grid(0), Ok([128, 0, 0]));
        // 65535 row tiles fit one layer; one more takes a second, mostly without tiles.
        assert_eq!(grid(64 * 65535), Ok([128, 65535, 1]));
        assert_eq!(grid(64 * 65535 + 1), Ok([128, 65535, 2]));
        assert_eq!(
            grid(64 * 65535 * 65535 + 1),
            Err(LaunchError::GridTooLarge {
                axis: 2,
                blocks: 65536,
                limit: 65535
            })
        );
    }

    /// A persistent launch over `[T, 768]` in 128 x 192 tiles, without clusters.
    fn persistent_768(per_sm: u32, split_k: Option<SplitK>) -> Launch {
        persistent(768, 192, per_sm, split_k)
    }

    /// A persistent launch over `T` x `n` outputs in tiles of 128 x `tile_n`.
    fn persistent(n: u64, tile_n: u32, per_sm: u32, split_k: Option<SplitK>) -> Launch {
        Launch {
            block: [384, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk_costs: Vec::new(),
            grid: Grid::Persistent {
                m: Extent::of_dim(&Dim::sym("T")),
                n: Extent::constant(n),
                tile_m: 128,
                tile_n,
                per_sm,
                cluster: 1,
                cluster_rows: false,
                split_k,
                one_tile: None,
            },
        }
    }

    /// A kernel of N = 4096 on 128 x `own` tiles with short grids of the given widths.
    fn kernel_with_shorts(own: u32, shorts: &[u32], tile_fixed_cols: u32) -> CudaKernel {
        let launch = |tile_n: u32| persistent(4096, tile_n, 1, None);
        CudaKernel {
            name: "k".into(),
            entry: "k".into(),
            source: String::new(),
            launch: launch(own),
            params: Vec::new(),
            small_m: None,
            relayouts: Vec::new(),
            short_grids: shorts
                .iter()
                .map(|&n| ShortGrid {
                    entry: format!("k_{n}"),
                    launch: launch(n),
                })
                .collect(),
            tile_fixed_cols,
        }
    }

    #[test]
    fn the_short_grid_is_the_one_whose_busiest_block_computes_least() {
        let k = kernel_with_shorts(352, &[256, 128, 64], 128);
        let at = |k: &CudaKernel, t: u64| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            let c = k.choose_entry(&b, 132, None).unwrap();
            (k.short_grid_for(&b, 132).unwrap(), c.entry.to_string())
        };
        // One row tile: 12 / 16 / 32 / 64 tiles, one wave each; the narrowest.
        assert_eq!(at(&k, 128), (Some(2), "k_64".to_string()));
        // Four: 48 / 64 / 128 tiles in one wave, 256 in two (2 x 192 columns against 256).
        assert_eq!(at(&k, 512).0, Some(1));
        // Eight: 96 / 128 tiles in one wave, 256 / 512 in two / four: the eight-row groups.
        assert_eq!(at(&k, 1024).0, Some(0));
        // 32 row tiles: 384 tiles in three waves (3 x 480) against 512 in four (4 x 384).
        assert_eq!(at(&k, 4096), (None, "k".to_string()));
        // Six row tiles: 72 / 96 tiles in one wave (480 / 384), 192 in two (2 x 256), 384 in
        // three (3 x 192): the eight-row groups. Counted by their area alone, the 64-column
        // tiles would win there (3 x 64 against 128 and 256), and tie with the 128-column ones
        // at four row tiles (2 x 64 against 128: the wider).
        assert_eq!(at(&k, 768).0, Some(0));
        let area = kernel_with_shorts(352, &[256, 128, 64], 0);
        assert_eq!(at(&area, 768).0, Some(2));
        assert_eq!(at(&area, 512).0, Some(1));
    }

    #[test]
    fn a_description_with_one_short_grid_object_reads_as_a_list_of_one() {
        let k = kernel_with_shorts(192, &[128], 0);
        let json = serde_json::to_string(&k).unwrap();
        assert!(json.contains("\"short_grids\":[{"), "{json}");
        assert!(!json.contains("tile_fixed_cols"), "{json}");
        assert_eq!(serde_json::from_str::<CudaKernel>(&json).unwrap(), k);
        let old = json
            .replace("\"short_grids\":[{", "\"short_grid\":{")
            .replace("}}]}", "}}}");
        assert!(old.contains("\"short_grid\":{"), "{old}");
        assert_eq!(serde_json::from_str::<CudaKernel>(&old).unwrap(), k);
        let none = kernel_with_shorts(192, &[], 0);
        let json = serde_json::to_string(&none).unwrap();
        assert!(!json.contains("short_grid"), "{json}");
        assert_eq!(serde_json::from_str::<CudaKernel>(&json).unwrap(), none);
    }

    #[test]
    fn persistent_grids_take_one_block_per_sm_at_most() {
        let launch = persistent_768(2, None);
        let at = |launch: &Launch, t: u64, sms: u32| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            launch.grid(&b, sms)
        };
        // 64 x 4 tiles on 132 SMs; 1 x 4 tiles; nothing to do.
        assert_eq!(at(&launch, 8192, 132), Ok([256, 1, 1]));
        assert_eq!(at(&launch, 8192, 100), Ok([200, 1, 1]));
        assert_eq!(at(&launch, 100, 132), Ok([4, 1, 1]));
        assert_eq!(at(&launch, 0, 132), Ok([0, 1, 1]));
        assert_eq!(at(&launch, 8192, 16), Ok([32, 1, 1]));
        // Clusters of two over 5 column tiles of 128 x 128, one CTA per SM, along the columns
        // (sharing A) or the rows (sharing B).
        let pairs = |cluster_rows: bool| Launch {
            grid: Grid::Persistent {
                m: Extent::of_dim(&Dim::sym("T")),
                n: Extent::constant(640),
                tile_m: 128,
                tile_n: 128,
                per_sm: 1,
                cluster: 2,
                cluster_rows,
                split_k: None,
                one_tile: None,
            },
            ..launch.clone()
        };
        // Along the columns: 3 cluster tiles a row tile, the last with a phantom; whole
        // clusters only, at most SMs / 2 of them.
        let clustered = pairs(false);
        assert_eq!(at(&clustered, 8192, 132), Ok([132, 1, 1]));
        assert_eq!(at(&clustered, 8192, 131), Ok([130, 1, 1]));
        assert_eq!(at(&clustered, 200, 132), Ok([12, 1, 1]));
        assert_eq!(at(&clustered, 100, 132), Ok([6, 1, 1]));
        assert_eq!(at(&clustered, 0, 132), Ok([0, 1, 1]));
        // Along the rows: 3 row tiles make 2 cluster tiles a column, the last with a phantom.
        let rows = pairs(true);
        assert_eq!(at(&rows, 300, 132), Ok([20, 1, 1]));
        assert_eq!(at(&rows, 100, 132), Ok([10, 1, 1]));
        assert_eq!(at(&rows, 8192, 132), Ok([132, 1, 1]));
        assert!(serde_json::to_string(&rows.grid)
            .unwrap()
            .contains("\"cluster_rows\":true"));
        assert!(!serde_json::to_string(&clustered.grid)
            .unwrap()
            .contains("cluster_rows"));
        // The field is left out of plans when it is 1, and read back as 1 when absent.
        let json = serde_json::to_string(&launch.grid).unwrap();
        assert!(!json.contains("cluster"), "{json}");
        let back: Grid = serde_json::from_str(&json).unwrap();
        assert_eq!(back, launch.grid);
        assert!(serde_json::to_string(&clustered.grid)
            .unwrap()
            .contains("\"cluster\":2"));
    }

    #[test]
    fn split_k_grids_split_short_grids_only() {
        // gpt2's down projection: 128 x 192 tiles of 48 k slices over N = 768.
        let split = SplitK {
            k_slices: 48,
            partial_bytes: 128 * 192 * 4,
            entry: "gemm_splitk".into(),
        };
        let launch = persistent_768(1, Some(split.clone()));
        let at = |t: u64, sms: u32| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            (
                launch.grid(&b, sms).unwrap(),
                launch.workspace_bytes(&b, sms).unwrap(),
            )
        };
        let entry = |t: u64| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            launch.alternate_entry(&b, 132).unwrap().map(str::to_string)
        };
        assert_eq!(entry(1000).as_deref(), Some("gemm_splitk"));
        assert_eq!(entry(8192), None);
        let ws = |blocks: u64| SplitK::COUNTER_BYTES + blocks * u64::from(split.partial_bytes);
        // T = 1000: 32 tiles on 132 SMs, four splits of 12 slices each.
        assert_eq!(at(1000, 132), ([128, 1, 1], ws(128)));
        // 64 tiles: two splits fill 128 of 132 SMs.
        assert_eq!(at(2000, 132), ([128, 1, 1], ws(128)));
        // 100 tiles are more than half the SMs: whole tiles, no workspace.
        assert_eq!(at(3200, 132), ([100, 1, 1], 0));
        assert_eq!(at(8192, 132), ([132, 1, 1], 0));
        // Four tiles: at most four splits, however many SMs are idle.
        assert_eq!(at(100, 132), ([16, 1, 1], ws(16)));
        assert_eq!(at(0, 132), ([0, 1, 1], 0));
        // The rule itself: splits of at least four slices, at most four, within the slots.
        let shallow = SplitK {
            k_slices: 7,
            ..split.clone()
        };
        assert_eq!(shallow.splits(4, 132), 1);
        assert_eq!(split.splits(40, 132), 3);
        assert_eq!(split.splits(67, 132), 1);
        assert_eq!(split.splits(66, 132), 2);
        // Without split K the field is left out of plans and read back as absent.
        let json = serde_json::to_string(&launch.grid).unwrap();
        assert!(json.contains("\"split_k\":{\"k_slices\":48"), "{json}");
        let back: Grid = serde_json::from_str(&json).unwrap();
        assert_eq!(back, launch.grid);
    }

    #[test]
    fn one_tile_entries_run_when_every_block_has_one_tile_at_most() {
        let mut launch = persistent_768(1, None);
        if let Grid::Persistent { one_tile, .. } = &mut launch.grid {
            *one_tile = Some("gemm_coop".into());
        }
        let entry = |launch: &Launch, t: u64| {
            let mut b = Bindings::new();
            b.bind(&"T".into(), t).unwrap();
            launch.alternate_entry(&b, 132).unwrap().map(str::to_string)
        };
        // 8 x 4 and 33 x 4 tiles fit 132 blocks; 34 x 4 do not; nothing to do.
        assert_eq!(entry(&launch, 1000).as_deref(), Some("gemm_coop"));
        assert_eq!(entry(&launch, 33 * 128).as_deref(), Some("gemm_coop"));
        assert_eq!(entry(&launch, 33 * 128 + 1), None);
        assert_eq!(entry(&launch, 0), None);
        // A grid that splits K takes the split entry.
        if let Grid::Persistent { split_k, .. } = &mut launch.grid {
            *split_k = Some(SplitK {
                k_slices: 48,
                partial_bytes: 1,
                entry: "gemm_splitk".into(),
            });
        }
        assert_eq!(entry(&launch, 1000).as_deref(), Some("gemm_splitk"));
        assert_eq!(entry(&launch, 3000).as_deref(), Some("gemm_coop"));
    }

    #[test]
    fn arch_names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.name()), Some(a));
        }
        assert_eq!(Arch::parse("cuda:sm_90a"), Some(Arch::Sm90a));
        assert_eq!(Arch::parse("sm_75"), None);
        assert_eq!(serde_json::to_string(&Arch::Sm90a).unwrap(), "\"sm_90a\"");
    }

    /// Each CTA's modelled load under `table` (`walk_table`) and under the kernel's snake.
    fn loads(costs: &[u32], row_tiles: u32, ctas: u32, table: &[u16]) -> (u64, u64) {
        let items = (row_tiles as usize) * costs.len();
        let cost = |w: usize| u64::from(costs[w % costs.len()]);
        let (mut walk, mut snake) = (vec![0u64; ctas as usize], vec![0u64; ctas as usize]);
        for (i, &w) in table.iter().enumerate() {
            if w != 0xffff {
                walk[i % ctas as usize] += cost(w as usize);
            }
        }
        for w in 0..items {
            let (r, b) = (w / ctas as usize, w % ctas as usize);
            let b = if r % 2 == 1 { ctas as usize - 1 - b } else { b };
            snake[b] += cost(w);
        }
        (
            walk.into_iter().max().unwrap_or(0),
            snake.into_iter().max().unwrap_or(0),
        )
    }

    #[test]
    fn walk_tables_hand_each_round_its_own_items_least_loaded_first() {
        // The modelled costs of the 4096^2 weight's twelve groups at d = 0.25 (costliest
        // first, the last group of seven block rows), at T = 4096 / 6144 / 8192 on 132 CTAs,
        // and grids that are not a multiple of the groups.
        let costs: Vec<u32> = vec![
            57320, 56420, 55160, 54980, 54200, 53960, 53900, 53780, 53420, 51920, 51440, 37940,
        ];
        for (row_tiles, ctas) in [(32, 132), (48, 132), (64, 132), (7, 10), (1, 132)] {
            let table = walk_table(&costs, row_tiles, ctas).unwrap();
            let items = row_tiles as usize * costs.len();
            let ctas_n = ctas as usize;
            assert_eq!(table.len(), items.div_ceil(ctas_n) * ctas_n);
            for (r, round) in table.chunks(ctas_n).enumerate() {
                // Round r holds exactly the snake's items of round r, each once.
                let mut got: Vec<usize> = round
                    .iter()
                    .filter(|&&w| w != 0xffff)
                    .map(|&w| w as usize)
                    .collect();
                got.sort_unstable();
                let want: Vec<usize> = (r * ctas_n..items.min((r + 1) * ctas_n)).collect();
                assert_eq!(got, want, "round {r} of {row_tiles} x 12 on {ctas}");
            }
            let (walk, snake) = loads(&costs, row_tiles, ctas, &table);
            assert!(
                walk <= snake,
                "{row_tiles} x 12 on {ctas}: {walk} > {snake}"
            );
        }
        // At T = 6144 (576 items on 132 CTAs, 4.4 rounds) the snake's busiest CTA takes five
        // items, costly ones among them; the least-loaded rounds give the fifth items to the
        // CTAs whose four cost least (the model's 3.9 %: docs/perf-notes.md, variant 47).
        let table = walk_table(&costs, 48, 132).unwrap();
        let (walk, snake) = loads(&costs, 48, 132, &table);
        assert!(walk < snake, "{walk} against {snake}");
    }

    #[test]
    fn walk_tables_too_large_for_the_argument_leave_the_snake() {
        let costs = vec![1u32; 12];
        // 9 rounds of 132 fit; 10 do not.
        assert!(walk_table(&costs, 99, 132).is_some());
        assert_eq!(walk_table(&costs, 100, 132), None);
        assert_eq!(walk_table(&[], 10, 132), None);
        assert_eq!(walk_table(&costs, 0, 132), None);
        let zero = walk_arg_bytes(None, 132);
        assert_eq!(zero.len(), WALK_ARG_BYTES);
        assert!(
            zero.iter().all(|&b| b == 0),
            "zero rounds: the kernel's snake"
        );
    }

    #[test]
    fn walk_arguments_are_the_round_count_then_the_items() {
        let table = walk_table(&[5, 3, 1], 2, 4).unwrap();
        // Six items on four CTAs: round 0 is items 0-3 (costs 5, 3, 1, 5), costliest first to
        // CTAs 0-3 (items 0, 3, 1, 2); round 1 is items 4 and 5 (3, 1), the costlier to CTA 3
        // (load 1), the other to CTA 2 (load 3).
        assert_eq!(table, [0, 3, 1, 2, 0xffff, 0xffff, 5, 4]);
        let bytes = walk_arg_bytes(Some(&table), 4);
        assert_eq!(bytes.len(), WALK_ARG_BYTES);
        assert_eq!(&bytes[..4], &2u32.to_le_bytes());
        let items: Vec<u16> = bytes[4..4 + 2 * table.len()]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(items, table);
        assert!(bytes[4 + 2 * table.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_launch_gives_its_walk_table_for_the_bound_rows() {
        let mut launch = persistent(4096, 352, 1, None);
        let t = |v: u64| {
            let mut b = Bindings::new();
            b.bind(&mlpc_ir::Symbol::from("T"), v).unwrap();
            b
        };
        // No costs: zero rounds.
        assert_eq!(launch.walk_arg(&t(4096), 132), walk_arg_bytes(None, 132));
        launch.walk_costs = (0..12).map(|j| 100 - j).collect();
        // T = 4000: 32 row tiles of 128 rows, 384 items in three rounds.
        let table = walk_table(&launch.walk_costs, 32, 132).unwrap();
        assert_eq!(
            launch.walk_arg(&t(4000), 132),
            walk_arg_bytes(Some(&table), 132)
        );
        assert_eq!(&launch.walk_arg(&t(4000), 132)[..4], &3u32.to_le_bytes());
        // Unbound rows: zero rounds rather than a table of the wrong size.
        assert_eq!(
            launch.walk_arg(&Bindings::new(), 132),
            walk_arg_bytes(None, 132)
        );
    }
}
