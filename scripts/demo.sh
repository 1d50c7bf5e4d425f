#!/usr/bin/env bash
# The main job on one example: compile it, generate inputs, run it, and show what was written.
#
#   ./scripts/demo.sh [EXAMPLE] [T]        (default: tiny-mlp, T=8)
#
# Installs what is missing first (see scripts/setup.sh). Results go to out/.
set -euo pipefail
. "$(dirname "$0")/setup.sh"
mlpc_setup
cd "$MLPC_ROOT"

example="${1:-tiny-mlp}"
tokens="${2:-8}"
model="examples/$example/model.json"
[ -f "$model" ] || { echo "no such example: $model (see examples/)" >&2; exit 1; }

cargo build -q -p mlpc-cli
# Where cargo put it: CARGO_TARGET_DIR (relative to the repository root) moves the build.
target="${CARGO_TARGET_DIR:-target}"
case $target in /*) ;; *) target="$MLPC_ROOT/$target" ;; esac
mlpc="$target/debug/mlpc"
set -x
"$mlpc" compile "$model" -o "out/$example" --explain
"$mlpc" gen-inputs "$model" --bind "T=$tokens" -o "out/$example.inputs.safetensors"
# The best backend of this machine: CUDA with a GPU, else the LLVM CPU backend.
"$mlpc" run "$model" --input "out/$example.inputs.safetensors" \
    --output "out/$example.outputs.safetensors"
# The same backend against the reference interpreter, on fresh random inputs.
"$mlpc" check "$model" --bind "T=$tokens"
