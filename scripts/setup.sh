# Installs what building and testing mlpc needs, when it is missing, and exports the environment
# the build and the tests use. Sourced by scripts/test.sh and scripts/demo.sh; safe to run again
# (each step checks first and does nothing when its part is already there).
#
#   - Rust (rustup, stable, with rustfmt and clippy) when `cargo` is missing;
#   - Debian packages: a C toolchain, LLVM 14 with Polly (the CPU backend links LLVM through
#     llvm-sys) and Python's pip;
#   - NVRTC and the CUDA headers, pinned to the GPU machine's version (13.0.88), from PyPI into
#     ./.whl when the Python environment does not already have them; LD_LIBRARY_PATH points at
#     the library so the CUDA compiler can be loaded without a GPU.

MLPC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MLPC_CUDA_VERSION=13.0.88
MLPC_APT_PACKAGES=(build-essential pkg-config zlib1g-dev libffi-dev libxml2-dev libncurses-dev
    llvm-14-dev libpolly-14-dev python3 python3-pip)

mlpc_log() { printf '[setup] %s\n' "$*" >&2; }

mlpc_as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

mlpc_ensure_apt() {
    local missing=()
    for p in "${MLPC_APT_PACKAGES[@]}"; do
        # python3 and pip may come from elsewhere (pyenv, a venv): only the commands matter.
        case "$p" in
            python3) command -v python3 >/dev/null && continue ;;
            python3-pip) python3 -m pip --version >/dev/null 2>&1 && continue ;;
        esac
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' \
            || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    mlpc_log "apt-get install ${missing[*]}"
    mlpc_as_root apt-get update -q
    mlpc_as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

mlpc_ensure_rust() {
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
    if ! command -v cargo >/dev/null; then
        mlpc_log "installing Rust (rustup, stable)"
        command -v curl >/dev/null || mlpc_as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends curl ca-certificates
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
            | sh -s -- -y --profile minimal --component rustfmt,clippy
        . "$HOME/.cargo/env"
    fi
    if command -v rustup >/dev/null; then
        for c in rustfmt clippy; do
            rustup component list --installed 2>/dev/null | grep -q "^$c" \
                || rustup component add "$c"
        done
    fi
}

# Prints the directory of libnvrtc.so.13 if the pinned packages are importable (with ./.whl first
# on the path), and fails otherwise.
mlpc_nvrtc_libdir() {
    PYTHONPATH="$MLPC_ROOT/.whl${PYTHONPATH:+:$PYTHONPATH}" python3 - "$MLPC_CUDA_VERSION" <<'PY'
import importlib.metadata as md, os, sys
want = sys.argv[1]
try:
    dists = [md.distribution(p) for p in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime")]
except md.PackageNotFoundError:
    sys.exit(1)
if any(d.version != want for d in dists):
    sys.exit(1)
lib = str(dists[0].locate_file("nvidia/cu13/lib"))
if not os.path.exists(os.path.join(lib, "libnvrtc.so.13")):
    sys.exit(1)
print(lib)
PY
}

mlpc_ensure_nvrtc() {
    local lib
    if ! lib="$(mlpc_nvrtc_libdir)"; then
        mlpc_log "pip install nvidia-cuda-nvrtc==$MLPC_CUDA_VERSION nvidia-cuda-runtime==$MLPC_CUDA_VERSION into .whl/"
        python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --upgrade --target "$MLPC_ROOT/.whl" \
            "nvidia-cuda-nvrtc==$MLPC_CUDA_VERSION" "nvidia-cuda-runtime==$MLPC_CUDA_VERSION"
        lib="$(mlpc_nvrtc_libdir)" || { mlpc_log "NVRTC $MLPC_CUDA_VERSION not found after installing it"; return 1; }
    fi
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$MLPC_ROOT/.whl${PYTHONPATH:+:$PYTHONPATH}"
}

mlpc_setup() {
    mlpc_ensure_apt
    mlpc_ensure_rust
    mlpc_ensure_nvrtc
}
