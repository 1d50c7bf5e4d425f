#!/usr/bin/env python3
"""Clock and power of mlpc's GEMMs and cuBLAS's on the same shapes, under sustained load.

Heated, mlpc's GEMMs run slower relative to cuBLAS than from an idle GPU (docs/perf-notes.md,
"Measuring"): the board holds its power limit by lowering the SM clock, so a kernel that draws
more power for the same work runs at a lower clock. This script measures that directly. For each
shape, each side runs back to back for a few seconds (mlpc: `mlpc bench --heat-ms`, then timed
runs; cuBLAS: `torch.mm` the same way, rotating as many weight and input sets), while
`nvidia-smi` samples the SM clock and the board power every 50 ms. It prints, per side, the median
time per GEMM, the median clock and power over the timed part, and the energy per GEMM (power x
time): at equal work, the side with more joules per GEMM is the one the limit slows down more.

usage: power.py --mlpc SIDE [--mlpc SIDE ...] [--out FILE.md] [--shapes 8192x768x3072,...]
(shapes M x K x N, bf16; run from the repository root on a CUDA machine)

SIDE is an mlpc binary, optionally preceded by environment settings for it, as in sweep.sh:
"MLPC_CACHE_DIR=/tmp/tiles-a target/release/mlpc" (one argument): several sides compare builds,
or tiles through an autotune cache each. The cuBLAS row names the kernel torch.mm launched (its
tile, cluster and schedule are in the name); the mlpc rows name their tiles.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import heat, model_file  # noqa: E402

HEAT_S = 2.0
TIMED_S = 2.0


def sampler(path):
    """`nvidia-smi` writing (time, SM MHz, W) every 50 ms to `path` until killed."""
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
         "-lms", "50"], stdout=open(path, "w"), stderr=subprocess.DEVNULL)


def samples(path, start, end):
    """(MHz, W) samples taken between the wall times `start` and `end` (seconds since epoch)."""
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            mhz, watts = float(parts[1]), float(parts[2])
        except ValueError:
            continue
        if start <= stamp <= end:
            out.append((mhz, watts))
    return out


def write_report(path, text):
    """Writes a report's markdown to `path` (creating its folder) and prints it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write(text)
    print(text)


def split_side(side):
    """("VAR=VAL ..." settings as a dict, binary) of a SIDE argument."""
    words = side.split()
    env = dict(w.split("=", 1) for w in words[:-1])
    return env, words[-1]


def mlpc_side(side, path, m, ms_estimate):
    """Runs `mlpc bench` heated for HEAT_S, then about TIMED_S of timed runs; returns (median ms,
    wall start and end of the timed part, the tiles it used)."""
    env, mlpc = split_side(side)
    iters = max(200, int(TIMED_S * 1000 / max(ms_estimate, 1e-3)))
    # The timed part ends with the process (teardown is quick) and lasts about median x iters.
    start = time.time() + HEAT_S
    p = subprocess.run([mlpc, "bench", path, "--bind", f"T={m}", "--heat-ms", str(int(HEAT_S * 1000)),
                        "--iters", str(iters), "--json", "/dev/stdout"], capture_output=True, text=True,
                       env={**os.environ, **env})
    end = time.time()
    if p.returncode != 0:
        raise SystemExit(f"mlpc bench {path} failed: {(p.stderr or p.stdout)[-300:]}")
    res = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    tiles = "; ".join(res.get("tiles", []))
    return res["median_ms"], max(start, end - res["median_ms"] * iters / 1000), end, tiles


def cublas_kernel(m, k, n):
    """The name of the kernel torch.mm launches for this shape (bf16)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    torch.mm(x, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.mm(x, w.t())
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
             and not e.name.startswith(("Memset", "Memcpy"))]
    return names[0] if names else "?"


def weight(n, k, dist):
    """An n x k bf16 weight: `uniform` in +-1/sqrt(k) (nn.Linear's initialisation, and what
    `mlpc bench` generates) or `normal` with standard deviation 1/sqrt(k)."""
    import torch
    if dist == "uniform":
        return ((torch.rand(n, k, device="cuda") * 2 - 1) / k ** 0.5).to(torch.bfloat16)
    return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5


def torch_side(m, k, n, dist):
    """torch.mm heated for HEAT_S, then TIMED_S of runs timed with CUDA events; returns (median ms,
    wall start and end of the timed part). Inputs are standard normal, as `mlpc bench`'s."""
    import torch
    sets = max(2, min(8, int(4e8 // (k * n * 2))))
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    ws = [weight(n, k, dist) for _ in range(sets)]
    i = 0

    def step():
        nonlocal i
        torch.mm(xs[i % 4], ws[i % sets].t())
        i += 1
    heat(step, HEAT_S)
    start = time.time()
    times = []
    while time.time() - start < TIMED_S:
        evs = []
        for _ in range(16):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            evs.append((a, b))
        torch.cuda.synchronize()
        times.extend(a.elapsed_time(b) for a, b in evs)
    return statistics.median(times), start, time.time()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc", action="append", required=True,
                    help="an mlpc binary, optionally preceded by VAR=VAL settings (repeatable)")
    ap.add_argument("--out", default="/tmp/mlpc-gpu/power.md")
    ap.add_argument("--shapes", default="8192x768x3072,8192x3072x768,8192x4096x4096")
    ap.add_argument("--weights", default="uniform",
                    help="cuBLAS weight distributions, comma-separated: uniform (as mlpc's), normal")
    a = ap.parse_args()
    os.environ.setdefault("MLPC_CACHE_DIR", "/tmp/mlpc-cache")
    tmp = tempfile.mkdtemp()
    log = os.path.join(tmp, "smi.csv")
    smi = sampler(log)
    rows = []
    try:
        for shape in a.shapes.split(","):
            m, k, n = (int(x) for x in shape.split("x"))
            flop = 2 * m * k * n
            path = model_file(None, [k, n], "bf16", tmp, f"gemm {shape}")
            kernel = cublas_kernel(m, k, n)
            dists = a.weights.split(",")
            for dist in dists:
                t_ms, s0, s1 = torch_side(m, k, n, dist)
                label = "cuBLAS (torch.mm)" if len(dists) == 1 else f"cuBLAS (torch.mm), {dist} weights"
                rows.append((shape, label, t_ms, s0, s1, flop, kernel))
                time.sleep(1.0)
            for side in a.mlpc:
                ms, s0, s1, tiles = mlpc_side(side, path, m, t_ms)
                label = "mlpc" if len(a.mlpc) == 1 else f"mlpc `{side}`"
                rows.append((shape, label, ms, s0, s1, flop, tiles))
                time.sleep(1.0)
            print(shape, *(r[2] for r in rows[-len(dists) - len(a.mlpc):]), flush=True)
    finally:
        smi.terminate()
        smi.wait()
    import torch
    out = [f"Generated by `scripts/gpu/power.py` on {time.strftime('%Y-%m-%d')}, device: "
           f"{torch.cuda.get_device_name()}. Each side heated {HEAT_S:g} s, then about {TIMED_S:g} s of "
           "timed runs back to back; clock and power: medians of `nvidia-smi` samples (every 50 ms) "
           "over the timed part. Energy per GEMM = power x time. Inputs standard normal; weights "
           "uniform in +-1/sqrt(K) on mlpc's side.\n",
           "| shape (M x K x N) | side | ms | TFLOP/s | SM MHz | W | mJ per GEMM | samples | kernel or tiles |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for shape, side, ms, s0, s1, flop, what in rows:
        got = samples(log, s0, s1)
        mhz = statistics.median(x for x, _ in got) if got else float("nan")
        watts = statistics.median(w for _, w in got) if got else float("nan")
        out.append(f"| {shape} | {side} | {ms:.4f} | {flop / (ms * 1e-3) / 1e12:.0f} | {mhz:.0f} | {watts:.0f} | "
                   f"{watts * ms:.2f} | {len(got)} | {what} |")
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
