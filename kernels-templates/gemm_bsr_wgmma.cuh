// mlpc kernel templates: the Hopper (sm_90a) block-sparse GEMM for f16 / bf16: warpgroup
// `wgmma.mma_async` over a GROUP of consecutive block rows of the weight, with the compile-time
// epilogue chain of common.cuh.
//
//   C[m, n] = Epi(sum over kept blocks (r, c) with r = n / BR of  A[m, c*BC .. c*BC+BC] . W_blk[n % BR, :])
//
// The weight is the logical [N, K] matrix cut into BR x BC blocks; only the kept blocks are stored,
// packed as [kept, BR, BC] (each block row-major, k contiguous), sorted row-major by (block row,
// block col), as for gemm_bsr.cuh. A is row-major [M, K] (k contiguous): both operands are then
// "K-major", what wgmma reads for 16-bit types without a transpose.
//
// CTA: BM = 128 rows of A and C (two consumer warpgroups of 64 rows, 256 threads, and a producer
// warpgroup) x a group of G consecutive block rows of W (G * BR output columns). Accumulator g (G of
// them; two sets for a dual GEMM) is a separate register array of BR / 2 f32 per thread: the
// m64nBRk16 result of block row g. A tile is a (BM rows, group) pair; the grid is persistent
// (at most one CTA per SM), each CTA walks its tiles (`bsr_wgmma::work_item`): the row tiles in
// order, a row tile's groups consecutive in the order of `grp_order` (costliest first), so that
// the groups that read one band of A run at about the same time and A comes from DRAM about once
// (the groups' row tiles consecutive instead measured 4-10 % slower: docs/perf-notes.md,
// block-sparse variant 28), handed to the CTAs in a snake (round r: CTA b takes item r * P + b,
// or r * P + P - 1 - b when r is odd), so that the CTAs' sums of steps even out, or, where the
// launch passes a work-item table (`BsrWalk`), each round's items as the table assigns them.
// The ring runs on across a CTA's tiles: its producer fills the next tile's stages while the
// consumers store the last one.
//
// Steps (compile-time lists emitted by the generated file, see BsrWgmmaParams): the steps of a
// group are the union of the kept block columns of its G block rows, in increasing order. Step s
// carries its block column, a G-bit mask of the rows that keep it, and the packed indices of those
// kept blocks (in increasing g). A block is cut into BC / BK k slices of BK (the largest of 64, 48,
// 32, 16 dividing BC); a slice is the unit of the pipeline: one stage holds
//   [A: BM rows x BK][slot 0 .. SLOTS - 1: BR rows x BK each][up slots (dual)]
// A slice loads the A piece once (shared by every kept row) and only the kept blocks, the j-th
// kept block of the step (in mask-bit order) into slot j: SLOTS is the most blocks any step of
// the weight keeps (known when the kernel is generated), so a stage holds no slots that no step
// fills and the ring has as many stages as the kept blocks allow. Then for each g whose mask bit
// is set (warp-uniform: every thread reads the same mask) the BK / 16 wgmmas into acc[g], reading
// the next slot. A block row with no kept block in a step costs nothing there; a
// group with no kept block at all runs no slice, and its outputs are the epilogue of zero.
// Windows (WB = 2, for 32-wide blocks, chosen by the codegen where they pay): a step is a window
// of WB block columns, BK = WB * BC, its mask has WB * G bits (bit w * G + g: row g keeps column
// w of the window) and a stage SLOTS <= WB * G slots of BKB = BK / WB columns; the A
// piece is then copied in rows of 2 * BK bytes (the copy engine's cost follows its box rows),
// each block in boxes of its own BC-wide rows, and kept block (w, g) meets the A piece's k16
// steps w * BKB / 16 .. (w + 1) * BKB / 16 - 1.
//
// Pairs (PAIRS, WB = 2, where the windows do not pay: at low density the second column of a
// window is mostly empty): a step is two consecutive block columns of the group's union, c0 and
// c1, wherever they lie in the weight (`step_info` holds c0, `step_col1` c1). The A piece is
// then two atom columns of BC (one box each, at k = c0 * BC and c1 * BC) instead of one box of
// 2 * BC; mask bits and slots are the window's, column w of the window being c_w of the pair.
//
// Shared layout (PTX ISA, "Shared Memory Matrix Layout", K-major, swizzled): a tile of R rows x BK
// is cut along k into BK / SW atoms columns of SW 16-bit elements (SW = 64, 32 or 16: the widest
// that divides BK); atom column a is R rows of 2 * SW bytes at byte a * R * 2 * SW of the tile,
// and its 16-byte chunk c of row r sits at chunk position c ^ ((r >> S) & (SW / 8 - 1)):
//
//   SW = 64: 128-byte rows, 128B swizzle, S = 0 (c ^ r % 8), layout type 1, SBO = 1024
//   SW = 32:  64-byte rows,  64B swizzle, S = 1 (c ^ (r / 2) % 4), layout type 2, SBO = 512
//   SW = 16:  32-byte rows,  32B swizzle, S = 2 (c ^ (r / 4) % 2), layout type 3, SBO = 256
//
// The hardware swizzle XORs byte-address bits [4, 4 + b) with bits [7, 7 + b) (b = 3, 2, 1); every
// atom column starts on a multiple of 8 rows x 2 SW bytes (the period of its pattern) from the
// 1024-aligned ring, so the position above is exactly that XOR of the address. Descriptors
// (PTX ISA, "Matrix Descriptor Format"): start address >> 4 in bits 0-13, leading byte offset 1
// (unused by swizzled K-major layouts), stride byte offset (8 rows of the atom) >> 4 in bits
// 32-45, base offset 0, the layout type in bits 62-63. The wgmma k16 step j of a slice reads k =
// 16j .. 16j + 15: atom column 16j / SW, start advanced by (16j % SW) * 2 bytes inside the row.
// Warpgroup w's A descriptor starts 64 rows (64 * 2 SW bytes) further.
//
// Accumulators of m64nNk16 (as in gemm_wgmma.cuh): with q = warp in the warpgroup, gr = lane / 4,
// t = lane % 4, register d[4i + 2h + e] holds D[16q + gr + 8h][8i + 2t + e].
//
// Loads (the copy engine): one atom column of one operand is one TMA box of R rows x SW elements
// written with the swizzle of 2 * SW-byte rows (32, 64 or 128 bytes), which is the address XOR
// above; rows (and in a window, columns) of A outside [M, K] arrive as zeros. A is read through
// a tensor map over [M, K], the kept blocks through one over the packed weight seen as a
// [kept * BR, BC] matrix (block b's k slice ks, atom a: box at column ks * BKB + a * SWB, row
// b * BR). WIDE (a slice's piece of a block is the whole block, in atoms of rows narrower than
// 128 bytes, e.g. 32 x 32 blocks): the kernel reads a copy of the packed weight whose blocks the
// host rearranged (mlpc-codegen `wide_block_perm`, applied by the runtime at load) so that one box
// of the block's BR * BC * 2 / 128 rows of 128 bytes, written with the 128B swizzle into its
// 1024-aligned slot, lands as exactly the slot's image above: the copy engine's cost follows the
// rows of its boxes, and these are half (or a quarter) as many.
//
// Pipeline (as GemmWgmmaTma): STAGES stages with a `full` and an `empty` mbarrier and a mask
// word each; the CTA's slices are numbered across its tiles, slice s in stage s % STAGES. Up to
// four producer warps fill them, slice s by warp s % warps (at most STAGES warps); a warp walks
// only its own slices, their step lists read
// two slices ahead and spread over the lanes; per slice, lane 0 waits on the stage's `empty`
// barrier, writes the slice's row mask into the stage's word, announces the A piece's and the
// kept blocks' bytes on its `full` barrier and issues their copies.
// Consumers, per slice: wait on `full`, read the mask word, then with A from registers load the
// A fragments (`ldmatrix`), issue the kept blocks' wgmmas, commit, wait for them and release the
// stage (every consumer thread arrives on `empty`); with A through descriptors, issue, commit,
// wait until the slice kInFlight before is done and release that one's stage. No CTA-wide
// barrier after the set-up.
#pragma once

#include "gemm_wgmma.cuh"

/// The element type of the block-index tables read through the parameters: `int`, or
/// `unsigned short` where the generated kernel defines it so (at most 65535 kept blocks and block
/// columns: half the tables' bytes in the kernel image).
#ifndef MLPC_BSR_IDX
#define MLPC_BSR_IDX int
#endif

namespace mlpc {

/// A BM-row CTA over a group of G block rows, k slices of BK, STAGES stages; A_REGS: the A
/// piece of a slice is loaded into registers once (`ldmatrix`) and every kept row's wgmma reads
/// it from there (the `wgmma` RS form), instead of each wgmma reading it from shared memory.
/// WB: block columns per slice (a K window of WB whole blocks, BK = WB * BC), or 1 (a slice is
/// BK of one block column, BK dividing BC). WIDE: each kept block is copied as one box of
/// 128-byte rows from the packed weight rearranged into its slot's image (see "Loads").
/// SLOTS: block slots per stage, the most kept blocks of any step (0: WB * G). PAIRS (WB = 2):
/// a step is two of the group's kept block columns, consecutive in its union but anywhere in
/// the weight, instead of a window of two neighbouring ones (see "Pairs"). STAGING_BUFS: the
/// staging buffers per consumer warpgroup of TMA_STORE's epilogue, 2 or 1.
template <int BM_, int G_, int BK_, int STAGES_, bool A_REGS_ = false, int WB_ = 1,
          bool WIDE_ = false, int SLOTS_ = 0, bool TMA_STORE_ = false, bool PAIRS_ = false,
          int STAGING_BUFS_ = 2>
struct BsrWgmmaConfig {
    static constexpr int BM = BM_, G = G_, BK = BK_, STAGES = STAGES_, WB = WB_;
    static constexpr int SLOTS = SLOTS_ > 0 ? SLOTS_ : WB * G;
    static constexpr bool A_REGS = A_REGS_, WIDE = WIDE_, PAIRS = PAIRS_;
    /// The epilogue stores each warpgroup's 64 x (G x BR) band through kStagingBufs 64 x 64
    /// staging buffers and the copy engine (the output's tensor map `map_c`), by the dense
    /// kernel's `wgmma_detail::store_chunk_tma`.
    static constexpr bool kTmaStore = TMA_STORE_;
    static constexpr int kStagingBufs = STAGING_BUFS_;
    static_assert(kStagingBufs == 1 || kStagingBufs == 2, "one or two staging buffers");
    static constexpr int kWarpgroups = BM / 64;
    /// The consumer warpgroups, then the producer warpgroup (ptxas budgets registers by whole
    /// warpgroups); `setmaxnreg` moves registers from the producer to the consumers.
    static constexpr int kConsumerThreads = kWarpgroups * 128;
    static constexpr int kThreads = kConsumerThreads + 128;
    static constexpr int kProducerRegs = 40;
    static constexpr int kConsumerRegs = 232;
    static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536,
                  "the register handover must fit the register file");
    static_assert(BM == 64 || BM == 128, "BM must be 64 or 128");
    static_assert(G >= 1 && WB >= 1 && G * WB <= 24, "the row mask of a step has 24 bits at most");
    /// Low bits of a step's info that hold its row mask (the block column is above them): 16,
    /// or G * WB for masks wider than 16 bits (block columns below 2^(31 - G * WB) then: 512
    /// for the 22 bits of eleven rows in windows of two).
    static constexpr int kMaskBits = G * WB > 16 ? G * WB : 16;
    static_assert(BK == 16 || BK == 32 || BK == 48 || BK == 64, "BK must be 16, 32, 48 or 64");
    static_assert(STAGES >= 2, "the ring needs a stage loading while one computes");
    static_assert(SLOTS >= 1 && SLOTS <= WB * G, "a step keeps at most WB * G blocks");
    static_assert(!PAIRS || WB == 2, "pairs are steps of two block columns");
};

#ifdef MLPC_BSR_WALK_CAP
/// The persistent walk's work-item table (`Param::Walk`, `mlpc_codegen::walk_table`), passed by
/// value: item[r * gridDim.x + b] is CTA b's item in round r (0xffff: none), for `rounds`
/// rounds; zero rounds, or a table that does not cover the grid's items, leaves the kernel's
/// own snake (`bsr_wgmma::work_item`). Generated only where `CodegenOptions::bsr_walk` asks.
struct BsrWalk {
    int rounds;
    unsigned short item[MLPC_BSR_WALK_CAP];
};
static_assert(sizeof(BsrWalk) == 4 + 2 * MLPC_BSR_WALK_CAP, "the layout of `Param::Walk`");
#endif

/// Run-time description of a grouped BSR GEMM: the dense GEMM parameters (`b` and `b_up` point at
/// the packed blocks; `ldb` is unused) and the step lists of the groups.
template <class T, int NEPI>
struct BsrWgmmaParams : GemmParams<T, NEPI> {
    /// `groups + 1` offsets into the step lists: group j's steps are grp_ptr[j] .. grp_ptr[j + 1].
    const int* grp_ptr;
    /// The groups in the order the CTAs take them (most steps first), and their count.
    const int* grp_order;
    int groups;
    /// Per step: `(block column << Cfg::kMaskBits) | mask`, bit w * G + g of the mask set when block row g of
    /// the group keeps block column `column + w` (w < WB: the step's window).
    const int* step_info;
    /// PAIRS: per step, its second block column (`step_info` has the first; the same column
    /// again for the last step of a group with an odd number of them). Unused otherwise.
    const MLPC_BSR_IDX* step_col1;
    /// Per step: the offset in `step_blk` of its first kept block.
    const MLPC_BSR_IDX* step_first;
    /// Packed index of each kept block, step by step, in increasing g within a step.
    const MLPC_BSR_IDX* step_blk;
#ifdef MLPC_BSR_WALK_CAP
    /// The launch's work-item table (the entry's by-value argument).
    const BsrWalk* walk;
#endif
};

namespace bsr_wgmma {

/// The swizzled K-major atom of SW 16-bit elements per row (SW = 64, 32 or 16).
template <int SW>
struct Atom {
    static_assert(SW == 64 || SW == 32 || SW == 16, "atoms are 128, 64 or 32 bytes wide");
    static constexpr int kRowBytes = 2 * SW;
    /// 16-byte chunks per row, and the right shift of the row index in the XOR.
    static constexpr int kChunks = SW / 8;
    static constexpr int kShift = SW == 64 ? 0 : (SW == 32 ? 1 : 2);
    /// Byte distance of 8-row groups, and the descriptor's layout type.
    static constexpr int kSbo = 8 * kRowBytes;
    static constexpr int kLayout = SW == 64 ? 1 : (SW == 32 ? 2 : 3);
};

/// The widest atom that divides a k slice of BK.
template <int BK>
struct SliceAtom {
    static constexpr int SW = BK % 64 == 0 ? 64 : (BK % 32 == 0 ? 32 : 16);
};

/// The low word of the descriptor of an operand starting at shared address `addr`: the start
/// address in 16-byte units (bits 0-13) and the leading byte offset. Shared addresses stay below
/// 256 KB, so adding `offset >> 4` to it gives the low word at `addr + offset` without a carry
/// out of the address field: a slice's descriptors are one 32-bit add each from its stage's.
__device__ __forceinline__ u32 desc_lo(u32 addr) {
    return ((addr & 0x3FFFFu) >> 4) | (1u << 16);
}

/// The descriptor of a K-major operand with the atom's swizzle whose low word is `lo` (the high
/// word, stride and swizzle mode, is a constant).
template <int SW>
__device__ __forceinline__ u64 desc_of(u32 lo) {
    typedef Atom<SW> A;
    return (u64)lo | ((u64)(A::kSbo >> 4) << 32) | ((u64)A::kLayout << 62);
}

/// The byte offset, inside a tile of ROWS rows x BK in atoms of SW elements, of where the k16
/// step j starts.
template <int ROWS, int BK, int SW = SliceAtom<BK>::SW>
__host__ __device__ constexpr u32 kstep_offset(int j) {
    return (u32)((16 * j / SW) * (ROWS * 2 * SW) + (16 * j % SW) * 2);
}

/// The work item CTA `b` of a persistent grid of `P` takes in its round `r`: the items of a
/// round in CTA order, then in reverse order the next round (a snake).
__host__ __device__ constexpr int work_item(int r, int b, int P) {
    return r * P + ((r & 1) ? P - 1 - b : b);
}

/// A_REGS: the shared address lane `lane` of warp `q` of consumer warpgroup `wg` gives
/// `ldmatrix.x4` for the k16 step j of a BM x BK A piece at `sa` (swizzled K-major atoms of SW
/// elements as above). Matrix i = lane / 8 is rows 8 (i % 2) .. + 7 of the warp's 16 rows and
/// k 8 (i / 2) .. + 7 of the step; lane 8i + r gives that matrix's row r. The four registers it
/// returns are then the warp's m16 x k16 A fragment as `mma.m16n8k16` lays it out, which is the
/// per-warp layout of the wgmma RS form's A operand.
template <int BM, int BK, int SW = SliceAtom<BK>::SW>
__device__ __forceinline__ u32 ldsm_a_addr(u32 sa, int wg, int q, int lane, int j) {
    typedef Atom<SW> A;
    const int i = lane >> 3;
    const int row = wg * 64 + q * 16 + (i & 1) * 8 + (lane & 7);
    const int chunk = (16 * j % SW) / 8 + (i >> 1);
    const int pos = chunk ^ ((row >> A::kShift) & (A::kChunks - 1));
    return sa + (u32)((16 * j / SW) * (BM * 2 * SW) + row * A::kRowBytes + pos * 16);
}

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/// Pins fragment registers at this point of the program (an in-flight wgmma may still read them).
template <int N>
__device__ __forceinline__ void fence_frag(u32 (&f)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(f[i][e])::"memory");
}

/// The groups' block rows of `GemmBsrWgmma`: group j's slot g is block row j G + g. A kernel
/// whose groups list their rows passes a type with kListed and `static int at(j G + g)`, the
/// first output column of group j's slot g (N for an empty slot, after the filled ones).
struct ConsecutiveRows {
    static constexpr bool kListed = false;
};

}  // namespace bsr_wgmma

/// The grouped Hopper BSR GEMM. `T` is `bf16` or `f16`; A is row-major [M, K]; `BR` x `BC` the
/// block (BR a wgmma N: 8, 16, 24, 32, 48, 64, 96, 128, 192 or 256; BC a multiple of BK); `Cfg` a
/// `BsrWgmmaConfig`; `Epi` a `SingleEpilogue` or `DualEpilogue`. `map_a` reads A in boxes of BM
/// rows x SW columns, `map_b` (`map_bu`) the packed blocks as a [kept * BR, BC] matrix in boxes of
/// BR rows x SW columns, both with the swizzle of SW-element rows (WIDE: the rearranged blocks
/// as a [kept * kWideRows, 64] matrix in boxes of one block's kWideRows rows). Launch with `kThreads`
/// threads, grid `(ceil(M / BM), ceil(block rows / G))` and `kSmemBytes` bytes of dynamic shared
/// memory; compile for sm_90a. `Rows`: which block rows each group computes, `ConsecutiveRows`
/// or a list chosen at compile time to share kept block columns (fewer steps; see `SlotCols`).
template <class T, int BR, int BC, class Cfg, class Epi, class Rows = bsr_wgmma::ConsecutiveRows>
struct GemmBsrWgmma {
    /// The groups' block rows are listed (`Rows::at`): the copy engine stores each block row in a
    /// box of its own (32-row blocks; other heights store from registers).
    static constexpr bool ROWS = Rows::kListed;
    static constexpr bool kDual = Epi::kDual;
    /// A plain GEMM whose epilogue chain starts with a bias starts its accumulators at the bias
    /// instead of zero, and its epilogue applies the rest of the chain: the bias costs no load,
    /// conversion and add per element in the epilogue (docs/perf-notes.md, block-sparse variant
    /// 33). With A from registers only: where A comes from shared memory (wgmmas in flight
    /// across slices), ptxas serialises every wgmma of a kernel that starts its accumulators so
    /// (C7514, seen for 8 x 16 blocks).
    static constexpr bool kBiasInit = BiasFirst<Epi>::kLead && Cfg::A_REGS;
    /// The epilogue after `init_acc`: without the bias where the accumulators start at it.
    using EpiAfterInit = typename PickType<kBiasInit, typename BiasFirst<Epi>::Rest, Epi>::type;
    static_assert(kBiasInit || SameType<EpiAfterInit, Epi>::value,
                  "accumulators that start at zero take the whole epilogue chain");
    /// A trailing ReLU runs on the packed pairs of the stores (`relu2`: one instruction a pair,
    /// not one an element; docs/perf-notes.md, block-sparse variant 34); `EpiInPlace` is the
    /// epilogue before it.
    static constexpr bool kPackedRelu = TrailingRelu<EpiAfterInit>::kRelu;
    using EpiInPlace =
        typename PickType<kPackedRelu, typename TrailingRelu<EpiAfterInit>::Rest, EpiAfterInit>::type;
    /// The packed output pair of two accumulators, and one output value, after the packed ReLU.
    __device__ __forceinline__ static u32 out_pair(float lo, float hi) {
        const u32 w = pack2<T>(lo, hi);
        return kPackedRelu ? relu2<T>(w) : w;
    }
    __device__ __forceinline__ static T out_value(float v) {
        return from_f32<T>(kPackedRelu ? fmaxf(v, 0.0f) : v);
    }
    static constexpr int BM = Cfg::BM, G = Cfg::G, BK = Cfg::BK, STAGES = Cfg::STAGES;
    static constexpr int kThreads = Cfg::kThreads;
    static constexpr int kConsumerThreads = Cfg::kConsumerThreads;
    static constexpr int kGroup = G;
    /// Block columns per slice (a window of WB whole blocks), the k depth of a block's piece of a
    /// slice, and k slices per block (1 in a window).
    static constexpr int WB = Cfg::WB;
    static constexpr int BKB = BK / WB;
    static constexpr int kKSub = BC / BKB;
    /// The swizzle atoms of the A piece and of a block's piece, and their columns per slice (one
    /// copy each). PAIRS: A in atoms of a block's width, one per column of the pair.
    static constexpr bool PAIRS = Cfg::PAIRS;
    static constexpr int SW =
        PAIRS ? bsr_wgmma::SliceAtom<BK / WB>::SW : bsr_wgmma::SliceAtom<BK>::SW;
    static constexpr int SWB = bsr_wgmma::SliceAtom<BKB>::SW;
    static constexpr int kAtoms = BK / SW;
    static constexpr int kAtomsB = BKB / SWB;
    /// WIDE: a block's box rows of 128 bytes.
    static constexpr int kWideRows = BR * BC * 2 / 128;
    /// The row mask's bits of a step's info.
    static constexpr u32 kMaskLow = (1u << Cfg::kMaskBits) - 1u;
    /// Producer warps filling the ring, slice s by warp s % kProducerWarps (a stage is then
    /// filled by the warps in turn, each after its `empty` wait for the slice a lap before). At
    /// most STAGES: a warp whose slices were more than a lap apart could pass its parity wait on
    /// a stage a lap early (the CPU model in crates/mlpc-codegen/tests/bsr_schedule.rs shows
    /// both, for divisors of STAGES and others). Four from 4 stages: one warp alone issues the
    /// copies too slowly (docs/perf-notes.md, block-sparse variant 7).
    static constexpr int kProducerWarps = STAGES >= 4 ? 4 : (STAGES % 2 == 0 ? 2 : 1);
    static_assert(kProducerWarps <= STAGES, "a producer warp's slices at most a lap apart");
    /// wgmma groups (slices) a consumer keeps in flight before it waits: their stages stay held,
    /// the producer fills the other STAGES - kInFlight - 1.
    static constexpr int kInFlight = STAGES >= 6 ? 2 : 1;
    static constexpr int kTileABytes = BM * BK * 2;
    /// Slot j holds the step's j-th kept block (in mask-bit order).
    static constexpr int kSlotBytes = BR * BKB * 2;
    static constexpr int kSlotsBytes = Cfg::SLOTS * kSlotBytes;
    /// A stage: A's tile and the slots, padded to whole 1024-byte swizzle periods so that every
    /// stage starts on one (the slots fill whole periods where the group has rows enough: slots
    /// of 768 bytes, 24 x 16 blocks, come in fours, but a group of two rows has two at most).
    static constexpr int kStageBytes = (kTileABytes + kSlotsBytes * (kDual ? 2 : 1) + 1023) / 1024 * 1024;
    /// With TMA stores, the staging buffers of every consumer warpgroup after the ring.
    static constexpr int kWarpgroupStagingBytes =
        Cfg::kStagingBufs * wgmma_detail::kStagingBufferBytes;
    static constexpr int kStagingBytes =
        Cfg::kTmaStore ? Cfg::kWarpgroups * kWarpgroupStagingBytes : 0;
    /// The ring, the staging buffers, 1024 bytes to align the ring's base to the widest swizzle
    /// pattern, the barriers and a word per stage for the row mask of the slice in it.
    static constexpr int kSmemBytes =
        STAGES * kStageBytes + kStagingBytes + 1024 + 2 * STAGES * 8 + STAGES * 4;
    /// Accumulator registers per thread and block row.
    static constexpr int kAcc = BR / 2;
    static_assert(BK % WB == 0 && BC % BKB == 0 && (WB == 1 || BKB == BC),
                  "a block is whole k slices, or a slice whole blocks");
    static_assert(BR % 8 == 0 && BR >= 8 && BR <= 256, "BR must be a wgmma N");
    static_assert(!Cfg::A_REGS || BR == 16 || BR == 32 || BR == 64,
                  "A from registers: block heights 16, 32 and 64 (wgmma_detail::MmaRs)");
    static_assert(G * kAcc * (kDual ? 2 : 1) <= (kDual ? 160 : 192),
                  "the accumulators must fit the registers");
    static_assert(kTileABytes % 1024 == 0, "the slots start on a swizzle period");
    static_assert(kSlotBytes % (8 * 2 * SWB) == 0, "every slot starts on a swizzle period");
    static_assert(kStageBytes % 1024 == 0, "every stage starts on a swizzle period");
    static_assert(!PAIRS || (SW == BKB && BKB == BC), "pairs: one A atom column per block column");
    static_assert(!ROWS || !Cfg::kTmaStore || BR == 32,
                  "listed block rows are stored by the copy engine in boxes of 32 columns");
    static_assert(!Cfg::kTmaStore || ROWS || (G * BR >= 64 && ((G * BR) % 64 == 0 || 64 % BR == 0)),
                  "TMA stores take whole 64-column chunks of the group's columns, whole block "
                  "rows past them from registers");
    static_assert(!Cfg::WIDE || (BKB == BC && kSlotBytes % 1024 == 0 && kWideRows <= 256),
                  "wide copies: whole blocks of whole 128B swizzle periods, at most 256 box rows");

    /// Calls `mma(g, ja, b_lo)` for every block of the slice in stage `sa` that mask bit
    /// w * G + g keeps (block row g, window column w) and every k16 step j of its piece: `ja`
    /// is the slice's k16 step (w * BKB / 16 + j), `b_lo` the low word of the block's
    /// descriptor at step j (`bsr_wgmma::desc_of<SWB>`). The loops unroll fully, so `g` and
    /// `ja` are constants in each call; the kept blocks take the slots in turn, so each block's
    /// `b_lo` is one add to the previous one's (a descriptor built per block from its address
    /// was a chain of five dependent uniform-datapath instructions before every kept block's
    /// wgmmas, the largest share of the consumers' stall samples: docs/perf-notes.md,
    /// block-sparse variant 10).
    template <class F>
    __device__ __forceinline__ static void each_kept_step(u32 mask, u32 sa, F&& mma) {
        using bsr_wgmma::kstep_offset;
        constexpr int KJB = BKB / 16;
        u32 slot_lo = bsr_wgmma::desc_lo(sa + kTileABytes);
#pragma unroll
        for (int w = 0; w < WB; ++w)
#pragma unroll
            for (int g = 0; g < G; ++g) {
                if (((mask >> (w * G + g)) & 1u) == 0) continue;
#pragma unroll
                for (int j = 0; j < KJB; ++j) {
                    mma(g, w * KJB + j, slot_lo + (kstep_offset<BR, BKB>(j) >> 4));
                }
                slot_lo += kSlotBytes >> 4;
            }
    }

    /// The consumers over one tile's `slices` slices, the ring at `stage` / `phase` (advanced
    /// past them). Per slice: wait on `full`, read the slice's row mask from the stage's mask
    /// word (written by the producer before its arrival), then
    /// - A_REGS: load the warp's A fragments of the slice's BK / 16 k16 steps (`ldmatrix`), for
    ///   each kept row the wgmmas reading A from those registers, commit, wait until they are
    ///   done and release the stage. No wgmma stays in flight across slices: a wgmma reads its A
    ///   registers until it completes, and ptxas serialises every wgmma of a kernel in which
    ///   another instruction may write such registers while one is in flight (C7513). A form
    ///   with two fragment sets in turn compiles unserialised but measured 16-21 % slower
    ///   (docs/perf-notes.md, block-sparse variant 9, with the other attempts at overlapping
    ///   a slice's fixed cost).
    /// - otherwise: the wgmmas of the kept rows reading A through its descriptor, commit, wait
    ///   until the slice kInFlight before is done and release its stage; at the end of the tile,
    ///   wait for every wgmma and release the stages still held.
    template <class Acc, class AccUp>
    __device__ __forceinline__ static void consume(u32 ring, u32 full, u32 empty, u32 masks,
                                                   int slices, int tid, Acc& acc, AccUp& acc_up,
                                                   int& stage, u32& phase) {
        using namespace wgmma_detail;
        using bsr_wgmma::kstep_offset;
        // k16 steps of a slice.
        constexpr int KJ = BK / 16;
        const int wg = tid >> 7, q = (tid >> 5) & 3, lane = tid & 31;
        auto pin = [&]() {
#pragma unroll
            for (int g = 0; g < G; ++g) {
                fence_regs(acc[g]);
                if constexpr (kDual) fence_regs(acc_up[g]);
            }
        };
        // The thread's `ldmatrix` addresses relative to a stage, once per tile: opaque to the
        // compiler, which otherwise recomputes them from `tid` in every slice.
        u32 a_off[KJ];
#pragma unroll
        for (int j = 0; j < KJ; ++j) {
            a_off[j] = bsr_wgmma::ldsm_a_addr<BM, BK, SW>(0, wg, q, lane, j);
            asm volatile("" : "+r"(a_off[j]));
        }
        for (int kt = 0; kt < slices; ++kt) {
            mbar_wait(full + 8 * stage, phase);
            // The wait's spin loop may leave the warp diverged as far as ptxas knows; the wgmmas
            // below sit behind branches on the (uniform) row mask, which ptxas serialises unless
            // the warp is converged first.
            __syncwarp();
            const u32 mask = ld_shared_u32(masks + 4 * stage);
            const u32 sa = ring + stage * kStageBytes;
            if constexpr (Cfg::A_REGS) {
                u32 f[KJ][4];
#pragma unroll
                for (int j = 0; j < KJ; ++j) {
                    bsr_wgmma::ldsm_x4(f[j], sa + a_off[j]);
                }
                pin();
                fence();
                each_kept_step(mask, sa, [&](int g, int ja, u32 b_lo) {
                    wgmma_detail::MmaRs<T, BR>::run(acc[g], f[ja], bsr_wgmma::desc_of<SWB>(b_lo));
                    if constexpr (kDual) {
                        wgmma_detail::MmaRs<T, BR>::run(
                            acc_up[g], f[ja], bsr_wgmma::desc_of<SWB>(b_lo + (kSlotsBytes >> 4)));
                    }
                });
                commit();
                pin();
                wait<0>();
                pin();
                bsr_wgmma::fence_frag(f);
                mbar_arrive(empty + 8 * stage);
            } else {
                const u32 da_lo = bsr_wgmma::desc_lo(sa + wg * (64 * 2 * SW));
                pin();
                fence();
                each_kept_step(mask, sa, [&](int g, int ja, u32 b_lo) {
                    // Descriptor start addresses are in units of 16 bytes.
                    const u64 a_j = bsr_wgmma::desc_of<SW>(da_lo + (kstep_offset<BM, BK, SW>(ja) >> 4));
                    wgmma_detail::Mma<T, BR>::run(acc[g], a_j, bsr_wgmma::desc_of<SWB>(b_lo));
                    if constexpr (kDual) {
                        wgmma_detail::Mma<T, BR>::run(acc_up[g], a_j,
                                                   bsr_wgmma::desc_of<SWB>(b_lo + (kSlotsBytes >> 4)));
                    }
                });
                commit();
                pin();
                // Slice kt - kInFlight's wgmmas are complete: its stage may be refilled.
                wait<kInFlight>();
                pin();
                if (kt >= kInFlight) {
                    const int done = stage >= kInFlight ? stage - kInFlight : stage + STAGES - kInFlight;
                    mbar_arrive(empty + 8 * done);
                }
            }
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        if constexpr (!Cfg::A_REGS) {
            wait<0>();
            pin();
            // The tile's last min(slices, kInFlight) stages, oldest first: the next tile refills
            // them.
            for (int i = slices < kInFlight ? slices : kInFlight; i > 0; --i) {
                const int held = stage >= i ? stage - i : stage + STAGES - i;
                mbar_arrive(empty + 8 * held);
            }
        }
    }

    /// The output columns of a tile's slots: slot g's first column is n0 + g BR for
    /// consecutive block rows, `Rows::at(group G + g)` for listed ones (N for an empty slot,
    /// after the filled ones).
    struct SlotCols {
        int group;
        i64 n0;
        __device__ __forceinline__ i64 operator()(int g) const {
            if constexpr (ROWS) {
                return Rows::at(group * G + g);
            } else {
                return n0 + g * BR;
            }
        }
        /// Whether every slot lies inside N.
        __device__ __forceinline__ bool inside(i64 n) const {
            if constexpr (ROWS) {
                return Rows::at(group * G + G - 1) < n;
            } else {
                return n0 + G * BR <= n;
            }
        }
    };

    /// The accumulators' initial values for the tile of `group` (its consecutive form at columns
    /// from `n0`): the bias where `kBiasInit` (its element of the accumulator's column, the
    /// layout of `store`; columns past N zero), else zero.
    template <class P, class Acc, class AccUp>
    __device__ __forceinline__ static void init_acc(const P& p, int group, i64 n0, int tid,
                                                    Acc& acc, AccUp& acc_up) {
        if constexpr (kBiasInit) {
            const SlotCols cols{group, n0};
            const auto& bias = p.epi[BiasFirst<Epi>::kIndex];
            const int t = tid & 3;
            if (cols.inside(p.n) && bias.col_stride == 1 && is_aligned(bias.ptr, 4)) {
                // The group's columns inside N, the bias contiguous: one 4-byte load a column
                // pair, widened on the integer pipe (`widen_pair`).
                const u32* w = reinterpret_cast<const u32*>(bias.ptr + n0) + t;
#pragma unroll
                for (int g = 0; g < G; ++g)
#pragma unroll
                    for (int i = 0; i < BR / 8; ++i) {
                        // Rows lane / 4 and lane / 4 + 8: the same columns, each row half's
                        // registers widened from the word on their own. (ptxas merges the two
                        // widenings all the same and adds 88 register copies a tile over the
                        // form that widens once and copies: docs/perf-notes.md, block-sparse
                        // variant 33. This is the form checked and timed on the GPU.)
                        const u32 v =
                            ROWS ? __ldg(reinterpret_cast<const u32*>(
                                             bias.ptr + cols(g)) +
                                         t + i * 4)
                                 : __ldg(w + (g * BR + i * 8) / 2);
                        widen_pair<T>(v, acc[g][4 * i], acc[g][4 * i + 1]);
                        widen_pair<T>(v, acc[g][4 * i + 2], acc[g][4 * i + 3]);
                    }
                return;
            }
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int i = 0; i < BR / 8; ++i)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const i64 col = cols(g) + i * 8 + 2 * t + e;
                        const float b = col < p.n ? load_f32(bias.ptr, col * bias.col_stride) : 0.0f;
                        // Rows lane / 4 and lane / 4 + 8 (h = 0, 1): the same column.
                        acc[g][4 * i + e] = b;
                        acc[g][4 * i + 2 + e] = b;
                    }
        } else {
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int i = 0; i < kAcc; ++i) {
                    acc[g][i] = 0.0f;
                    if constexpr (kDual) acc_up[g][i] = 0.0f;
                }
        }
    }

    /// Epilogue of one tile: acc[g][4i + 2h + e] is C[16q + lane / 4 + 8h][cols(g) + 8i + 2t
    /// + e] of the warpgroup's 64 rows (from m0 + 64 wg) and the slot's block row of `group`
    /// (consecutively from n0 without ROWS); columns past N (a last group with fewer than G
    /// block rows) are not written.
    template <class P, class Acc, class AccUp>
    __device__ __forceinline__ static void store(const P& p, i64 m0, int group, i64 n0, int tid,
                                                 Acc& acc, AccUp& acc_up, const TensorMap& map_c,
                                                 u32 staging, u32& chunk) {
        const SlotCols cols{group, n0};
        const int wg = tid >> 7;
        const int lane = tid & 31;
        const int q = (tid >> 5) & 3;
        const bool pair_ok = is_aligned(p.c, 4) && (p.ldc % 2 == 0);
        // Two passes (see wgmma_detail::store_tile): the epilogue of every element in place, then
        // the stores, so that no operand load waits behind a store.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const i64 row = m0 + wg * 64 + q * 16 + (lane >> 2) + h * 8;
            if (row >= p.m) continue;
#pragma unroll
            for (int g = 0; g < G; ++g) {
                if (cols(g) >= p.n) break;
#pragma unroll
                for (int i = 0; i < BR / 8; ++i) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const i64 col = cols(g) + i * 8 + (lane & 3) * 2 + e;
                        const int r = 4 * i + 2 * h + e;
                        const float up = kDual ? acc_up[kDual ? g : 0][kDual ? r : 0] : 0.0f;
                        acc[g][r] = EpiInPlace::apply(acc[g][r], up, row, col, p);
                    }
                }
            }
        }
        // Block rows from kRegRow0 on are stored from registers: all of them without TMA
        // stores, else those past the group's whole 64-column chunks (eleven 32-row blocks: the
        // last one).
        if constexpr (ROWS && Cfg::kTmaStore) {
            store_tma_listed(m0 + wg * 64, tid & 127, p.n, acc, map_c,
                             staging + wg * kWarpgroupStagingBytes, 3 + wg, chunk, cols);
            return;
        }
        constexpr int kRegRow0 = Cfg::kTmaStore ? G * BR / 64 * 64 / BR : 0;
        if constexpr (Cfg::kTmaStore) {
            store_tma(m0 + wg * 64, n0, tid & 127, p.n, acc, map_c,
                      staging + wg * kWarpgroupStagingBytes, 3 + wg, chunk);
            if constexpr (kRegRow0 == G) return;
        }
        if constexpr (BR % 16 == 0) {
            // A tile wholly inside the output with 8-byte aligned rows: whole sectors.
            if (m0 + BM <= p.m && cols.inside(p.n) && is_aligned(p.c, 8) &&
                p.ldc % 4 == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const i64 row = m0 + wg * 64 + q * 16 + (lane >> 2) + h * 8;
                    T* out_row = p.c + row * p.ldc;
#pragma unroll
                    for (int g = kRegRow0; g < G; ++g) {
#pragma unroll
                        for (int i = 0; i < BR / 8; i += 2) {
                            const int r = 4 * i + 2 * h;
                            wgmma_detail::store_sector<T>(
                                out_row + cols(g) + i * 8,
                                out_pair(acc[g][r], acc[g][r + 1]),
                                out_pair(acc[g][r + 4], acc[g][r + 5]));
                        }
                    }
                }
                return;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const i64 row = m0 + wg * 64 + q * 16 + (lane >> 2) + h * 8;
            if (row >= p.m) continue;
            T* out_row = p.c + row * p.ldc;
#pragma unroll
            for (int g = kRegRow0; g < G; ++g) {
                if (cols(g) >= p.n) break;
#pragma unroll
                for (int i = 0; i < BR / 8; ++i) {
                    // BR is a multiple of 8: both columns of the pair lie in the block row.
                    const i64 col = cols(g) + i * 8 + (lane & 3) * 2;
                    const int r = 4 * i + 2 * h;
                    if (pair_ok) {
                        *reinterpret_cast<u32*>(out_row + col) = out_pair(acc[g][r], acc[g][r + 1]);
                    } else {
                        out_row[col] = out_value(acc[g][r]);
                        out_row[col + 1] = out_value(acc[g][r + 1]);
                    }
                }
            }
        }
    }

    /// The stores of `store` by the copy engine, for the warpgroup's 64-row band from `row0`
    /// (`wtid` its thread): each whole 64-column chunk of the group's columns (the block rows past
    /// them: `store`, from registers) by
    /// `wgmma_detail::store_chunk_tma` (its comment has the buffer protocol; `staging`, `bar`
    /// and `chunk` are its). Column group cg of the band (8 columns) is group
    /// i = cg % (BR / 8) of block row g = cg / (BR / 8): its pair of row half h is
    /// acc[g][4 i + 2 h], acc[g][4 i + 2 h + 1].
    template <class Acc>
    __device__ __forceinline__ static void store_tma(i64 row0, i64 n0, int wtid, i64 n,
                                                     const Acc& acc, const TensorMap& map_c,
                                                     u32 staging, int bar, u32& chunk) {
        constexpr int kGroupsPerBlock = BR / 8;
#pragma unroll
        for (int c = 0; c < G * BR / 64; ++c) {
            if (n0 + 64 * c >= n) break;
            wgmma_detail::store_chunk_tma<Cfg::kStagingBufs>(
                map_c, row0, n0 + 64 * c, wtid, staging, bar, chunk, [&](int i, int h) {
                    const int cg = 8 * c + i;
                    const int g = cg / kGroupsPerBlock;
                    const int r = 4 * (cg % kGroupsPerBlock) + 2 * h;
                    return out_pair(acc[g][r], acc[g][r + 1]);
                });
        }
    }

    /// The stores of `store` by the copy engine for listed block rows (BR = 32), for the
    /// warpgroup's 64-row band from `row0` (`wtid` its thread): two slots a round through one
    /// staging buffer, each slot's 64 x 32 piece in a half of it (64-byte rows, the 64B swizzle:
    /// chunk c of row r at chunk c ^ (r / 2 % 4)), each half stored by one box of `map_c` (64 rows
    /// x 32 columns) at its slot's columns; an empty slot is staged and not stored. The buffer
    /// protocol is `wgmma_detail::store_chunk_tma`'s. Column group i of a slot (8 columns) of row
    /// half h is acc[g][4 i + 2 h], acc[g][4 i + 2 h + 1].
    template <class Acc>
    __device__ __forceinline__ static void store_tma_listed(i64 row0, int wtid, i64 n,
                                                            const Acc& acc,
                                                            const TensorMap& map_c, u32 staging,
                                                            int bar, u32& chunk,
                                                            const SlotCols& cols) {
        using namespace wgmma_detail;
        constexpr int kHalfBytes = 64 * 32 * 2;
        static_assert(2 * kHalfBytes <= kStagingBufferBytes, "two slots a staging buffer");
        const int lane = wtid & 31;
        const int q = wtid >> 5;
        // Lane l addresses row r of matrix j = l / 8 (row half j % 2, column group i + j / 2).
        const int j = lane >> 3;
        const int r = 16 * q + 8 * (j & 1) + (lane & 7);
        const u32 row_addr = (u32)(r * 64);
        const int swz = (r >> 1) & 3;
        auto pair = [&](int g, int i, int h) {
            return out_pair(acc[g][4 * i + 2 * h], acc[g][4 * i + 2 * h + 1]);
        };
#pragma unroll
        for (int g0 = 0; g0 < G; g0 += 2) {
            if (cols(g0) >= n) break;
            const u32 buf =
                staging + (Cfg::kStagingBufs == 2 ? (chunk & 1u) * kStagingBufferBytes : 0u);
            if (wtid == 0) bulk_wait_read<Cfg::kStagingBufs - 1>();
            named_sync<128>(bar);
#pragma unroll
            for (int k = 0; k < 2 && g0 + k < G; ++k) {
                const int g = g0 + k;
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    const u32 addr =
                        buf + k * kHalfBytes + row_addr + (u32)(((i + (j >> 1)) ^ swz) << 4);
                    stmatrix_x4(addr, pair(g, i, 0), pair(g, i, 1), pair(g, i + 1, 0),
                                pair(g, i + 1, 1));
                }
            }
            fence_proxy_async();
            named_sync<128>(bar);
            if (wtid == 0) {
                tma_store_2d(map_c, (int)cols(g0), (int)row0, buf);
                if (g0 + 1 < G && cols(g0 + 1) < n) {
                    tma_store_2d(map_c, (int)cols(g0 + 1), (int)row0, buf + kHalfBytes);
                }
                bulk_commit();
            }
            ++chunk;
        }
    }

    /// Calls `body(t)` for each tile of the CTA in turn (`item_at(r)` is its work item in round
    /// r, at least `tiles` once it has none; `tile_at(w)` is work item w, for w < `tiles`), the
    /// next tile's place read before the body runs, so that its list loads wait behind the
    /// current tile rather than before the next.
    template <class ItemAt, class TileAt, class F>
    __device__ __forceinline__ static void for_each_tile(ItemAt&& item_at, int tiles,
                                                         TileAt&& tile_at, F&& body) {
        int w = item_at(0);
        auto t = tile_at(w);
        for (int r = 0; w < tiles; ++r) {
            w = item_at(r + 1);
            const auto next = tile_at(w);
            body(t);
            t = next;
        }
    }

    template <class P>
    __device__ __forceinline__ static void run(const P& p, const TensorMap& map_a,
                                               const TensorMap& map_b, const TensorMap& map_bu,
                                               const TensorMap& map_c) {
        using namespace wgmma_detail;
        extern __shared__ __align__(1024) unsigned char mlpc_smem[];
        const u32 ring = (smem_addr(mlpc_smem) + 1023u) & ~1023u;
        const u32 staging = ring + STAGES * kStageBytes;
        const u32 full = staging + kStagingBytes;
        const u32 empty = full + STAGES * 8;
        const u32 masks = empty + STAGES * 8;

        const int tid = (int)threadIdx.x;
        const int m_tiles = (int)((p.m + BM - 1) / BM);
        const int tiles = m_tiles * p.groups;
        const int cta = (int)blockIdx.x, ctas = (int)gridDim.x;
        // Work item w: its group and first row, and the group's steps.
        struct Tile {
            int m0, group, s0, steps;
        };
        auto tile_at = [&](int w) {
            Tile t;
            t.group = p.grp_order[w % p.groups];
            t.m0 = (w / p.groups) * BM;
            t.s0 = p.grp_ptr[t.group];
            t.steps = p.grp_ptr[t.group + 1] - t.s0;
            return t;
        };
        auto tile_or_none = [&](int w) { return w < tiles ? tile_at(w) : Tile{0, 0, 0, 0}; };
        // The CTA's work item in round r: the snake, or the launch's table where it has one
        // that covers the grid's items.
        auto item_at = [&](int r) {
#ifdef MLPC_BSR_WALK_CAP
            const int rounds = p.walk->rounds;
            if (rounds > 0 && rounds * ctas <= MLPC_BSR_WALK_CAP && rounds * ctas >= tiles) {
                const int w = r < rounds ? (int)p.walk->item[r * ctas + cta] : 0xffff;
                return w == 0xffff ? tiles : w;
            }
#endif
            return bsr_wgmma::work_item(r, cta, ctas);
        };

        if (tid == kConsumerThreads) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(full + 8 * s, 1);
                mbar_init(empty + 8 * s, kConsumerThreads);
            }
            mbar_fence_init();
        }
        __syncthreads();

        if (tid >= kConsumerThreads) {
            // The producer: each of its kProducerWarps warps fills every kProducerWarps-th slice
            // of the CTA's sequence (slice numbers run on across its tiles, so that one warp
            // always fills the same stages, in order) and walks only those: per slice, the wait
            // for the stage's `empty` barrier, then from lane 0 the step's row mask into the
            // stage's mask word, the bytes of the A piece and of the kept blocks on its `full`
            // barrier, and their copies. One warp alone could not issue them as fast as the
            // consumers compute. A warp reads the step lists of its next two slices ahead (info
            // and first block two slices ahead, the block indices one: lane j holds the j-th kept
            // block of a step), and the next tile's place while it fills the current one, so
            // that no list read waits between two of its slices.
            setmaxnreg_dec<Cfg::kProducerRegs>();
            const int pw = (tid - kConsumerThreads) >> 5;
            if (pw >= kProducerWarps) return;
            const int lane = tid & 31;
            if (tid == kConsumerThreads) {
                tma_prefetch_map(map_a);
                tma_prefetch_map(map_b);
                if constexpr (kDual) tma_prefetch_map(map_bu);
            }
            // Slices of the CTA's earlier tiles.
            int before = 0;
            for_each_tile(item_at, tiles, tile_or_none, [&](const Tile& t) {
                const int s0 = t.s0, m0 = t.m0;
                const int slices = t.steps * kKSub;
                auto info_at = [&](int sl) {
                    return sl < slices ? (u32)p.step_info[s0 + sl / kKSub] : 0u;
                };
                auto first_at = [&](int sl) { return sl < slices ? p.step_first[s0 + sl / kKSub] : 0; };
                // PAIRS: the step's second block column (kKSub is 1).
                auto col1_at = [&](int sl) { return PAIRS && sl < slices ? p.step_col1[s0 + sl] : 0; };
                auto blk_of = [&](u32 info, int first) {
                    return lane < __popc(info & kMaskLow) ? p.step_blk[first + lane] : 0;
                };
                // The warp's first slice of this tile.
                int sl = ((pw - before) % kProducerWarps + kProducerWarps) % kProducerWarps;
                u32 info = info_at(sl);
                int blk = blk_of(info, first_at(sl));
                int col1 = col1_at(sl);
                u32 info1 = info_at(sl + kProducerWarps);
                int first1 = first_at(sl + kProducerWarps);
                int col1_1 = col1_at(sl + kProducerWarps);
                for (; sl < slices; sl += kProducerWarps) {
                    const int blk1 = blk_of(info1, first1);
                    const u32 info2 = info_at(sl + 2 * kProducerWarps);
                    const int first2 = first_at(sl + 2 * kProducerWarps);
                    const int col1_2 = col1_at(sl + 2 * kProducerWarps);
                    const u32 mask = info & kMaskLow;
                    const int ks = sl % kKSub;
                    const int col = (int)(info >> Cfg::kMaskBits) * BC;
                    const int stage = (before + sl) % STAGES;
                    const u32 phase = (u32)((before + sl) / STAGES) & 1u;
                    mbar_wait(empty + 8 * stage, phase ^ 1);
                    const u32 bar = full + 8 * stage;
                    const u32 sa = ring + stage * kStageBytes;
                    if (lane == 0) {
                        // Released with the arrival below; the consumers read it after `full`.
                        st_shared_u32(masks + 4 * stage, mask);
                        mbar_arrive_expect_tx(
                            bar, kTileABytes + __popc(mask) * kSlotBytes * (kDual ? 2 : 1));
#pragma unroll
                        for (int a = 0; a < kAtoms; ++a) {
                            // PAIRS: atom column a is block column a of the pair.
                            const int x = PAIRS ? (a == 0 ? col : col1 * BC) : col + ks * BKB + a * SW;
                            tma_load_2d(sa + a * (BM * 2 * SW), map_a, x, m0, bar);
                        }
                    }
                    int j = 0;
                    for (u32 rest = mask; rest != 0u; rest &= rest - 1u, ++j) {
                        // The j-th kept block (mask bit w * G + g: block row g, window column
                        // w) into slot j.
                        const int b = __shfl_sync(0xffffffffu, blk, j);
                        if (lane != 0) continue;
                        const u32 slot = sa + kTileABytes + j * kSlotBytes;
                        if constexpr (Cfg::WIDE) {
                            // The whole block: box rows b * kWideRows .. of the rearranged copy.
                            tma_load_2d(slot, map_b, 0, b * kWideRows, bar);
                            if constexpr (kDual) {
                                tma_load_2d(slot + kSlotsBytes, map_bu, 0, b * kWideRows, bar);
                            }
                        } else {
#pragma unroll
                            for (int a = 0; a < kAtomsB; ++a) {
                                const int x = ks * BKB + a * SWB;
                                tma_load_2d(slot + a * (BR * 2 * SWB), map_b, x, b * BR, bar);
                                if constexpr (kDual) {
                                    tma_load_2d(slot + kSlotsBytes + a * (BR * 2 * SWB), map_bu,
                                                x, b * BR, bar);
                                }
                            }
                        }
                    }
                    info = info1;
                    blk = blk1;
                    col1 = col1_1;
                    info1 = info2;
                    first1 = first2;
                    col1_1 = col1_2;
                }
                before += slices;
            });
            return;
        }

        setmaxnreg_inc<Cfg::kConsumerRegs>();
        float acc[G][kAcc];
        float acc_up[kDual ? G : 1][kDual ? kAcc : 1];
        int stage = 0;
        u32 phase = 0;
        u32 chunk = 0;
        for_each_tile(item_at, tiles, tile_or_none, [&](const Tile& t) {
            // n0: the columns of a group of consecutive block rows (computed at each use, as a
            // value kept across the k loop moved ptxas's allocation of it).
            init_acc(p, t.group, (i64)t.group * (G * BR), tid, acc, acc_up);
            const int slices = t.steps * kKSub;
            consume(ring, full, empty, masks, slices, tid, acc, acc_up, stage, phase);
            store(p, (i64)t.m0, t.group, (i64)t.group * (G * BR), tid, acc, acc_up, map_c, staging,
                  chunk);
        });
        // The copy engine may still read the staging buffers and write the output.
        if constexpr (Cfg::kTmaStore) {
            if ((tid & 127) == 0) bulk_wait_all();
        }
    }
};

}  // namespace mlpc
