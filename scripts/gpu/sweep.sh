#!/usr/bin/env bash
# Compares two or more mlpc binaries, or environment settings of one, in one call on a CUDA
# machine, from the repository root: first `mlpc check` with every side but the first (the
# baseline) of what the rows touch (a wrong kernel stops the run before any timing), then every
# row timed with every side in turn, ROUNDS times (default 2), each side with its own kernel
# cache. Binaries are built here (`scripts/gpu/build.sh`, copies of older ones kept aside) and
# carried over.
#
#   scripts/gpu/sweep.sh SIDE SIDE [SIDE ...] [-- ROW ...]
#
#   SIDE  an mlpc binary, optionally preceded by environment settings for that side:
#         "MLPC_X=1 target/ab/mlpc" (one argument, quoted); the first is the baseline
#   ROW   bsr-0.5, bsr-0.25, bsr-0.1 (a bias-free 4096^2 linear with 32 x 32 blocks kept at that
#         density, T = 4096), bsr64-0.5 (64 x 64 blocks), mlp3-sparse, bert-sparse, geglu-sparse
#         (the examples with every weight at density 0.25, 0.25 and 0.3, T = 8192), any of
#         these at another T as ROW@T (e.g. bsr-0.25@16), dense@T (the same 4096^2 linear
#         unpruned), or MODEL.json:T (e.g. examples/llama-swiglu/model.json:16); default: the
#         three bsr rows and the three sparse models
#
# Checks: when a block-sparse row is timed, the block-sparse cases (tests/cases at T = 1, 77,
# 129, 1000, bert-sparse-ffn at 67 and 2048, the generated weights at a few hundred rows, the
# 4096^2 ones at 300, 1000 and 4200, at density 0.16 too); every row's model at T = 200, at the T
# it is timed at, and at every T of CHECK_T ("1 9 16", say) too.
# CHECKS=0 skips them all (timing-only probes whose results are wrong by design). They run JOBS at
# a time (default 6), their results printed in order once all have run. The reference
# interpreter's time grows with the model and T: a llama-sized MODEL.json row checked at T = 4096
# takes minutes on its own.
#
# Prints, per round, a header naming the sides and one line per row: `ROW | MEDIAN | MEDIAN ...`
# (ms, `mlpc bench` medians after its second of heat, timed as the harness times: 25 ms of
# warm-up and 200 ms of timed runs, each after a 256 MB flush, as `do_bench` times the peers, so
# that every side runs at the clocks of that load; in the order of the sides). About 4 s per row
# and side on an H200, plus the checks (about 40 s for the block-sparse ones).
set -uo pipefail
sides=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    sides+=("$1")
    shift
done
[ "${1:-}" = -- ] && shift
rows=("$@")
if [ ${#sides[@]} -lt 2 ]; then
    sed -n '2,33p' "$0" >&2
    exit 1
fi
[ ${#rows[@]} -eq 0 ] && rows=(bsr-0.5 bsr-0.25 bsr-0.1 mlp3-sparse bert-sparse geglu-sparse)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
models=$(mktemp -d)
caches=$(mktemp -d)
trap 'rm -rf "$models" "$caches"' EXIT

python3 - "$models" <<'EOF'
import json, sys
out = sys.argv[1]
def linear(name, block, density):
    json.dump({"mlpc": 1, "name": name, "dtype": "bf16", "seed": 0,
               "inputs": {"x": {"shape": ["T", 4096]}},
               "layers": [{"op": "linear", "name": "fc", "in": 4096, "out": 4096, "bias": False}],
               "sparsity": {"fc.weight": {"block": block, "density": density}}},
              open(f"{out}/{name}.json", "w"))
for d in ("0.5", "0.25", "0.1", "0.16"):
    linear(f"bsr-{d}", [32, 32], float(d))
dense = {"mlpc": 1, "name": "dense", "dtype": "bf16", "seed": 0,
         "inputs": {"x": {"shape": ["T", 4096]}},
         "layers": [{"op": "linear", "name": "fc", "in": 4096, "out": 4096, "bias": False}]}
json.dump(dense, open(f"{out}/dense.json", "w"))
linear("bsr64-0.5", [64, 64], 0.5)
for name, example, density in (("mlp3-sparse", "mlp3-relu", 0.25),
                               ("bert-sparse", "bert-large-ffn", 0.25),
                               ("geglu-sparse", "seed-geglu", 0.3)):
    m = json.load(open(f"examples/{example}/model.json"))
    m["name"] = name
    m["sparsity"] = {"*.weight": {"block": [32, 32], "density": density}}
    json.dump(m, open(f"{out}/{name}.json", "w"))
EOF

# side SPEC CACHE ARGS...: runs the binary of SPEC with its settings and its own cache.
side() {
    local spec=$1 cache=$2
    shift 2
    # shellcheck disable=SC2086 # the settings are words by design
    env MLPC_CACHE_DIR="$cache" $spec "$@"
}

model_of() {
    case $1 in
        *.json:*) echo "${1%:*}" ;;
        *@*) echo "$models/${1%@*}.json" ;;
        *) echo "$models/$1.json" ;;
    esac
}
t_of() {
    case $1 in
        *.json:*) echo "${1##*:}" ;;
        *@*) echo "${1##*@}" ;;
        bsr*) echo 4096 ;;
        *) echo 8192 ;;
    esac
}

failed=0
# check SIDE_INDEX ARGS...: queues `mlpc check ARGS` with that side (run_checks runs the queue).
queue=()
check() {
    queue+=("$*")
}
# Runs the queued checks JOBS at a time (default 6: the reference interpreter's time, not the
# GPU's, is most of a check, and the kernel cache takes concurrent writers), each into a result
# file of its own, then prints the results in the queue's order; any FAIL line sets `failed`.
run_checks() {
    local k running=0 results
    results=$(mktemp -d)
    echo "   ${#queue[@]} checks, ${JOBS:-6} at a time"
    for k in "${!queue[@]}"; do
        (
            # shellcheck disable=SC2086 # a queue entry is words by design
            set -- ${queue[$k]}
            i=$1
            shift
            # --backend cuda: without a usable driver the CLI would check on the CPU instead.
            if out=$(side "${sides[$i]}" "$caches/$i" check --backend cuda "$@" 2>&1); then
                echo "ok   [${sides[$i]}] $*"
            else
                echo "FAIL [${sides[$i]}] $*"
                echo "$out" | tail -5
            fi
        ) >"$results/$k" &
        running=$((running + 1))
        if [ "$running" -ge "${JOBS:-6}" ]; then
            wait -n
            running=$((running - 1))
        fi
    done
    wait
    for k in "${!queue[@]}"; do
        cat "$results/$k"
        grep -q '^FAIL' "$results/$k" && failed=1
    done
    rm -rf "$results"
}
checks() {
    local sparse=0 row i t
    for row in "${rows[@]}"; do
        case $row in *.json:* | dense@*) ;; *) sparse=1 ;; esac
    done
    echo "== checks (every side but the first)"
    for ((i = 1; i < ${#sides[@]}; i++)); do
        if [ $sparse -eq 1 ]; then
            for case in sparse-geglu-b16 sparse-residual-b64 sparse-pairs-b32; do
                for t in 1 77 129 1000; do check "$i" "tests/cases/$case/model.json" --bind T=$t; done
            done
            check "$i" examples/bert-sparse-ffn/model.json --bind T=67
            check "$i" examples/bert-sparse-ffn/model.json --bind T=2048
            # The short grids' groups of four block rows (T = 300) and of eight (T = 1000); the
            # ones of two run at T = 77 and 129 above and at the rows' T = 128 or 256.
            for t in 300 1000; do
                for d in 0.5 0.25 0.1; do check "$i" "$models/bsr-$d.json" --bind T=$t; done
            done
            # Enough rows for the kernel's own groups of eleven block rows, with a partial last
            # row tile.
            for d in 0.5 0.25 0.1; do check "$i" "$models/bsr-$d.json" --bind T=4200; done
            # Groups of eleven on windows, the short grids' on pairs (their A through a tensor
            # map of its own): every entry.
            for t in 300 1000 4200; do check "$i" "$models/bsr-0.16.json" --bind T=$t; done
            check "$i" "$models/bsr64-0.5.json" --bind T=300
            check "$i" "$models/geglu-sparse.json" --bind T=100
            check "$i" "$models/mlp3-sparse.json" --bind T=700
        fi
        # Every row at T = 200, at the T it is timed at (its kernel entries depend on T: the
        # short grids, the groups) and at every T of CHECK_T.
        for row in "${rows[@]}"; do
            for t in 200 "$(t_of "$row")" ${CHECK_T:-}; do
                check "$i" "$(model_of "$row")" --bind T="$t"
            done
        done
    done
    run_checks
}
[ "${CHECKS:-1}" = 0 ] || checks
if [ $failed -ne 0 ]; then
    echo "a check failed: no timings"
    exit 1
fi

median() {
    side "${sides[$1]}" "$caches/$1" bench "$2" --bind T="$3" --flush-l2 --warmup-ms 25 --rep-ms 200 2>&1 |
        grep -o 'median [0-9.]*' | cut -d' ' -f2
}
for round in $(seq "${ROUNDS:-2}"); do
    header="== timings (ms), round $round: ROW"
    for spec in "${sides[@]}"; do header="$header | $spec"; done
    echo "$header"
    for row in "${rows[@]}"; do
        model=$(model_of "$row")
        t=$(t_of "$row")
        line=$row
        for ((i = 0; i < ${#sides[@]}; i++)); do
            m=$(median "$i" "$model" "$t")
            line="$line | ${m:-failed}"
        done
        echo "$line"
    done
done
