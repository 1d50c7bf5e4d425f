#!/usr/bin/env python3
"""Hardware counters of mlpc's GEMMs and cuBLAS's on the same shapes, one launch each under `ncu`.

The energy gap under the power limit (docs/perf-notes.md, "Energy per GEMM against cuBLAS") is
in what the kernels move, not in their schedule: this script puts the counters that differ side
by side. For each shape it profiles one launch of cuBLAS's GEMM (`torch.mm`, bf16, the kernel
after one warm-up call) and of each mlpc side's (`mlpc bench`, the wgmma kernel after one
warm-up launch), with `ncu --clock-control none` (the card's clocks are never changed) and its
default cache control (caches flushed before the launch, so both sides start cold), and prints
one table: time, SM cycles, L2 bytes (all, and those requested by the SMs and by the other L2
partition), DRAM bytes read and written, warp instructions, shared memory wavefronts, grid and
cluster size.

usage: counters.py --mlpc SIDE [--mlpc SIDE ...] [--out FILE.md] [--shapes 8192x768x3072,...]
                   [--dtype bf16|f32]
(shapes M x K x N; run from the repository root on a CUDA machine with Nsight Compute). In f32
both sides are exact: TF32 is off for torch.mm (cuBLAS's FFMA kernels), as for the harness's f32
peers, and mlpc's f32 GEMMs run on the FP64 tensor cores (or the FFMA pipes with a side's
`--f32-ffma`-equivalent `MLPC_F32_FP64_TENSOR_CORES=0`).

SIDE is an mlpc binary, optionally preceded by environment settings for it, as in power.py:
"MLPC_CACHE_DIR=/tmp/tiles target/release/mlpc" (one argument). About 10 s per shape and side.
"""
import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import model_file  # noqa: E402
from power import split_side, write_report  # noqa: E402

METRICS = [
    ("gpu__time_duration.sum", "us", 1e-3),
    ("sm__cycles_elapsed.avg", "k cycles", 1e-3),
    ("lts__t_bytes.sum", "L2 MB", 1e-6),
    # L2 sectors (32 bytes) by who asked: the SMs, or the other L2 partition through the fabric
    # between the two halves of the L2 (a line homed in the far half is fetched across it).
    ("lts__t_sectors_srcunit_tex.sum", "L2 MB from SMs", 32e-6),
    ("lts__t_sectors_srcunit_ltcfabric.sum", "L2 MB from the fabric", 32e-6),
    ("dram__bytes_read.sum", "DRAM read MB", 1e-6),
    ("dram__bytes_write.sum", "DRAM write MB", 1e-6),
    ("smsp__inst_executed.sum", "M warp inst", 1e-6),
    ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "M smem wavefronts", 1e-6),
    ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "FMA pipe %", 1.0),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %", 1.0),
    ("launch__grid_size", "grid", 1.0),
    ("launch__block_size", "threads", 1.0),
    ("launch__registers_per_thread", "registers", 1.0),
    ("launch__shared_mem_per_block_dynamic", "dynamic smem KB", 1e-3),
    ("launch__cluster_dim_x", "cluster", 1.0),
]

TORCH_MM = """
import sys, torch
m, k, n = (int(v) for v in sys.argv[1:4])
dt = {"bf16": torch.bfloat16, "f32": torch.float32}[sys.argv[4]]
torch.backends.cuda.matmul.allow_tf32 = False
x = torch.randn(m, k, device="cuda", dtype=dt)
w = ((torch.rand(n, k, device="cuda") * 2 - 1) / k ** 0.5).to(dt)
for _ in range(3):
    torch.mm(x, w.t())
torch.cuda.synchronize()
"""


def parse(text):
    """The name and {metric: value in base units} of the first profiled kernel in `ncu --csv`
    output; raises with the output's tail when there is none."""
    start = text.find('"ID"')
    if start < 0:
        raise RuntimeError("no ncu table in:\n" + text[-1500:])
    values, name, first = {}, None, None
    for row in csv.DictReader(io.StringIO(text[start:])):
        first = row.get("ID") if first is None else first
        if row.get("ID") != first:
            continue
        name = row.get("Kernel Name", name)
        raw = (row.get("Metric Value") or "").replace(",", "")
        try:
            values[row["Metric Name"]] = float(raw)
        except (KeyError, ValueError):
            pass
    if not values:
        raise RuntimeError("no metrics of the profiled launch in:\n" + text[-1500:])
    return name, values


def profile(cmd, kernels, env=None):
    """`ncu` of the second launch whose name matches the regex `kernels` while `cmd` runs."""
    p = subprocess.run(["ncu", "--clock-control", "none", "--csv", "--print-units", "base",
                        "--metrics", ",".join(m for m, _, _ in METRICS), "-k", f"regex:{kernels}",
                        "--launch-skip", "1", "--launch-count", "1", *cmd],
                       capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)
    return parse(p.stdout + "\n" + p.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc", action="append", required=True,
                    help="an mlpc binary, optionally preceded by VAR=VAL settings (repeatable)")
    ap.add_argument("--out", default="/tmp/mlpc-gpu/counters.md")
    ap.add_argument("--shapes", default="8192x768x3072,8192x3072x768,8192x4096x4096")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    a = ap.parse_args()
    if shutil.which("ncu") is None:
        raise SystemExit("ncu (Nsight Compute) not found on PATH")
    os.environ.setdefault("MLPC_CACHE_DIR", "/tmp/mlpc-cache")
    tmp = tempfile.mkdtemp()
    mm = os.path.join(tmp, "mm.py")
    open(mm, "w").write(TORCH_MM)
    rows = []
    for shape in a.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        path = model_file(None, [k, n], a.dtype, tmp, f"gemm {shape}")
        name, v = profile([sys.executable, mm, str(m), str(k), str(n), a.dtype],
                          "nvjet|gemm|xmma|cutlass")
        rows.append((shape, "cuBLAS (torch.mm)", name, v))
        for side in a.mlpc:
            env, binary = split_side(side)
            name, v = profile([binary, "bench", path, "--bind", f"T={m}", "--heat-ms", "0",
                               "--warmup", "1", "--iters", "3"], "mlpc_gemm", env)
            rows.append((shape, "mlpc" if len(a.mlpc) == 1 else f"mlpc `{side}`", name, v))
        print(shape, "done", flush=True)
    import torch
    out = [f"Generated by `scripts/gpu/counters.py` on {time.strftime('%Y-%m-%d')}, device: "
           f"{torch.cuda.get_device_name()}. One launch per row under `ncu --clock-control none` "
           f"(caches flushed before it), {a.dtype}, uniform weights and normal inputs on both sides.\n",
           "| shape (M x K x N) | side | kernel | " + " | ".join(h for _, h, _ in METRICS) + " |",
           "|---|---|---|" + "---:|" * len(METRICS)]
    for shape, side, name, v in rows:
        cells = []
        for metric, _, scale in METRICS:
            x = v.get(metric)
            cells.append("-" if x is None else f"{x * scale:.4g}")
        out.append(f"| {shape} | {side} | {name} | " + " | ".join(cells) + " |")
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
