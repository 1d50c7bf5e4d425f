#!/usr/bin/env bash
# Builds, on this machine, what the GPU scripts run on a CUDA machine: the `mlpc` binary and the
# guard checker, without the LLVM backend (the GPU machine needs only its CUDA driver and
# toolkit). Then, on the CUDA machine, from the repository root:
#
#   export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
#   python3 scripts/gpu/validate.py --mlpc target/release/mlpc \
#       --guards target/release/examples/gpu_guards --out docs/gpu-validation.md --target auto
#   python3 scripts/gpu/bench.py --mlpc target/release/mlpc --out docs/benchmarks.md
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mlpc-cli --no-default-features
cargo build --release -p mlpc --example gpu_guards --no-default-features
t="${CARGO_TARGET_DIR:-target}"
ls -l "$t/release/mlpc" "$t/release/examples/gpu_guards"
