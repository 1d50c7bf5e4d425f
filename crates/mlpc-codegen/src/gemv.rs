//! Small-M variants of the dense GEMM kernels: weight-streaming entries (`gemv.cuh`) added to the
//! same generated module as the tiled entry, with the same parameters, for the runtime to launch
//! when the output has few rows (decode-time token counts). See [`crate::SmallM`] for the ABI.
//!
//! A variant exists when the weight is stored `[N, K]` with k contiguous (layout T, an
//! nn.Linear weight) and A `[M, K]` with k contiguous; other layouts keep the tiled entry only.
//! The variants are buckets of M: up to 8, 16, 32, 64 rows for f16 / bf16 (tensor cores), up to
//! 8 and 16 rows for f32 (8 for a dual f32 GEMM, whose two accumulator sets fill the registers).
//! When M is a constant only the smallest bucket that holds it is emitted, or none. [`configs`]
//! picks each bucket's work split (rows per CTA, warps, unroll, register budget, and from sm_90
//! on, for narrow outputs, K split across the two CTAs of a cluster, and for small weights, a
//! prefetch into L2 when a CTA starts) from the measurements in docs/perf-notes.md.

use crate::cpp;
use crate::{Arch, Grid, Launch, SmallM, SmallMVariant};
use mlpc_ir::{DType, Extent, MatLayout};

/// SMs of the target GPUs this is tuned for (H100 / H200: 132). Fewer CTAs than this get twice
/// the warps each, so that the weight stream still has enough loads in flight.
const SMS: u64 = 132;

/// One `mlpc::GemvConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemvConfig {
    /// Groups of 8 tokens per pass: the variant is for `M <= 8 * mg`.
    pub mg: u32,
    /// 16-row weight tiles per CTA.
    pub rt: u32,
    /// Warps per CTA (split-K).
    pub warps: u32,
    /// 32-wide k steps per chunk (weight loads in flight per lane: 2 rt unroll for f16 / bf16,
    /// 4 rt unroll for f32, twice that for a dual GEMM).
    pub unroll: u32,
    /// CTAs per SM the registers are budgeted for (`__launch_bounds__`' second argument).
    pub min_blocks: u32,
    /// CTAs of a cluster that split K between them (1: none; sm_90 and later only).
    pub ks: u32,
    /// Rounds of its weight rows (after the first, which it loads into registers) a CTA asks L2
    /// to fetch as soon as it starts, before it waits for the kernel before (0: none; sm_90 and
    /// later only). A round is what the CTA's warps load together: WARPS chunks.
    pub pre: u32,
}

impl GemvConfig {
    pub fn max_m(&self) -> u64 {
        8 * u64::from(self.mg)
    }

    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    /// Output columns per CTA.
    pub fn rows(&self) -> u32 {
        16 * self.rt
    }

    fn template(&self) -> String {
        if self.pre > 0 {
            format!(
                "mlpc::GemvConfig<{}, {}, {}, {}, {}, {}>",
                self.mg, self.rt, self.warps, self.unroll, self.ks, self.pre
            )
        } else if self.ks > 1 {
            format!(
                "mlpc::GemvConfig<{}, {}, {}, {}, {}>",
                self.mg, self.rt, self.warps, self.unroll, self.ks
            )
        } else {
            format!(
                "mlpc::GemvConfig<{}, {}, {}, {}>",
                self.mg, self.rt, self.warps, self.unroll
            )
        }
    }
}

/// The variants for a GEMM with `m` output rows and `n` output columns.
pub(crate) fn configs(
    arch: Arch,
    dtype: DType,
    dual: bool,
    m: &Extent,
    n: &Extent,
    k: &Extent,
) -> Vec<GemvConfig> {
    // (token groups, unroll, 256-thread CTAs per SM): two CTAs per SM cap a thread at 128
    // registers, one at 255 (no spills either way: ptxas' reports, checked by the NVRTC tests).
    // Up to 16 tokens, a shallower unroll measured faster on the H200 than more loads in flight
    // per warp (llama-swiglu T=16: 0.124 ms with unroll 2 / 4 for the dual / plain GEMM, 0.106
    // with 1 / 2; gpt2-mlp T=16: 0.0165 -> 0.0156; a deeper unroll at one CTA per SM: 0.143;
    // docs/perf-notes.md).
    let buckets: &[(u32, u32, u32)] = match (dtype, dual) {
        (DType::F16 | DType::Bf16, false) => &[(1, 2, 2), (2, 2, 2), (4, 4, 2), (8, 4, 2)],
        (DType::F16 | DType::Bf16, true) => &[(1, 1, 2), (2, 1, 2), (4, 2, 2), (8, 2, 1)],
        (DType::F32, false) => &[(1, 2, 2), (2, 1, 2)],
        (DType::F32, true) => &[(1, 1, 2)],
    };
    // 16-warp CTAs when there are too few 8-warp CTAs to fill the machine: fewer CTAs than SMs,
    // or fewer than two per SM with a deep K (each of 16 warps still gets 8 or more 32-wide
    // steps). The llama down projection (N = 4096, K = 11008: 256 CTAs) ran at 2.68 TB/s with
    // 8-warp CTAs, a quarter of the warp slots occupied (`ncu`, docs/perf-notes.md).
    let deep = k.as_constant().is_some_and(|k| k >= 4096);
    let symbolic_k = k.as_constant().is_none();
    let n = n.as_constant();
    let all = buckets.iter().map(|&(mg, unroll, per_sm)| {
        // A dual GEMM of one or two token groups whose one-tile CTAs make four waves or more at
        // three per SM: one tile, 8 warps, three CTAs per SM, two 32-wide steps a chunk for one
        // group and one for two (which spilled at two). llama-swiglu T = 1: 0.0796 -> 0.0781 ms
        // against two CTAs per SM (16-warp CTAs 0.0784, three CTAs at one step 0.0796, four
        // 0.0800); T = 16: 0.0787 -> 0.0744 against two-tile 16-warp CTAs, one per SM (2.6
        // waves, the last leaving 52 SMs idle), where the other shapes measured 0.0774-0.0876
        // (docs/perf-notes.md, small M).
        let streaming_dual = dual
            && dtype != DType::F32
            && mg <= 2
            && !symbolic_k
            && n.is_some_and(|n| n.div_ceil(16) >= 4 * SMS);
        // From 9 tokens on, every CTA re-reads the A rows of its whole K from L2: as many bytes
        // as its 16 weight rows at 16 tokens. Two 16-row tiles per CTA halve that; it pays when
        // K is deep and the halved grid still covers the SMs (llama-swiglu: T = 16 0.1043 ->
        // 0.0956 ms, T = 64 0.363 -> 0.300; gpt2 / bert-large at T = 16, whose grids would
        // drop below the SMs, measured 2 % slower).
        let rt =
            if !streaming_dual && mg >= 2 && deep && n.is_some_and(|n| n.div_ceil(32) >= SMS - 8) {
                2
            } else {
                1
            };
        let ctas = n.map(|n| n.div_ceil(16 * u64::from(rt)));
        // From 32 tokens on, two tiles' accumulators take the registers of a second CTA per SM
        // (at 128 registers a thread, ptxas spilled).
        let per_sm = if rt == 2 && mg >= 4 { 1 } else { per_sm };
        // A symbolic K's loads keep their element-wise tail (no constant trip count shows that
        // every 16-byte piece is whole), which needs more registers than the same loop over a
        // constant K: at two CTAs per SM ptxas spilled the chunks of 64 tokens (f16 / bf16) and
        // the dual f32 ones. A thread's whole budget for those.
        let per_sm = if symbolic_k { 1 } else { per_sm };
        // The deep-K rule only up to 16 tokens: measured 0.0856 -> 0.0795 ms (T = 1), 0.0960 ->
        // 0.0873 (T = 4), 0.1054 -> 0.1047 (T = 16), but 0.362 -> 0.371 at T = 64.
        let few_ctas = ctas.is_some_and(|c| c < SMS || (deep && mg <= 2 && c < 2 * SMS));
        // A 16-warp CTA takes the register budget of two 8-warp ones; so do two tiles per CTA
        // (measured with 8 warps: llama T = 16 0.1030 ms, with 16: 0.0966).
        let warps = if (few_ctas || rt == 2) && per_sm == 2 {
            16
        } else {
            8
        };
        let (unroll, per_sm) = if streaming_dual {
            (if mg == 1 { 2 } else { 1 }, 3)
        } else {
            (unroll, per_sm)
        };
        // A plain GEMM whose CTAs would fill at most half of the SMs splits K across the two
        // CTAs of a cluster, which add their sums through distributed shared memory: twice the
        // CTAs in one wave, each reading half of the weights and activations, while every warp
        // keeps four or more 32-wide steps (bert-large's down projection, 64 16-warp CTAs:
        // T = 1 0.0136 -> 0.0125 ms, T = 16 0.0169 -> 0.0163; gpt2's, 48 CTAs and three steps
        // a warp: T = 1 0.0113 -> 0.0111, T = 16 0.0141 -> 0.0145, so not split). Registers,
        // not CTAs, limit the loads in flight of grids that already cover the SMs: two 16-warp
        // CTAs per SM (64 registers a thread) spilled.
        let ks = if arch != Arch::Sm80
            && dtype != DType::F32
            && !dual
            && mg <= 2
            && ctas.is_some_and(|c| 2 * c <= SMS + 8)
            && k.as_constant()
                .is_some_and(|k| k / 32 >= 4 * u64::from(warps) * 2)
        {
            2
        } else {
            1
        };
        // Small weights (up to 16 MiB an entry, a third of the L2): every CTA asks L2 for its
        // next two rounds of weight rows when it starts, so that a kernel bound by the latency of
        // its first loads rather than by bandwidth finds them on chip (gpt2-mlp T = 1 0.0102 ->
        // 0.0096 ms, T = 16 0.0121 -> 0.0115, bert-large T = 16 0.0154 -> 0.0148; llama-swiglu,
        // 270 MB of weights streamed at 80-90 % of the bandwidth, lost 5-15 % with it, four
        // rounds lost more; docs/perf-notes.md).
        let weight_bytes = n
            .zip(k.as_constant())
            .map(|(n, k)| n * k * dtype.size_bytes() as u64 * if dual { 2 } else { 1 });
        // (Only where there is a second round: K beyond what the warps load in their first chunks.)
        let pre = if arch != Arch::Sm80
            && dtype != DType::F32
            && mg <= 2
            && weight_bytes.is_some_and(|b| b <= 16 << 20)
            && k.as_constant()
                .is_some_and(|k| k > u64::from(warps * unroll * 32))
        {
            2
        } else {
            0
        };
        GemvConfig {
            mg,
            rt,
            warps,
            unroll,
            min_blocks: per_sm * 8 / warps,
            ks,
            pre,
        }
    });
    for_m(all, m)
}

/// What the small-M entries share with the tiled entry of the same module.
pub(crate) struct Parts<'a> {
    pub arch: Arch,
    pub dtype: DType,
    pub dual: bool,
    /// Physical layouts of A and B (which dimension is contiguous).
    pub la: MatLayout,
    pub lb: MatLayout,
    pub m: &'a Extent,
    pub n: &'a Extent,
    pub k: &'a Extent,
    /// The tiled entry; the variants are named `<entry>_gemv_m<max_m>`.
    pub entry: &'a str,
    /// The `mlpc::SingleEpilogue<...>` / `mlpc::DualEpilogue<...>` type.
    pub epilogue: &'a str,
    /// B (and Bu) are constant through a run (weights, or the caller's inputs), so the entries may
    /// load them before the kernel before has finished (early launch).
    pub const_b: bool,
    /// The parameter list of the tiled entry (the variants take the same arguments).
    pub signature: &'a str,
    /// The body lines that fill `mlpc::GemmParams p`, without the call that runs it.
    pub fill: &'a [String],
}

/// Appends the small-M entries for `parts` to `src` and describes them, or does nothing and
/// returns `None` when no variant applies (operand layouts, a constant M above every bucket).
pub(crate) fn append(src: &mut String, parts: &Parts<'_>) -> Option<SmallM> {
    if parts.la != MatLayout::N || parts.lb != MatLayout::T {
        return None;
    }
    let configs = configs(
        parts.arch,
        parts.dtype,
        parts.dual,
        parts.m,
        parts.n,
        parts.k,
    );
    if configs.is_empty() {
        return None;
    }
    let elem = cpp::elem_type(parts.dtype);
    let template = match parts.dtype {
        DType::F16 | DType::Bf16 => format!("mlpc::GemvMma<{elem}, "),
        DType::F32 => "mlpc::GemvSimt<".to_string(),
    };
    Some(emit(
        src,
        &Entries {
            header: "gemv.cuh",
            prelude: String::new(),
            kernel: &|c| format!("{template}{}, SmallEpilogue>", c.template()),
            epilogue: parts.epilogue,
            entry: parts.entry,
            signature: parts.signature,
            fill: parts.fill,
            m: parts.m,
            n: parts.n,
            // The templates wait for the kernel before (`wait_for_predecessors`) from sm_90
            // on, after their first weight loads: only constant weights may go first.
            early_launch: parts.arch != Arch::Sm80 && parts.const_b,
        },
        &configs,
    ))
}

/// What the two kinds of small-M entries (`gemv.cuh`, `gemv_bsr.cuh`) put into a module the
/// same way.
struct Entries<'a> {
    /// The template header the entries include.
    header: &'a str,
    /// Declarations the entries' kernel types need, inside the module's anonymous namespace.
    prelude: String,
    /// The kernel type of a configuration, e.g. `mlpc::GemvMma<mlpc::bf16, ...>`.
    kernel: &'a dyn Fn(&GemvConfig) -> String,
    epilogue: &'a str,
    /// The tiled entry; the variants are named `<entry>_gemv_m<max_m>`.
    entry: &'a str,
    signature: &'a str,
    fill: &'a [String],
    /// The output's rows (`M`) and columns (`N`).
    m: &'a Extent,
    n: &'a Extent,
    early_launch: bool,
}

/// Appends one entry per configuration to `src` (`SmallM<max_m>` aliases checked against the
/// launch's block size, then the `extern "C"` entries filling the tiled entry's params) and
/// describes them: a grid of `N / rows` CTAs (by `ks`, the CTAs of a cluster along y).
fn emit(src: &mut String, e: &Entries<'_>, configs: &[GemvConfig]) -> SmallM {
    src.push_str(&format!(
        "\n// Small-M entries ({}): same arguments, launched instead of the tiled entry when the\n\
         // output has at most as many rows as the entry's suffix says.\n",
        e.header
    ));
    src.push_str(&format!("#include \"{}\"\n\nnamespace {{\n", e.header));
    src.push_str(&e.prelude);
    src.push_str(&format!("using SmallEpilogue = {};\n", e.epilogue));
    for c in configs {
        let alias = format!("SmallM{}", c.max_m());
        src.push_str(&format!("using {alias} = {};\n", (e.kernel)(c)));
        src.push_str(&format!(
            "static_assert({alias}::kThreads == {}, \"block size of the launch description\");\n",
            c.threads()
        ));
    }
    src.push_str("}  // namespace\n");
    let mut variants = Vec::with_capacity(configs.len());
    for c in configs {
        let entry = format!("{}_gemv_m{}", e.entry, c.max_m());
        let cluster = if c.ks > 1 {
            format!(" __cluster_dims__(1, {}, 1)", c.ks)
        } else {
            String::new()
        };
        src.push_str(&format!(
            "\nextern \"C\" __global__ void __launch_bounds__({}, {}){cluster} {entry}(\n{}) {{\n",
            c.threads(),
            c.min_blocks,
            e.signature
        ));
        for line in e.fill {
            src.push_str(line);
            src.push('\n');
        }
        src.push_str(&format!("    SmallM{}::run(p);\n}}\n", c.max_m()));
        variants.push(SmallMVariant {
            max_m: c.max_m(),
            entry,
            launch: Launch {
                block: [c.threads(), 1, 1],
                smem_bytes: 0,
                early_launch: e.early_launch,
                walk_costs: Vec::new(),
                // y: the CTAs of a cluster (the entry's `__cluster_dims__`).
                grid: Grid::Tiles {
                    m: e.n.clone(),
                    n: Extent::constant(u64::from(c.ks)),
                    tile_m: c.rows(),
                    tile_n: 1,
                },
            },
        });
    }
    SmallM {
        m: e.m.clone(),
        variants,
    }
}

/// The block-sparse small-M variants (`gemv_bsr.cuh`) of an f16 / bf16 GEMM (`dual`: its gate
/// and up weights on one pattern) over `block_rows` block rows of `br` x `bc` blocks with `m`
/// output rows: one CTA a block row, `br / 16` weight tiles, chunks of whole blocks; none where
/// a block is not whole 16-row tiles and 32-wide k steps, or where a chunk of one block's steps
/// would need more than 64 weight registers a lane. The buckets of M are the dense ones
/// (`configs`, plain or dual) up to 64 rows, less those whose accumulators would take more than
/// 64 registers a lane; each bucket's warps and register budget follow the dense rules (16 warps
/// where the block rows are fewer than the SMs, one CTA an SM from 32 accumulators or 64 weight
/// words a lane). The codegen emits them where [`crate::CodegenOptions::sparse_gemv`] asks for
/// them (by default).
pub(crate) fn bsr_configs(
    dtype: DType,
    dual: bool,
    [br, bc]: [u32; 2],
    block_rows: u64,
    m: &Extent,
) -> Vec<GemvConfig> {
    if !matches!(dtype, DType::F16 | DType::Bf16) || br % 16 != 0 || bc % 32 != 0 {
        return Vec::new();
    }
    // Weights read together, 16-row tiles a CTA, 32-wide steps a block.
    let (nw, rt, steps) = (if dual { 2 } else { 1 }, br / 16, bc / 32);
    // Weight words in flight a lane: unroll x rt x 8 a weight.
    if nw * steps * rt > 8 {
        return Vec::new();
    }
    let buckets: &[(u32, u32, u32)] = match dual {
        false => &[(1, 2, 2), (2, 2, 2), (4, 4, 2), (8, 4, 2)],
        true => &[(1, 1, 2), (2, 1, 2), (4, 2, 2), (8, 2, 1)],
    };
    let all = buckets
        .iter()
        .filter(|&&(mg, _, _)| nw * rt * mg <= 16)
        .map(|&(mg, unroll, per_sm)| {
            // The bucket's unroll in whole blocks, as deep as 64 weight registers allow.
            let mut unroll = unroll.div_ceil(steps) * steps;
            while unroll > steps && nw * unroll * rt > 8 {
                unroll -= steps;
            }
            // One CTA an SM (255 registers a thread) from 32 accumulators or 64 weight words a
            // lane: 64-row blocks spilled at 128.
            let per_sm = if nw * rt * mg >= 8 || nw * unroll * rt > 4 {
                1
            } else {
                per_sm
            };
            let warps = if block_rows < SMS && per_sm == 2 {
                16
            } else {
                8
            };
            GemvConfig {
                mg,
                rt,
                warps,
                unroll,
                min_blocks: per_sm * 8 / warps,
                ks: 1,
                pre: 0,
            }
        });
    for_m(all, m)
}

/// The variants of `all` (in increasing `max_m`) an output of `m` rows needs: every one where
/// `m` is symbolic, the first that holds a constant `m`, none for `m = 0` or beyond the last.
fn for_m(all: impl Iterator<Item = GemvConfig>, m: &Extent) -> Vec<GemvConfig> {
    match m.as_constant() {
        None => all.collect(),
        Some(0) => Vec::new(),
        Some(m) => all.filter(|c| c.max_m() >= m).take(1).collect(),
    }
}

/// What the block-sparse small-M entries share with the tiled entry of the same module.
pub(crate) struct BsrParts<'a> {
    pub arch: Arch,
    pub dtype: DType,
    /// A dual GEMM: its gate and up weights packed on one pattern.
    pub dual: bool,
    pub block: [u32; 2],
    /// The output's rows (`M`) and columns (`N`, whole block rows).
    pub m: &'a Extent,
    pub n: u64,
    /// Kept blocks of block row r: `col_idx[row_ptr[r] .. row_ptr[r + 1]]`.
    pub row_ptr: &'a [u32],
    pub col_idx: &'a [u32],
    /// Where the weight buffer the kernel reads holds 16-byte chunk q of a packed block (the
    /// inverse of the module's [`crate::Relayout`]), or `None` for the packed order itself.
    pub chunk_at: Option<Vec<u32>>,
    /// The tiled entry; the variants are named `<entry>_gemv_m<max_m>`.
    pub entry: &'a str,
    /// The `mlpc::SingleEpilogue<...>` / `mlpc::DualEpilogue<...>` type.
    pub epilogue: &'a str,
    /// The parameter list of the tiled entry (the variants take the same arguments).
    pub signature: &'a str,
    /// The body lines that fill the entry's params `p` (the `GemmParams` part and the
    /// epilogue's), without the call that runs it.
    pub fill: &'a [String],
}

/// Appends the block-sparse small-M entries for `parts` to `src` and describes them, or does
/// nothing and returns `None` where no variant applies ([`bsr_configs`]).
pub(crate) fn append_bsr(src: &mut String, parts: &BsrParts<'_>) -> Option<SmallM> {
    let [br, bc] = parts.block;
    let block_rows = parts.n / u64::from(br);
    let configs = bsr_configs(parts.dtype, parts.dual, parts.block, block_rows, parts.m);
    if configs.is_empty() {
        return None;
    }
    let elem = cpp::elem_type(parts.dtype);
    let mut prelude = String::from(
        "// Kept blocks of block row r: gemv_col_idx[gemv_row_ptr[r] .. gemv_row_ptr[r + 1]].\n",
    );
    prelude.push_str(&crate::bsr::index_array("gemv_row_ptr", parts.row_ptr));
    prelude.push_str(&crate::bsr::index_array("gemv_col_idx", parts.col_idx));
    let chunk = match &parts.chunk_at {
        Some(at) => {
            prelude.push_str(
                "// Where the rearranged weight holds 16-byte chunk q of a packed block.\n",
            );
            prelude.push_str(&crate::bsr::index_array("gemv_chunk", at));
            "gemv_chunk[q]"
        }
        None => "q",
    };
    prelude.push_str(&format!(
        "struct GemvBlocks {{\n    \
         __device__ __forceinline__ static int begin(int r) {{ return gemv_row_ptr[r]; }}\n    \
         __device__ __forceinline__ static int col(int i) {{ return gemv_col_idx[i]; }}\n    \
         __device__ __forceinline__ static int chunk(int q) {{ return {chunk}; }}\n}};\n"
    ));
    Some(emit(
        src,
        &Entries {
            header: "gemv_bsr.cuh",
            prelude,
            kernel: &|c| {
                format!(
                    "mlpc::GemvBsrMma<{elem}, {br}, {bc}, {}, SmallEpilogue, GemvBlocks>",
                    c.template()
                )
            },
            epilogue: parts.epilogue,
            entry: parts.entry,
            signature: parts.signature,
            fill: parts.fill,
            m: parts.m,
            n: &Extent::constant(parts.n),
            // The weights are constant: the entries load them before they wait for the kernel
            // before (from sm_90 on).
            early_launch: parts.arch != Arch::Sm80,
        },
        &configs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::Dim;

    fn sym(s: &str) -> Extent {
        Extent::of_dim(&Dim::sym(s))
    }

    #[test]
    fn small_weights_are_prefetched_from_sm_90_on() {
        let pre = |arch, d, dual, n: u64, k: u64| -> Vec<u32> {
            let (n, k) = (Extent::constant(n), Extent::constant(k));
            configs(arch, d, dual, &sym("T"), &n, &k)
                .iter()
                .map(|c| c.pre)
                .collect()
        };
        // gpt2's up projection (4.5 MiB), bert-large's dual-sized 2 x 8 MiB: up to 16 tokens.
        assert_eq!(
            pre(Arch::Sm90a, DType::Bf16, false, 3072, 768),
            vec![2, 2, 0, 0]
        );
        assert_eq!(
            pre(Arch::Sm90, DType::F16, true, 4096, 1024),
            vec![2, 2, 0, 0]
        );
        // llama's down projection (86 MiB), f32, sm_80: none.
        assert_eq!(
            pre(Arch::Sm90a, DType::Bf16, false, 4096, 11008),
            vec![0; 4]
        );
        assert_eq!(pre(Arch::Sm90a, DType::F32, false, 3072, 768), vec![0; 2]);
        assert_eq!(pre(Arch::Sm80, DType::Bf16, false, 3072, 768), vec![0; 4]);
        // Unknown N or K: none.
        assert_eq!(
            configs(
                Arch::Sm90a,
                DType::Bf16,
                false,
                &sym("T"),
                &sym("N"),
                &Extent::constant(768)
            )
            .iter()
            .map(|c| c.pre)
            .collect::<Vec<_>>(),
            vec![0; 4]
        );
    }

    #[test]
    fn buckets_follow_the_dtype_and_a_constant_m() {
        let n = Extent::constant(4096);
        let maxes = |d, dual, m: &Extent| -> Vec<u64> {
            configs(Arch::Sm90a, d, dual, m, &n, &Extent::constant(768))
                .iter()
                .map(|c| c.max_m())
                .collect()
        };
        assert_eq!(maxes(DType::Bf16, false, &sym("T")), vec![8, 16, 32, 64]);
        assert_eq!(maxes(DType::F16, true, &sym("T")), vec![8, 16, 32, 64]);
        assert_eq!(maxes(DType::F32, false, &sym("T")), vec![8, 16]);
        assert_eq!(maxes(DType::F32, true, &sym("T")), vec![8]);
        assert_eq!(maxes(DType::Bf16, false, &Extent::constant(9)), vec![16]);
        assert_eq!(maxes(DType::Bf16, false, &Extent::constant(64)), vec![64]);
        assert!(maxes(DType::Bf16, false, &Extent::constant(65)).is_empty());
        assert!(maxes(DType::Bf16, false, &Extent::constant(0)).is_empty());
        assert!(maxes(DType::F32, true, &Extent::constant(9)).is_empty());
    }

    #[test]
    fn few_output_columns_get_more_warps_per_cta() {
        let t = sym("T");
        let warps = |n: &Extent, k: u64| {
            configs(Arch::Sm90a, DType::Bf16, false, &t, n, &Extent::constant(k))[0].warps
        };
        // 768 columns: 48 CTAs, fewer than the SMs.
        assert_eq!(warps(&Extent::constant(768), 3072), 16);
        assert_eq!(warps(&Extent::constant(4096), 1024), 8);
        // 256 CTAs, fewer than two per SM, with a deep K (llama's down projection).
        assert_eq!(warps(&Extent::constant(4096), 11008), 16);
        assert_eq!(warps(&Extent::constant(11008), 4096), 8);
        assert_eq!(warps(&sym("N"), 4096), 8);
        // The bf16 variants of a GEMM with n output columns and a depth of k.
        let bf16 = |dual, n, k| {
            configs(
                Arch::Sm90a,
                DType::Bf16,
                dual,
                &t,
                &Extent::constant(n),
                &Extent::constant(k),
            )
        };
        // llama-swiglu's dual GEMM: 688 one-tile CTAs, three per SM, up to 16 tokens; two
        // tiles per CTA from 17.
        let shape: Vec<_> = bf16(true, 11008, 4096)
            .iter()
            .map(|c| (c.rt, c.warps, c.unroll, c.min_blocks))
            .collect();
        assert_eq!(
            shape,
            vec![(1, 8, 2, 3), (1, 8, 1, 3), (2, 8, 2, 1), (2, 8, 2, 1)]
        );
        // Its down projection; a 3072-wide output keeps one tile even with a deep K (96
        // two-tile CTAs would not fill the SMs).
        let down = bf16(false, 4096, 11008);
        assert_eq!(down.iter().map(|c| c.rt).collect::<Vec<_>>(), [1, 2, 2, 2]);
        assert!(bf16(false, 3072, 4096).iter().all(|c| c.rt == 1));
        for c in bf16(true, 768, 768) {
            let regs = 65536 / (c.threads() * c.min_blocks);
            assert!(regs == 128 || (c.mg == 8 && regs == 256), "{c:?}");
        }
    }

    #[test]
    fn deep_narrow_plain_gemms_split_k_across_a_cluster() {
        let t = sym("T");
        let split = |arch, dual, n: u64, k: u64| -> Vec<(u32, u32)> {
            configs(
                arch,
                DType::Bf16,
                dual,
                &t,
                &Extent::constant(n),
                &Extent::constant(k),
            )
            .iter()
            .map(|c| (c.ks, c.min_blocks))
            .collect()
        };
        // bert-large's down projection: 64 16-warp CTAs up to 16 tokens, split into 128.
        assert_eq!(
            split(Arch::Sm90a, false, 1024, 4096),
            [(2, 1), (2, 1), (1, 1), (1, 1)]
        );
        assert_eq!(split(Arch::Sm90, false, 1024, 4096)[..2], [(2, 1), (2, 1)]);
        // No split for gpt2's (48 CTAs, K = 3072: three steps a warp), before sm_90, for dual
        // GEMMs, shallow K, or grids that would pass one wave (llama's down projection: 256
        // CTAs at 8 tokens, 128 two-tile CTAs at 16).
        for (arch, dual, n, k) in [
            (Arch::Sm90a, false, 768, 3072),
            (Arch::Sm80, false, 1024, 4096),
            (Arch::Sm90a, true, 1024, 4096),
            (Arch::Sm90a, false, 1024, 1024),
            (Arch::Sm90a, false, 4096, 11008),
        ] {
            assert!(
                split(arch, dual, n, k).iter().all(|c| c.0 == 1),
                "{arch:?} dual={dual} N={n} K={k}"
            );
        }
    }
}
