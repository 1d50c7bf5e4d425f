#!/usr/bin/env bash
# One call on a CUDA machine: a smoke check under a time limit (a kernel that deadlocks must not
# eat the session), then the full validation, then the benchmark. Run from the repository root
# after `scripts/gpu/build.sh` (binaries carried over); results go to $OUT (default /tmp/mlpc-gpu).
# A failing smoke check stops the run, and so does a failing validation before the benchmark (it
# would rewrite docs/benchmarks.md with timings of a binary that failed its checks); the exit
# status is nonzero when any step failed or timed out. A step's report is copied into $OUT only
# when the step wrote it: after a crash or a timeout docs/ still holds the committed one.
#
#   scripts/gpu/run_all.sh [validate|validate-sm90|validate-f32|bench|all|tune|micro|power|counters|survey] [extra arguments...]
#
# Wall times on the H200 (2026-11-29, warm machine): smoke 15 s, validate 120 s (228 outputs,
# guards, sanitizer; 240 s since 2026-12-03, with every model the benchmarks time checked at its
# T: 290 outputs; and 26 rows of the portable block-sparse kernels, which `validate.py --only
# portable` checked in 45 s on its own, guards included), bench 120 s, `bench_goals.py` 70 s,
# `tune` about 45 s per model. So `all` with every row takes most of a 600 s call: `--only ROWS`
# keeps it short.
#
# `run_all.sh bench --only "llama-swiglu T=1,gpt2-mlp T=1" --merge` refreshes those rows only and
# keeps the others of docs/benchmarks.json (the table then names each row's run). The tables'
# runs since 2026-12-04 add `--rounds 3` (each row's sides timed together three times over, each
# side keeping its middle round; about three times the timing, not the compilation).
#
# e.g. `run_all.sh bench --max-autotune gpt2-mlp,bert-large-ffn` adds torch.compile's max-autotune
# peer for those rows (each compiles for tens of seconds: mind the 500 s limit of the bench step;
# the five bf16 models took the whole call to 210 s on 2026-11-30, `--max-autotune all` would also
# compile every GEMM and decode row).
#
# `power` times mlpc's GEMMs and cuBLAS's on a few shapes, each heated, with the SM clock and
# board power sampled (`scripts/gpu/power.py`; about 10 s per shape and side), table in
# $OUT/power.md. Extra arguments go to power.py, e.g. `run_all.sh power --mlpc target/ab/mlpc`
# to add a second build or `--mlpc "MLPC_CACHE_DIR=/tmp/tiles target/release/mlpc"` a forced
# tile (2026-11-30: about 60 s for three shapes and two mlpc sides).
#
# `counters` profiles one launch of mlpc's GEMMs and cuBLAS's on the same shapes under `ncu`
# (`scripts/gpu/counters.py`: time, cycles, L2 and DRAM bytes, warp instructions, shared-memory
# wavefronts; about 10 s per shape and side; extra arguments as for `power`), table in
# $OUT/counters.md.
#
# `survey` runs `scripts/gpu/survey.py` instead: the MLP shapes of other models and token counts
# that are not multiples of the tiles, each checked against the reference, then mlpc and eager
# timed; table in $OUT/benchmarks-shapes.md (docs/benchmarks-shapes.md; extra arguments go to
# survey.py, e.g. `--only NAME,...`).
#
# `validate-sm90` validates every model as `--target cuda:sm_90` compiles it (the portable
# `mma.sync` kernels), report in docs/gpu-validation-sm90.md.
#
# `validate-f32` validates the f32 models and f32 copies of the examples twice, every f32 GEMM
# that offers the choice forced onto the FP64 tensor cores, then onto the FFMA pipes
# (`validate.py --f32-kernel fp64|ffma`; about a minute each), reports in
# docs/gpu-validation-fp64.md and docs/gpu-validation-ffma.md.
#
# `micro` builds and runs the wgmma issue-rate microbenchmark (`scripts/gpu/wgmma_issue.cu`, nvcc
# of the machine's toolkit; a few seconds) instead, its table in $OUT/wgmma_issue.txt, then the
# FP64 tensor-core one (`scripts/gpu/dmma_issue.cu`: DMMA, f32 -> f64 conversion and FFMA rates),
# its table in $OUT/dmma_issue.txt.
#
# `tune` runs `mlpc compile --autotune` on every example at its benchmark size instead (every
# candidate tile checked against the reference, then timed; tables in $OUT/tune-*.txt), with its
# own cache directory, so that the validation and benchmark runs keep the heuristic's tiles.
# TUNE="gpt2-mlp:8192 ..." picks the models (about a minute or two each); TUNE="gpt2-mlp:8192:f32"
# tunes the example in another dtype (f32: the FFMA kernel against the FP64 tensor cores).
set -uo pipefail
what=${1:-all}
shift || true
case $what in
    validate | validate-sm90 | validate-f32 | bench | all | tune | micro | power | counters | survey) ;;
    *)
        # A misspelt step would otherwise run the smoke check alone and report success.
        echo "run_all.sh: unknown step \`$what\` (validate, validate-sm90, validate-f32, bench, all, tune, micro, power, counters, survey)" >&2
        exit 2
        ;;
esac
bench_args=("$@")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/mlpc-gpu}
mkdir -p "$OUT"
MLPC=target/release/mlpc
export MLPC_CACHE_DIR=${MLPC_CACHE_DIR:-/tmp/mlpc-cache}

if [ "$what" = power ]; then
    echo "== clock and power of mlpc's GEMMs and cuBLAS's, heated"
    timeout 300 python3 scripts/gpu/power.py --mlpc "$MLPC" --out "$OUT/power.md" "${bench_args[@]}"
    exit $?
fi

if [ "$what" = survey ]; then
    # The shape survey (docs/benchmarks-shapes.md): other models' MLP shapes and token counts,
    # each checked against the reference first, then mlpc and eager timed (about six minutes).
    echo "== shape survey"
    [ -f docs/benchmarks-shapes.md ] && cp docs/benchmarks-shapes.md "$OUT/benchmarks-shapes.md"
    timeout 560 python3 scripts/gpu/survey.py --mlpc "$MLPC" --out "$OUT/benchmarks-shapes.md" "${bench_args[@]}"
    exit $?
fi

if [ "$what" = counters ]; then
    echo "== ncu counters of mlpc's GEMMs and cuBLAS's"
    timeout 400 python3 scripts/gpu/counters.py --mlpc "$MLPC" --out "$OUT/counters.md" "${bench_args[@]}"
    exit $?
fi

if [ "$what" = micro ]; then
    echo "== wgmma issue-rate microbenchmark"
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -diag-suppress 1886 \
        -I kernels-templates scripts/gpu/wgmma_issue.cu -o /tmp/wgmma_issue || exit 1
    timeout 120 /tmp/wgmma_issue | tee "$OUT/wgmma_issue.txt"
    rc=${PIPESTATUS[0]}
    echo "== FP64 tensor-core microbenchmark"
    nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I kernels-templates \
        scripts/gpu/dmma_issue.cu -o /tmp/dmma_issue || exit 1
    timeout 120 /tmp/dmma_issue | tee "$OUT/dmma_issue.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    exit "$rc"
fi

# The script's exit status: 1 once any step failed or timed out (the tails are printed all the same).
rc=0

# "NAME exit STATUS" (124: timeout killed it), and a nonzero STATUS fails the script.
note_exit() {
    if [ "$2" -eq 124 ]; then echo "$1 exit 124 (timed out)"; else echo "$1 exit $2"; fi
    [ "$2" -eq 0 ] || rc=1
}

# Copies into $OUT those of the REPORTs (files of docs/) that are newer than STAMP, a file touched
# just before the step ran: after a crash or a timeout docs/ holds the committed report, which must
# not pass for this run's; nor may a copy left in $OUT by an earlier run.
keep_reports() {
    local stamp=$1 f
    shift
    for f in "$@"; do
        rm -f "$OUT/${f##*/}"
        if [ "$f" -nt "$stamp" ]; then
            cp "$f" "$OUT/"
        else
            echo "$f was not written by this run: not copied to $OUT"
        fi
    done
    rm -f "$stamp"
}

echo "== smoke: tiled kernels (T > 64) of gpt2-mlp and seed-geglu on the default target"
# Emptied first: the failure's tail must not show an earlier run's lines.
: >"$OUT/smoke.txt"
# T = 2048: every persistent CTA computes several tiles (both ping-pong warpgroups work).
for spec in "examples/gpt2-mlp/model.json 129" "examples/gpt2-mlp/model.json 2048" "examples/seed-geglu/model.json 300"; do
    model=${spec% *}
    t=${spec#* }
    timeout 180 "$MLPC" check "$model" --backend cuda --bind T="$t" >>"$OUT/smoke.txt" 2>&1
    status=$?
    if [ "$status" -ne 0 ]; then
        note_exit "smoke check of $model T=$t" "$status" | tee -a "$OUT/smoke.txt"
        echo "stopping" | tee -a "$OUT/smoke.txt"
        tail -20 "$OUT/smoke.txt"
        exit 1
    fi
done
tail -4 "$OUT/smoke.txt"

if [ "$what" = tune ]; then
    export MLPC_CACHE_DIR=/tmp/mlpc-tune
    mkdir -p /tmp/mlpc-tune-out
    for spec in ${TUNE:-gpt2-mlp:8192 bert-large-ffn:8192 seed-geglu:8192 mlp3-relu:8192 llama-swiglu:4096}; do
        # MODEL:T, or MODEL:T:DTYPE for the example with its dtype changed (e.g. gpt2-mlp:8192:f32).
        IFS=: read -r model t dt <<<"$spec"
        src="examples/$model/model.json"
        name=$model
        if [ -n "$dt" ]; then
            name=$model-$dt
            src=/tmp/mlpc-tune-out/$name.json
            python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); m["dtype"] = sys.argv[2]; json.dump(m, open(sys.argv[3], "w"))' \
                "examples/$model/model.json" "$dt" "$src"
        fi
        echo "== autotune $name T=$t"
        timeout 240 "$MLPC" compile "$src" --autotune --bind T="$t" \
            -o "/tmp/mlpc-tune-out/$name" >"$OUT/tune-$name.txt" 2>&1
        note_exit "autotune $name" $?
        grep -E " ms|error" "$OUT/tune-$name.txt"
    done
    cp "$MLPC_CACHE_DIR/autotune.json" "$OUT/" 2>/dev/null
    exit "$rc"
fi
if [ "$what" = validate ] || [ "$what" = all ]; then
    echo "== validate"
    touch "$OUT/.stamp"
    timeout 480 python3 scripts/gpu/validate.py --mlpc "$MLPC" \
        --guards target/release/examples/gpu_guards --out docs/gpu-validation.md --target auto \
        >"$OUT/validate.log" 2>&1
    status=$?
    note_exit validate "$status"
    tail -5 "$OUT/validate.log"
    # A report with failing rows is this run's and is kept; one not written is not.
    keep_reports "$OUT/.stamp" docs/gpu-validation.md
    if [ "$status" -ne 0 ] && [ "$what" = all ]; then
        echo "validation failed: no benchmark (docs/benchmarks.md left as it was)"
        rm -f "$OUT/benchmarks.md" "$OUT/benchmarks.json"
        exit 1
    fi
fi
if [ "$what" = validate-sm90 ]; then
    # The portable kernels (`mma.sync`, no TMA or wgmma) of every model and case, as `--target
    # cuda:sm_90` compiles them on a Hopper machine; report in docs/gpu-validation-sm90.md.
    echo "== validate the portable sm_90 kernels"
    touch "$OUT/.stamp"
    timeout 480 python3 scripts/gpu/validate.py --mlpc "$MLPC" \
        --guards target/release/examples/gpu_guards --out docs/gpu-validation-sm90.md \
        --target cuda:sm_90 >"$OUT/validate-sm90.log" 2>&1
    note_exit validate $?
    tail -5 "$OUT/validate-sm90.log"
    keep_reports "$OUT/.stamp" docs/gpu-validation-sm90.md
    exit "$rc"
fi
if [ "$what" = validate-f32 ]; then
    for kernel in fp64 ffma; do
        echo "== validate the f32 models with their GEMMs forced onto $kernel"
        touch "$OUT/.stamp"
        timeout 300 python3 scripts/gpu/validate.py --mlpc "$MLPC" \
            --guards target/release/examples/gpu_guards --out "docs/gpu-validation-$kernel.md" \
            --target auto --f32-kernel "$kernel" >"$OUT/validate-$kernel.log" 2>&1
        note_exit validate $?
        tail -5 "$OUT/validate-$kernel.log"
        keep_reports "$OUT/.stamp" "docs/gpu-validation-$kernel.md"
    done
    exit "$rc"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    echo "== bench"
    touch "$OUT/.stamp"
    timeout 500 python3 scripts/gpu/bench.py --mlpc "$MLPC" --out docs/benchmarks.md "${bench_args[@]}" \
        >"$OUT/bench.log" 2>&1
    status=$?
    note_exit bench "$status"
    [ "$status" -eq 0 ] || tail -5 "$OUT/bench.log"
    # The table only where this run wrote it: otherwise it is the committed one.
    if [ docs/benchmarks.md -nt "$OUT/.stamp" ]; then
        grep -E "^\| " docs/benchmarks.md | head -40
    fi
    keep_reports "$OUT/.stamp" docs/benchmarks.md docs/benchmarks.json
fi
exit "$rc"
