#!/usr/bin/env bash
# Runs every check of the project: formatting, clippy with warnings as errors, and every test of
# the workspace. Installs what is missing first (see scripts/setup.sh). `.ci/run` calls this.
set -euo pipefail
. "$(dirname "$0")/setup.sh"
mlpc_setup
cd "$MLPC_ROOT"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test --workspace"
cargo test --workspace
