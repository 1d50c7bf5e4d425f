#!/usr/bin/env bash
# Disassembles compiled kernels into SASS on any machine (no GPU needed) and counts the
# instructions the performance notes read, so that a change to a template can be checked in the
# machine code before it is timed:
#
#   scripts/sass.sh out/gpt2-mlp/kernels            # every cubin of a `mlpc compile` output
#   scripts/sass.sh a.cubin b.cubin                  # or single cubins
#
# Writes NAME.sass beside each NAME.cubin (`nvdisasm -c`: the code, one instruction a line) and
# prints one line per cubin: instructions in all, HGMMA (wgmma), WARPGROUP.ARRIVE (one per wgmma
# pipeline stage: ptxas injects one into every basic block that issues wgmmas, its info C7519),
# BRA / BRX, LDSM (ldmatrix), UTMALDG (copy-engine loads), and LDL / STL (local memory: spills).
#
# nvdisasm comes from PyPI (nvidia-cuda-nvdisasm, pinned below) into .whl/tools on first use; it
# reads the sm_90 / sm_90a cubins of the NVRTC that scripts/setup.sh pins.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=13.2.51
tools="$root/.whl/tools"
nvdisasm="$tools/nvidia/cu13/bin/nvdisasm"
if [ $# -eq 0 ]; then
    sed -n '2,15p' "$0" >&2
    exit 1
fi
if [ ! -x "$nvdisasm" ]; then
    echo "[sass] pip install nvidia-cuda-nvdisasm==$version into .whl/tools" >&2
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
        --no-deps --target "$tools" "nvidia-cuda-nvdisasm==$version"
    chmod +x "$nvdisasm"
fi
cubins=()
for arg in "$@"; do
    if [ -d "$arg" ]; then
        while IFS= read -r f; do cubins+=("$f"); done < <(find "$arg" -name '*.cubin' | sort)
    elif [ -f "$arg" ]; then
        cubins+=("$arg")
    else
        echo "[sass] $arg: no such cubin or directory" >&2
        exit 1
    fi
done
if [ ${#cubins[@]} -eq 0 ]; then
    echo "[sass] no .cubin files in: $*" >&2
    exit 1
fi
printf '%8s %6s %7s %6s %6s %7s %6s  %s\n' insts HGMMA ARRIVE BRA LDSM UTMALDG LDL/STL cubin
for c in "${cubins[@]}"; do
    sass="${c%.cubin}.sass"
    "$nvdisasm" -c "$c" > "$sass"
    count() { grep -cE "$1" "$sass" || true; }
    printf '%8s %6s %7s %6s %6s %7s %6s  %s\n' \
        "$(count '^ +/\*[0-9a-f]{4,}\*/')" "$(count 'HGMMA')" "$(count 'WARPGROUP\.ARRIVE')" \
        "$(count '[[:space:]](BRA|BRX)[[:space:]]')" "$(count 'LDSM')" "$(count 'UTMALDG')" \
        "$(count '[[:space:]](LDL|STL)')" "$c"
done
