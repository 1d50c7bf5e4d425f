#!/usr/bin/env python3
"""Benchmarks mlpc's CPU backend against numpy on the GPT-2 MLP (f32, 768-3072-768, gelu_tanh).

Runs `cargo run --release -p mlpc-cpu --example bench` and, in the same process tree, numpy's
`x @ W.T + b` with a numpy GELU (tanh form) and numpy's GEMMs of the same shapes; prints one
markdown table (date, machine, ours, numpy, ratio). Rounds alternate between the two and each row
keeps its best median, so that a passing load on the machine hurts both sides alike.

A second table times a 4096 -> 4096 Linear (f32, no bias) with its weight pruned to 32 x 32 blocks
at densities 0.5 / 0.25 / 0.1 (by block L2 norm, as `sparsity` prunes): mlpc-cpu's block-sparse
GEMM against its own dense GEMM of the unpruned shape (the 1 / density limit), numpy's dense
`x @ W.T` and scipy's BSR (`bsr_matrix(W, blocksize=(32, 32)) @ x.T`, one thread).

Needs numpy and scipy (and threadpoolctl to name the BLAS kernel):
`pip install numpy scipy threadpoolctl`.

    python3 scripts/bench_cpu.py [--tokens 512] [--runs 30] [--rounds 2] [--bench-bin PATH]
                                 [--update-docs docs/benchmarks.md]
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

# Some machines set these so that old OpenBLAS builds pick safe kernels; they slow a current
# numpy down. Unset here only, for this benchmark, before numpy loads.
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(var, None)

import numpy as np  # noqa: E402

D, H = 768, 3072
# The block-sparse table's Linear, block and densities (as the `bench` example builds them).
S, BLOCK, DENSITIES = 4096, 32, (0.5, 0.25, 0.1)
SCIPY_RUNS = 3
BEGIN, END = "<!-- bench_cpu:begin -->", "<!-- bench_cpu:end -->"


def blas_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS unknown (threadpoolctl not installed)"
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return "{} {} ({} kernel, {} threads)".format(
                lib.get("internal_api"), lib.get("version"), lib.get("architecture"), lib.get("num_threads")
            )
    return "no BLAS found by threadpoolctl"


def machine():
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            if m:
                model = m.group(1).strip()
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return "{}, {} cores usable".format(model, cores)


def median_ms(f, runs, warmup=3):
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def numpy_rows(tokens, runs):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (tokens, D)).astype(np.float32)
    # Scaled before the cast: numpy 2 divides an f32 array by an f64 scalar in f64, which would
    # time numpy's f64 GEMMs against mlpc's f32 ones.
    w1 = (rng.uniform(-1, 1, (H, D)) / np.sqrt(D)).astype(np.float32)
    b1 = rng.uniform(-0.1, 0.1, H).astype(np.float32)
    w2 = (rng.uniform(-1, 1, (D, H)) / np.sqrt(H)).astype(np.float32)
    b2 = rng.uniform(-0.1, 0.1, D).astype(np.float32)
    a = rng.uniform(-1, 1, (tokens, H)).astype(np.float32)
    c = np.float32(np.sqrt(2.0 / np.pi))

    def mlp():
        h = x @ w1.T + b1
        h = 0.5 * h * (1.0 + np.tanh(c * (h + np.float32(0.044715) * h * h * h)))
        return h @ w2.T + b2

    f32(x, w1, b1, w2, b2, a, mlp(), x @ w1.T, a @ w2.T)

    return {
        "mlp": median_ms(mlp, runs),
        "gemm_768x3072": median_ms(lambda: x @ w1.T, runs),
        "gemm_3072x768": median_ms(lambda: a @ w2.T, runs),
    }


def f32(*arrays):
    """Every side of the tables computes in f32, as mlpc does: no array promoted to f64."""
    for a in arrays:
        assert a.dtype == np.float32, "an operand or result is {}, not float32".format(a.dtype)


def pruned(w, block, density):
    """`w` with all but its `round(density * blocks)` blocks of largest L2 norm zeroed (ties to
    the lower row-major block index), as mlpc's `sparsity` prunes."""
    n, k = w.shape
    blocks = w.reshape(n // block, block, k // block, block)
    norms = np.sqrt((blocks.astype(np.float64) ** 2).sum(axis=(1, 3))).ravel()
    keep = np.argsort(-norms, kind="stable")[: int(round(density * norms.size))]
    mask = np.zeros(norms.size, dtype=bool)
    mask[keep] = True
    mask = mask.reshape(n // block, 1, k // block, 1)
    return (blocks * mask).reshape(n, k)


def sparse_rows(tokens, runs):
    """numpy's dense GEMM and scipy's BSR GEMM of the block-sparse table."""
    from scipy.sparse import bsr_matrix

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (tokens, S)).astype(np.float32)
    w = (rng.uniform(-1, 1, (S, S)) / np.sqrt(S)).astype(np.float32)
    f32(x, w, x @ w.T)
    rows = {"linear_4096_dense": median_ms(lambda: x @ w.T, runs)}
    for d in DENSITIES:
        wb = bsr_matrix(pruned(w, BLOCK, d), blocksize=(BLOCK, BLOCK))
        f32(wb, wb @ x.T)
        assert abs(wb.nnz / (S * S) - d) < 1e-3, "the pruned weight keeps {} of its blocks".format(d)
        # Seconds a call: a few runs are enough to tell its time.
        rows["scipy_bsr_d{}".format(d)] = median_ms(lambda: (wb @ x.T).T, SCIPY_RUNS, warmup=1)
    return rows


def mlpc_rows(root, tokens, runs, bench_bin):
    flags = ["--tokens", str(tokens), "--runs", str(runs)]
    if bench_bin:
        cmd = [bench_bin] + flags
    else:
        cmd = ["cargo", "run", "--quiet", "--release", "-p", "mlpc-cpu", "--example", "bench", "--"] + flags
    out = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["name"]] = r["ms"]
    return rows


def table(tokens, ours, theirs, load):
    flops = {
        "mlp": 2 * 2.0 * tokens * D * H,
        "gemm_768x3072": 2.0 * tokens * D * H,
        "gemm_3072x768": 2.0 * tokens * D * H,
    }
    what = {
        "mlp": "GPT-2 MLP f32, T={} (768-3072-768, gelu_tanh), 2 kernels".format(tokens),
        "gemm_768x3072": "GEMM {}x768 @ 768x3072 (x W1^T)".format(tokens),
        "gemm_3072x768": "GEMM {}x3072 @ 3072x768 (h W2^T)".format(tokens),
    }
    goal = {"mlp": 2.0, "gemm_768x3072": 0.6, "gemm_3072x768": 0.6}
    lines = [
        "Date: {}; machine: {}; numpy {} with {}; load average before the run: {}.".format(
            datetime.date.today().isoformat(), machine(), np.__version__, blas_info(),
            ", ".join("{:.2f}".format(v) for v in load),
        ),
        "",
        "| what | mlpc-cpu ms | mlpc-cpu GFLOP/s | numpy ms | numpy GFLOP/s | numpy time / mlpc time | goal |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in ("mlp", "gemm_768x3072", "gemm_3072x768"):
        o, t = ours[k], theirs[k]
        ratio = t / o
        lines.append("| {} | {:.2f} | {:.1f} | {:.2f} | {:.1f} | {:.2f}x {} | >= {}x |".format(
            what[k], o, flops[k] / o / 1e6, t, flops[k] / t / 1e6, ratio,
            "met" if ratio >= goal[k] else "**not met**", goal[k]))
    return "\n".join(lines)


def sparse_table(tokens, ours, theirs):
    from scipy import __version__ as scipy_version

    dense = ours["linear_4096_dense"]
    lines = [
        "Block-sparse Linear 4096 -> 4096, f32, T = {}, 32 x 32 blocks (pruned by block L2 norm); "
        "scipy {} (its BSR product runs on one thread; the best of the rounds' medians of {} runs). "
        "Every side in f32. GFLOP/s count the kept blocks' work.".format(tokens, scipy_version, SCIPY_RUNS),
        "",
        "| density | mlpc-cpu ms | mlpc-cpu GFLOP/s | mlpc-cpu dense / sparse (limit 1 / density) "
        "| numpy dense ms | scipy BSR ms | scipy BSR / mlpc-cpu |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    flops = 2.0 * tokens * S * S
    lines.append("| 1 (dense GEMM) | {:.2f} | {:.1f} | 1.00x | {:.2f} | | |".format(
        dense, flops / dense / 1e6, theirs["linear_4096_dense"]))
    for d in DENSITIES:
        o, b = ours["linear_4096_d{}".format(d)], theirs["scipy_bsr_d{}".format(d)]
        lines.append("| {} | {:.2f} | {:.1f} | {:.2f}x (limit {:.0f}x) | | {:.2f} | {:.1f}x |".format(
            d, o, flops * d / o / 1e6, dense / o, 1 / d, b, b / o))
    return "\n".join(lines)


def update_docs(path, text):
    section = "{}\n### CPU backend (mlpc-cpu) vs numpy and scipy\n\n{}\n{}\n".format(BEGIN, text, END)
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n\n"
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + section + old[old.index(END) + len(END) + 1:]
    else:
        new = old.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(new)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; each row keeps its best median")
    p.add_argument("--bench-bin", metavar="PATH",
                   help="a built `bench` example to run instead of `cargo run` (for a machine without cargo)")
    p.add_argument("--update-docs", metavar="PATH", help="write the table into this markdown file's CPU section")
    a = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours, theirs = {}, {}
    load = os.getloadavg()
    for _ in range(max(1, a.rounds)):
        for k, v in mlpc_rows(root, a.tokens, a.runs, a.bench_bin).items():
            ours[k] = min(v, ours.get(k, v))
        for k, v in list(numpy_rows(a.tokens, a.runs).items()) + list(sparse_rows(a.tokens, a.runs).items()):
            theirs[k] = min(v, theirs.get(k, v))
    text = table(a.tokens, ours, theirs, load) + "\n\n" + sparse_table(a.tokens, ours, theirs)
    print(text)
    if a.update_docs:
        update_docs(os.path.join(root, a.update_docs) if not os.path.isabs(a.update_docs) else a.update_docs, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
