#!/usr/bin/env bash
# `ncu` reports of the kernels behind the open performance gaps (docs/perf-notes.md), in one call
# on a CUDA machine with Nsight Compute, from the repository root after `scripts/gpu/build.sh`
# (binary carried over). Each profile replays one launch of the named kernels with every section
# (`--set full`: speed of light, memory workload, occupancy, scheduler and warp-state statistics,
# and the source counters' top stall locations), clocks unlocked as in the benchmarks. Reports go
# to $OUT (default /tmp/mlpc-profile) as text, one file per profile with the warp-stall
# breakdown at its end, and the warm-up runs' output in bench.txt.
#
#   scripts/gpu/profile.sh [decode16|bsr|f32|shallow|dual ...]      (default: the first four)
#
#   decode16  llama-swiglu at T = 16: the dual gate/up and the down projection small-M entries
#             (1.22-1.25x eager against the 1.25x goal: are the warps waiting on the activation
#             loads, the weight loads or the mma chain?)
#   bsr       the 4096^2 block-sparse GEMM at T = 4096, density 0.5 and 0.1 (1.18x / 2.31x dense
#             against 1.7x / 6x: where do the consumers spend a slice? perf-notes variant 10)
#   f32       gpt2-mlp in f32 at T = 8192, its up-projection (SIMT GEMM at 0.75x eager: issue
#             slots, shared-memory wavefronts or latency?)
#   shallow   gpt2-mlp in bf16 at T = 8192, its up-projection (K = 768, N = 3072: 1.06x cuBLAS
#             since the whole-sector stores)
#   dual      llama-swiglu at T = 4096, its dual gate/up GEMM (128 x 64 ping-pong tiles; the
#             model is 1.08x eager against the 1.11x goal: perf-notes "Next steps" item 6)
#
# decode16, bsr (at d = 0.5 and 0.1), f32 and dual also write the profiled kernels' SASS with per-instruction
# warp-stall samples (the report's source page), the hottest instructions first, to
# NAME-source.txt (decode16-source.txt, bsr-0.5-source.txt, bsr-0.1-source.txt, f32-source.txt).
#
# About 20-40 s per kernel on an H200 (the full set replays each launch some 40 times).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/mlpc-profile}
MLPC=${MLPC:-target/release/mlpc}
export MLPC_CACHE_DIR=${MLPC_CACHE_DIR:-/tmp/mlpc-cache}
mkdir -p "$OUT"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(decode16 bsr f32 shallow)
models=$(mktemp -d)

if ! command -v ncu >/dev/null; then
    echo "ncu (Nsight Compute) not found on PATH" >&2
    exit 1
fi

# The model files the profiles need besides examples/: the examples in f32, and a single
# bias-free 4096 x 4096 linear pruned to a density of 32 x 32 blocks (as bench.py's rows).
python3 - "$models" <<'EOF'
import json, sys
out = sys.argv[1]
m = json.load(open("examples/gpt2-mlp/model.json"))
m["dtype"] = "f32"
json.dump(m, open(f"{out}/gpt2-mlp-f32.json", "w"))
for d in (0.5, 0.1):
    json.dump({"mlpc": 1, "name": f"bsr-{d}", "dtype": "bf16", "seed": 0,
               "inputs": {"x": {"shape": ["T", 4096]}},
               "layers": [{"op": "linear", "name": "fc", "in": 4096, "out": 4096, "bias": False}],
               "sparsity": {"fc.weight": {"block": [32, 32], "density": d}}},
              open(f"{out}/bsr-{d}.json", "w"))
EOF

# profile NAME MODEL T KERNEL-REGEX COUNT: after a warm-up run of the model (its kernels compiled
# and cached), one `ncu` run over `mlpc bench` with kernel-by-kernel launches, skipping the
# warm-up launches of the matching kernels and profiling the next COUNT into a report; then the
# report's sections as text, followed by the warp-stall breakdown from its raw page (cycles
# stalled per issued instruction, by reason, and the sampled stall counts), in $OUT/NAME.txt.
# The warm-up runs' output goes to $OUT/bench.txt (the device returns at most 8 files).
reports=$(mktemp -d)
profile() {
    local name=$1 model=$2 t=$3 regex=$4 count=$5
    echo "== $name: $model T=$t kernels /$regex/"
    echo "== $name" >>"$OUT/bench.txt"
    if ! timeout 300 "$MLPC" bench "$model" --bind T="$t" --iters 3 --warmup 1 >>"$OUT/bench.txt" 2>&1; then
        echo "mlpc bench failed:"
        tail -5 "$OUT/bench.txt"
        return
    fi
    timeout 400 ncu --clock-control none --set full -k "regex:$regex" --launch-skip "$count" \
        --launch-count "$count" -f -o "$reports/$name" "$MLPC" bench "$model" --bind T="$t" \
        --iters 3 --warmup 1 --no-graphs >"$OUT/$name.txt" 2>&1
    echo "ncu exit $?"
    ncu --import "$reports/$name.ncu-rep" >>"$OUT/$name.txt" 2>&1
    {
        echo "== warp stalls (raw page)"
        ncu --import "$reports/$name.ncu-rep" --page raw 2>&1 |
            grep -E "issue_stalled_.*per_issue_active|pcsamp_warps_issue_stalled_[a-z_]+ " |
            grep -vE "not_issued"
        # The memory path: L2 and L1 / TMA traffic and request counters, to tell bytes from
        # requests (block-sparse slices move half the bytes per cycle the dense kernels do).
        echo "== memory path (raw page)"
        ncu --import "$reports/$name.ncu-rep" --page raw 2>&1 |
            grep -iE "tma|lts__t_(bytes|sectors|requests)[a-z_]*\.(sum|sum\.per_second|avg\.pct_of_peak_sustained_elapsed) |l1tex__m_[a-z0-9_]*\.sum\.per_second |lts__throughput" |
            head -60
    } >>"$OUT/$name.txt"
    grep -E "^  [A-Za-z_0-9]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issued Warp Per Scheduler|No Eligible" "$OUT/$name.txt" | head -40
}

# source_page NAME: the SASS of the profiled kernel with its per-instruction metrics (the
# report's source page as CSV), the 80 instructions with the most warp-stall samples first, then
# the whole listing in address order, in $OUT/NAME-source.txt.
source_page() {
    local name=$1
    ncu --import "$reports/$name.ncu-rep" --page source --csv --print-source sass \
        >"$reports/$name-source.csv" 2>&1
    python3 scripts/gpu/hot_sass.py "$reports/$name-source.csv" >"$OUT/$name-source.txt" 2>&1
}

for w in "${what[@]}"; do
    case $w in
        decode16)
            profile decode16 examples/llama-swiglu/model.json 16 "gemv_m16" 2
            source_page decode16
            ;;
        bsr)
            profile bsr-0.5 "$models/bsr-0.5.json" 4096 "bsr" 1
            source_page bsr-0.5
            profile bsr-0.1 "$models/bsr-0.1.json" 4096 "bsr" 1
            source_page bsr-0.1
            ;;
        f32)
            profile f32 "$models/gpt2-mlp-f32.json" 8192 "gemm_bias_gelu_tanh_f32" 1
            source_page f32
            ;;
        shallow) profile shallow examples/gpt2-mlp/model.json 8192 "gemm_bias_gelu_tanh_bf16" 1 ;;
        dual)
            profile dual examples/llama-swiglu/model.json 4096 "dual_gemm_silu_x_bf16_nt_wgmma_tma_[0-9x]*(_pp)?$" 1
            source_page dual
            ;;
        *) echo "unknown profile \`$w\` (decode16, bsr, f32, shallow, dual)" >&2; exit 1 ;;
    esac
done
rm -rf "$models" "$reports"
