#!/usr/bin/env python3
"""mlpc on MLP shapes beyond the benchmark table's, against PyTorch eager, in one run on a CUDA
machine (from the repository root, after `scripts/gpu/build.sh`; `run_all.sh survey`):

    python3 scripts/gpu/survey.py --mlpc target/release/mlpc --out docs/benchmarks-shapes.md

The benchmark table (`bench.py`) measures the shapes its goals name, and the tile heuristic was
tuned on them. This survey asks whether the heuristic holds elsewhere: the gated MLPs of other
well-known models, their bare GEMMs, and token counts that are not multiples of the tiles. Each
row is first checked against the reference interpreter (`mlpc check`, fresh random inputs,
outputs poisoned with NaN) at T = 200 and at T = 1024, or at its own T where that is not a
multiple of 128 (the tiles' edges are the point of those rows); the kernels do not depend on T
past the small-T sizes, and 1024 rows give every CTA of the persistent GEMMs several tiles, as
`validate.py` checks the examples. A row that fails its check is reported and not timed. Then
mlpc and eager (`F.linear` chains, cuBLAS) are timed as `bench.py` times them (a second of
heat, do_bench's 25 ms of warm-up and 200 ms of timed runs, each after a 256 MB L2 flush;
medians; rotating weight and input sets). torch.compile is not timed here (it
compiles for tens of seconds per shape; `bench.py` has it for the table's models). The table
goes between the markers of `--out`, the measurements into `<out>.json`; `--render FILE.json`
writes the table again without a GPU.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the harness's timing protocol and peers)

# name, T, dims ([d, h] for a gated MLP, [k, n] for a bare GEMM), activation, gated, bias.
# Gated MLPs are `down(act(gate(x)) * up(x))` without biases, as the models below use them.
SURVEY = [
    ("swiglu 4096-14336 (Mistral-7B, Llama-3-8B)", 4096, [4096, 14336], "silu", True, False),
    ("swiglu 5120-13824 (Llama-2-13B)", 4096, [5120, 13824], "silu", True, False),
    ("swiglu 8192-3584 (Llama-3-70B, an 8-way tensor-parallel shard)", 4096, [8192, 3584], "silu", True, False),
    ("swiglu 2048-8192 (Llama-3.2-1B)", 4096, [2048, 8192], "silu", True, False),
    ("gemm 4096x4096x14336", 4096, [4096, 14336], None, False, False),
    ("gemm 4096x14336x4096", 4096, [14336, 4096], None, False, False),
    ("gemm 4096x5120x13824", 4096, [5120, 13824], None, False, False),
    ("gemm 4096x13824x5120", 4096, [13824, 5120], None, False, False),
    ("llama-swiglu T=3000", 3000, [4096, 11008], "silu", True, False),
    ("gpt2-mlp T=1000", 1000, [768, 3072, 768], "gelu_tanh", False, True),
    ("gpt2-mlp T=5000", 5000, [768, 3072, 768], "gelu_tanh", False, True),
    # Mid-size rows of the table's other plain MLPs (split K, one-tile and short-grid entries).
    ("gpt2-mlp T=2560", 2560, [768, 3072, 768], "gelu_tanh", False, True),
    ("bert-large-ffn T=1000", 1000, [1024, 4096, 1024], "gelu", False, True),
    ("mlp3-relu T=500", 500, [1024, 4096, 4096, 1024], "relu", False, True),
]

BEGIN, END = "<!-- survey:begin -->", "<!-- survey:end -->"


def model_json(dims, act, gated, bias):
    """The model of a survey row: a gated MLP in graph form, or a `layers` chain."""
    if gated:
        d, h = dims
        return {"mlpc": 1, "name": "survey", "dtype": "bf16", "seed": 0,
                "params": {"gate.weight": [h, d], "up.weight": [h, d], "down.weight": [d, h]},
                "inputs": {"x": {"shape": ["T", d]}},
                "nodes": [
                    {"name": "gate.t", "op": "transpose", "inputs": ["gate.weight"]},
                    {"name": "up.t", "op": "transpose", "inputs": ["up.weight"]},
                    {"name": "down.t", "op": "transpose", "inputs": ["down.weight"]},
                    {"name": "g", "op": "matmul", "inputs": ["x", "gate.t"]},
                    {"name": "u", "op": "matmul", "inputs": ["x", "up.t"]},
                    {"name": "a", "op": act, "inputs": ["g"]},
                    {"name": "h", "op": "mul", "inputs": ["a", "u"]},
                    {"name": "y", "op": "matmul", "inputs": ["h", "down.t"]}],
                "outputs": ["y"]}
    layers = []
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append({"op": "linear", "name": f"fc{k}", "in": i, "out": o, "bias": bias})
        if act and k < len(dims) - 2:
            layers.append({"op": act})
    return {"mlpc": 1, "name": "survey", "dtype": "bf16", "seed": 0,
            "inputs": {"x": {"shape": ["T", dims[0]]}}, "layers": layers}


def check_sizes(T):
    """The token counts a row is checked at (see the module's comment)."""
    return sorted({200, T if T % 128 else min(T, 1024)})


def check(mlpc, path, T):
    """`mlpc check` on the CUDA backend at `check_sizes(T)`: None, or what failed."""
    for t in check_sizes(T):
        p = subprocess.run([mlpc, "check", path, "--backend", "cuda", "--bind", f"T={t}"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return f"T={t}: " + (p.stderr or p.stdout).strip()[-300:]
    return None


def entry_tag(launch):
    """`kernel: mlpc_..._wgmma_tma_128x192x64_short_splitk, grid 96x1x1` -> `128x192x64_short_splitk
    (96 CTAs)`: the entry's tile and kind, and its grid."""
    kernel, _, rest = launch.partition(": ")
    entry, _, grid = rest.partition(", grid ")
    tag = entry.split("_wgmma_tma_")[-1] if "_wgmma_tma_" in entry else entry
    x = grid.split("x")[0] if grid else "?"
    return f"{tag} ({x} CTAs)"


def table(rows):
    run = {(r["date"], r["device"], r["torch"]) for r in rows}
    lines = []
    for date, device, torch in sorted(run):
        lines.append(f"Generated by `scripts/gpu/survey.py` on {date}, device: {device}, PyTorch {torch}. "
                     "Each row checked against the reference interpreter first (`mlpc check` at T = 200 "
                     "and 1024, or the row's own T where it is not a multiple of 128), then timed as "
                     "`bench.py` times its rows (a second of heat, do_bench's 25 ms of "
                     "warm-up and 200 ms of timed runs, each after a 256 MB L2 flush; medians). eager: "
                     "`F.linear` chains (cuBLAS). Ratio: eager time / mlpc time (above 1: mlpc faster).")
    lines += ["", "| shape | T | kernels | checked | mlpc ms | TFLOP/s | eager ms | TFLOP/s eager | eager / mlpc | tiles (entries, where recorded) |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r.get("mlpc")
        tf = lambda ms: f"{r['flops'] / (ms * 1e-3) / 1e12:.1f}" if ms else "-"
        mlpc_ms = m["median_ms"] if m else None
        eager = r.get("eager_ms")
        ratio = f"{eager / mlpc_ms:.2f}" if (eager and mlpc_ms) else "-"
        checked = "ok" if not r.get("check_error") else "FAILED: " + r["check_error"].replace("|", "/")[:120]
        # "kernel  [dtype kind K N]  tile  (source)": the shape and the tile.
        tiles = "; ".join(" ".join(t.split("  ")[1:3]) for t in (m or {}).get("tiles", []))
        # Runs since `bench --json` records them: the entry each kernel ran ("kernel: entry, grid
        # XxYxZ"), by its tile part (the small-M, split-K, one-tile and short-grid entries).
        launches = (m or {}).get("launches")
        if launches:
            tiles = "; ".join(entry_tag(l) for l in launches)
        kernels = m["kernels"] if m else None
        kernels = len(kernels) if isinstance(kernels, list) else kernels
        lines.append(f"| {r['name']} | {r['T']} | {kernels if m else '-'} | {checked} | "
                     f"{f'{mlpc_ms:.4f}' if mlpc_ms else r.get('error') or '-'} | {tf(mlpc_ms)} | "
                     f"{f'{eager:.4f}' if eager else '-'} | {tf(eager)} | {ratio} | {tiles or '-'} |")
    return "\n".join(lines) + "\n"


def write(out, rows):
    bench.write_section(out, table(rows), BEGIN, END, title="# Shape survey", heading=None)
    with open(out.replace(".md", ".json"), "w") as f:
        json.dump(dict(rows=rows), f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--render", help="write the table from this measurements file instead of measuring")
    ap.add_argument("--only", default="", help="comma-separated row names")
    a = ap.parse_args()
    if a.render:
        write(a.out, json.load(open(a.render))["rows"])
        return
    if not a.mlpc:
        ap.error("--mlpc is required unless --render is given")
    tmp = tempfile.mkdtemp()
    rows, timed = [], []
    for i, (name, T, dims, act, gated, bias) in enumerate(SURVEY):
        if a.only and name not in a.only.split(","):
            continue
        path = os.path.join(tmp, f"survey{i}.json")
        json.dump(model_json(dims, act, gated, bias), open(path, "w"))
        row = dict(name=name, T=T, dims=dims, act=act, gated=gated, bias=bias, dtype="bf16",
                   flops=bench.flops(T, dims, gated))
        row["check_error"] = check(a.mlpc, path, T)
        if row["check_error"]:
            print(name, "check failed:", row["check_error"], flush=True)
        else:
            row["mlpc"], row["error"] = bench.bench_mlpc(a.mlpc, path, T, "auto")
            print(name, "mlpc", row["mlpc"] and row["mlpc"]["median_ms"], row["error"] or "", flush=True)
            timed.append(row)
        rows.append(row)
    # mlpc's side first (a run cut short by a time limit still leaves its checks and times).
    today = datetime.date.today().isoformat()
    for r in rows:
        r.update(date=today, device="-", torch="-")
    write(a.out, rows)
    _, dev, torch_version = bench.peers(timed, no_compile=True)
    for r in rows:
        r.update(device=dev, torch=torch_version)
    write(a.out, rows)


if __name__ == "__main__":
    main()
