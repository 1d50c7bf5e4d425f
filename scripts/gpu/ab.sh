#!/usr/bin/env bash
# A/B of two mlpc binaries (or of two environment settings of one) in one call on a CUDA
# machine: `scripts/gpu/sweep.sh OLD NEW -- ROW ...` (checks with the new side first, then every
# row timed with both sides, alternating, ROUNDS times). See sweep.sh for the rows, the checks
# and CHECKS=0 / CHECK_T.
#
#   scripts/gpu/ab.sh OLD NEW [ROW ...]
#
#   OLD, NEW  an mlpc binary, optionally preceded by environment settings for that side:
#             "MLPC_X=1 target/ab/mlpc" (one argument, quoted)
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,10p' "$0" >&2
    exit 1
fi
old=$1
new=$2
shift 2
exec "$(dirname "$0")/sweep.sh" "$old" "$new" -- "$@"
