#!/usr/bin/env bash
# A/B of two mlpc binaries (or of two environment settings of one) in one call on a CUDA
# machine, from the repository root: first `mlpc check` of the block-sparse cases with the new
# side (a wrong kernel stops the run before any timing), then every row timed with both sides,
# alternating, ROUNDS times (default 2), each side with its own kernel cache. Binaries are
# built here (`scripts/gpu/build.sh`, a copy of the old one kept aside) and carried over.
#
#   scripts/gpu/ab.sh OLD NEW [ROW ...]
#
#   OLD, NEW  an mlpc binary, optionally preceded by environment settings for that side:
#             "MLPC_X=1 target/ab/mlpc" (one argument, quoted)
#   ROW       bsr-0.5, bsr-0.25, bsr-0.1 (a bias-free 4096^2 linear with 32 x 32 blocks kept at
#             that density, T = 4096), bsr64-0.5 (64 x 64 blocks), mlp3-sparse, bert-sparse,
#             geglu-sparse (the examples with every weight at density 0.25, 0.25 and 0.3,
#             T = 8192), or MODEL.json:T (checked at T = 200 and at T); default: the three bsr rows and
#             the three sparse models
#
# CHECKS=0 skips the checks (timing-only probes whose results are wrong by design).
#
# Prints one line per row and round: `ROW old MEDIAN new MEDIAN` (ms, `mlpc bench` medians of 200
# runs after warm-up). About 3 s per row and side on an H200, plus about 40 s of checks.
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,23p' "$0" >&2
    exit 1
fi
old=$1
new=$2
shift 2
rows=("$@")
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
for d in ("0.5", "0.25", "0.1"):
    linear(f"bsr-{d}", [32, 32], float(d))
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
        *) echo "$models/$1.json" ;;
    esac
}
t_of() {
    case $1 in
        *.json:*) echo "${1##*:}" ;;
        bsr*) echo 4096 ;;
        *) echo 8192 ;;
    esac
}

failed=0
check() {
    if out=$(side "$new" "$caches/new" check "$@" 2>&1); then
        echo "ok   $*"
    else
        echo "FAIL $*"
        echo "$out" | tail -5
        failed=1
    fi
}
checks() {
    echo "== checks (new side)"
    for case in sparse-geglu-b16 sparse-residual-b64; do
        for t in 1 77 129 1000; do check "tests/cases/$case/model.json" --bind T=$t; done
    done
    check examples/bert-sparse-ffn/model.json --bind T=67
    check examples/bert-sparse-ffn/model.json --bind T=2048
    for d in 0.5 0.25 0.1; do check "$models/bsr-$d.json" --bind T=300; done
    check "$models/bsr64-0.5.json" --bind T=300
    check "$models/geglu-sparse.json" --bind T=100
    check "$models/mlp3-sparse.json" --bind T=700
    for row in "${rows[@]}"; do
        case $row in
            *.json:*)
                check "$(model_of "$row")" --bind T=200
                check "$(model_of "$row")" --bind T="$(t_of "$row")"
                ;;
        esac
    done
}
[ "${CHECKS:-1}" = 0 ] || checks
if [ $failed -ne 0 ]; then
    echo "a check failed: no timings"
    exit 1
fi

echo "== timings (ms)"
median() {
    side "$1" "$2" bench "$3" --bind T="$4" 2>&1 | grep -o 'median [0-9.]*' | cut -d' ' -f2
}
for round in $(seq "${ROUNDS:-2}"); do
    for row in "${rows[@]}"; do
        model=$(model_of "$row")
        t=$(t_of "$row")
        a=$(median "$old" "$caches/old" "$model" "$t")
        b=$(median "$new" "$caches/new" "$model" "$t")
        echo "$row old ${a:-failed} new ${b:-failed} (round $round)"
    done
done
