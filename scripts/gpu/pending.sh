#!/usr/bin/env bash
# What runs on a GPU after a change to the block-sparse kernels, as one call on a
# CUDA machine from the repository root (about 7 minutes; last run 2026-12-06 after block-sparse
# variants 50-52 of docs/perf-notes.md):
#
#   CUR=target/ab/mlpc-cur GUARDS=target/ab/gpu_guards-cur bash scripts/gpu/pending.sh
#
# With CUR (an mlpc built from main by scripts/gpu/build.sh; default target/release/mlpc): every
# block-sparse model through validate.py on the default target (`--only sparse,bsr`: the cases,
# the benchmark models, the decode and short-grid rows), with the guard cases (GUARDS) and
# compute-sanitizer on the dual kernel's cases; then llama's MLP with every weight at density
# 0.25 in 32 x 32 blocks, packed to the union of the gated pair's patterns and pruned together,
# checked at T = 129 and timed at T = 4096 beside the dense model (ROUNDS rounds, the three
# models alternating; JSON lines in $OUT/pending-bench.jsonl when OUT is set); with GOALS=1 and
# OUT set, then bench_goals.py into copies of docs/benchmarks.md and its measurements in $OUT
# (copy both back to refresh the tables). Every step that fails (124: killed by its time limit)
# prints a FAIL line with its exit status; the script ends with a summary line, and exits 1
# when any step failed.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader; date -u
M=${CUR:-target/release/mlpc}
export MLPC_CACHE_DIR=/tmp/mc-cur
# The filters keep a few lines of each step and drop its exit status: a hang that timeout killed
# or a crash would print nothing. So each step's status goes through verdict: STATUS WHAT, a FAIL
# line and a count for a nonzero STATUS.
steps=0 failed=0
verdict() {
  steps=$((steps + 1))
  [ "$1" -eq 0 ] && return
  failed=$((failed + 1))
  if [ "$1" -eq 124 ]; then echo "FAIL (exit 124, timed out): ${*:2}"; else echo "FAIL (exit $1): ${*:2}"; fi
}
chk() {
  echo "-- $*"
  timeout 90 $M check "$@" 2>&1 | grep -E "^(ok|FAIL)|rror" | tail -4
  verdict "${PIPESTATUS[0]}" check "$@"
}

echo "== validate.py --only sparse,bsr"
timeout 360 python3 scripts/gpu/validate.py --mlpc "$M" --guards "${GUARDS:-target/release/examples/gpu_guards}" \
  --out "${OUT:-/tmp}/pending-validation.md" --cache /tmp/pending-kernel-cache --only sparse,bsr --target auto \
  --sanitize tests/cases/sparse-swiglu-with/model.json,tests/cases/sparse-swiglu-deep/model.json 2>&1 | tail -12
verdict "${PIPESTATUS[0]}" validate.py
# llama's MLP at d = 0.25: the union of the gated pair's patterns, and the pair pruned together.
mkdir -p /tmp/pending
python3 - <<'PY'
import json
m = json.load(open("examples/llama-swiglu/model.json"))
b = {"block": [32, 32], "density": 0.25}
json.dump(dict(m, name="llama-d25-union", sparsity={"*_proj.weight": b}), open("/tmp/pending/union.json", "w"))
json.dump(dict(m, name="llama-d25-with", sparsity={"gate_proj.weight": dict(b, **{"with": "up_proj.weight"}),
                                                  "down_proj.weight": b}), open("/tmp/pending/with.json", "w"))
PY
echo "== checks ($M)"
for m in /tmp/pending/union.json /tmp/pending/with.json; do chk "$m" --backend cuda --bind T=129; done
echo "== timings (T = 4096)"
J=${OUT:-/tmp}/pending-bench.jsonl
for r in $(seq "${ROUNDS:-2}"); do
  for m in examples/llama-swiglu/model.json /tmp/pending/union.json /tmp/pending/with.json; do
    echo "-- round $r: $m"
    timeout 120 $M bench "$m" --bind T=4096 --warmup-ms 25 --rep-ms 200 --heat-ms 1000 --flush-l2 --json "$J" 2>&1 | grep -E "median|rror" | tail -3
    verdict "${PIPESTATUS[0]}" bench "$m" round "$r"
  done
done
if [ "${GOALS:-0}" = 1 ] && [ -n "${OUT:-}" ]; then
  echo "== bench_goals.py"
  cp docs/benchmarks.md docs/benchmarks-goals.json "$OUT/"
  timeout 300 python3 scripts/gpu/bench_goals.py --mlpc "$M" --out "$OUT/benchmarks.md" 2>&1 | tail -14
  verdict "${PIPESTATUS[0]}" bench_goals.py
fi
date -u
if [ "$failed" -eq 0 ]; then
  echo "== summary: all $steps steps passed"
else
  echo "== summary: $failed of $steps steps FAILED (the FAIL lines above)"
  exit 1
fi
