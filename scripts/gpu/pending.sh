#!/usr/bin/env bash
# Checks of the newest cases and a block-sparse sweep as one call on a CUDA machine from the
# repository root (about 7 minutes with the defaults; last run 2026-12-05 on an H100, results in
# docs/perf-notes.md, block-sparse variants 47 and 48 and "Next steps"):
#
#   CUR=target/ab/mlpc-cur GUARDS=target/ab/gpu_guards-cur NEW=target/ab/mlpc-new \
#       NEW2=target/ab/mlpc-new2 SWEEP_S=270 ROWS="bsr-0.25 bsr-0.1" bash scripts/gpu/pending.sh
#
# First the checks of what has not run on a GPU yet, with CUR (an mlpc built from main by
# scripts/gpu/build.sh; default target/release/mlpc): the cases sparse-heights-b24 (up to
# T = 9000: its entries switch at 4224 and 8448), sparse-heights-f16, tanh-wide (its 128 x 192
# tile from T = 8449), cse-shared-weight and sparse-tied on the default target, the first three on sm_90 too
# and under compute-sanitizer; the guard cases (GUARDS, the gpu_guards example of the same
# build, which since 2026-12-05 also offers a shape past its memory). Then, under SWEEP_S
# seconds, scripts/gpu/sweep.sh over NEW, NEW with the per-T walk tables (MLPC_BSR_WALK=1) and
# NEW2 (any further build to compare; left out when unset) on ROWS. Every step that fails (a
# check, the guards, the sanitizer, the sweep; 124: killed by its time limit) prints a FAIL line
# with its exit status; the script ends with a summary line, and exits 1 when any step failed.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader; date -u
M=${CUR:-target/release/mlpc}
NEW=${NEW:-target/release/mlpc}
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
echo "== checks ($M)"
for t in 1 77 300 1000 5000 9000; do chk tests/cases/sparse-heights-b24/model.json --backend cuda --bind T=$t; done
for t in 1 77 300 1000 3000; do chk tests/cases/sparse-heights-f16/model.json --backend cuda --bind T=$t; done
for t in 1 40 77 1000 9000; do chk tests/cases/tanh-wide/model.json --backend cuda --bind T=$t; done
for t in 1 77 1000; do chk tests/cases/cse-shared-weight/model.json --backend cuda --bind T=$t; done
for t in 1 77 1000; do chk tests/cases/sparse-tied/model.json --backend cuda --bind T=$t; done
for c in sparse-heights-b24 sparse-heights-f16 tanh-wide; do for t in 77 300; do
  chk tests/cases/$c/model.json --backend cuda --target cuda:sm_90 --bind T=$t
done; done
echo "== guards (${GUARDS:-target/release/examples/gpu_guards})"
timeout 120 ${GUARDS:-target/release/examples/gpu_guards} tests/cases/gpt2-mlp/model.json 2>&1 | tail -20
verdict "${PIPESTATUS[0]}" guards
echo "== sanitizer"
# Exit 9: memcheck found errors (any other nonzero status is the check's own).
for c in sparse-heights-b24 sparse-heights-f16 tanh-wide; do
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $M check tests/cases/$c/model.json --backend cuda --bind T=129 2>&1 | grep -E "ERROR SUMMARY|^ok|^FAIL|rror" | tail -3
  verdict "${PIPESTATUS[0]}" sanitizer "$c"
done
date -u
echo "== sweep"
ROUNDS=${ROUNDS:-1} timeout ${SWEEP_S:-420} bash scripts/gpu/sweep.sh "$NEW" "MLPC_BSR_WALK=1 $NEW" ${NEW2:+"$NEW2"} -- ${ROWS:-bsr-0.25 bsr-0.1 bsr-0.25@1536 bert-sparse@1536}
verdict $? sweep
date -u
if [ "$failed" -eq 0 ]; then
  echo "== summary: all $steps steps passed"
else
  echo "== summary: $failed of $steps steps FAILED (the FAIL lines above)"
  exit 1
fi
