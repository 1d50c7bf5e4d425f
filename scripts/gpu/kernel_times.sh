#!/usr/bin/env bash
# Per-kernel durations of one MLP at one token count, mlpc's kernels and PyTorch eager's
# (`F.linear` chain, cuBLAS), from `ncu` with the clocks unlocked (as in the benchmarks), in one
# call on a CUDA machine with Nsight Compute, from the repository root after
# `scripts/gpu/build.sh`. For telling which kernel of a model holds a gap (the shape survey's
# gpt2-mlp at T = 1000, say).
#
#   scripts/gpu/kernel_times.sh MODEL.json T [MLPC ...]
#
# MLPC: one or more mlpc binaries (default target/release/mlpc), each profiled in turn. The model
# must be in the sequential form (`layers`): the eager side builds its `F.linear` chain from them.
# Prints one line per kernel launch of the profiled run: name, grid, duration (us).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
model=$1
t=$2
shift 2
bins=("$@")
[ ${#bins[@]} -eq 0 ] && bins=(target/release/mlpc)
export MLPC_CACHE_DIR=${MLPC_CACHE_DIR:-/tmp/mlpc-cache}
metrics=gpu__time_duration.sum,launch__grid_size
# Prints the launches of ncu's CSV on stdin, one line each: the last $1 of them, or with "third"
# the last third (the last of three runs).
report() {
    python3 -c '
import csv, sys
rows = list(csv.reader(l for l in sys.stdin if l.startswith("\"")))
if not rows:
    sys.exit("no kernels profiled")
head, body = rows[0], rows[1:]
ki, mi, vi, ii = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
by = {}
for r in body:
    by.setdefault(r[ii], {"name": r[ki]})[r[mi]] = r[vi]
launches = list(by.values())
n = len(launches) // 3 if sys.argv[1] == "third" else int(sys.argv[1])
for l in launches[-n:]:
    print("%-90s grid %6s %8.2f us" % (l["name"][:90], l.get("launch__grid_size", "?"),
                                        float(l["gpu__time_duration.sum"].replace(",", "")) / 1000))
' "$1"
}
# The model's GEMMs: one mlpc kernel each.
linears=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(sum(1 for l in m["layers"] if l["op"] == "linear"))' "$model")
for b in "${bins[@]}"; do
    echo "== $b: $model T=$t"
    # Two runs of warm-up (the first builds the graph), then the profiled one (launched kernel by
    # kernel: --no-graphs, so that ncu sees every launch).
    ncu --clock-control none --print-units base --metrics "$metrics" --csv --launch-skip 0 \
        "$b" bench "$model" --bind T="$t" --heat-ms 0 --warmup 2 --iters 1 --no-graphs 2>/dev/null |
        report "$linears"
done
echo "== eager (F.linear chain): $model T=$t"
ncu --clock-control none --print-units base --metrics "$metrics" --csv python3 - "$model" "$t" <<'PY' 2>/dev/null |
import json, sys, torch
import torch.nn.functional as F
m = json.load(open(sys.argv[1])); t = int(sys.argv[2])
dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[m["dtype"]]
acts = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
layers = m["layers"]
x = torch.randn(t, layers[0]["in"], device="cuda", dtype=dt)
steps = []
for l in layers:
    if l["op"] == "linear":
        w = torch.randn(l["out"], l["in"], device="cuda", dtype=dt) / l["in"] ** 0.5
        b = torch.randn(l["out"], device="cuda", dtype=dt) if l.get("bias", True) else None
        steps.append(lambda h, w=w, b=b: F.linear(h, w, b))
    else:
        steps.append(acts[l["op"]])
def run():
    h = x
    for s in steps:
        h = s(h)
    return h
for _ in range(3):
    run()
torch.cuda.synchronize()
PY
    report third
