#!/usr/bin/env python3
"""mlpc against its PyTorch peers, in one run on one CUDA machine.

Rows named `bsr ...` prune the weight of a single linear to the given block density: their peers are
the dense GEMM of the same unpruned shape (eager) and torch's BSR matmul (compile column).
For each model: `mlpc bench` (CUDA events around each run after a second of heat and warm-up,
median, rotating weight and input sets, random data) and, in this same process right after it,
PyTorch eager (`F.linear` + activation) and torch.compile (default mode; with `--max-autotune`, also
mode="max-autotune" for the rows named, or `all` dense rows: tens of seconds of compilation each) on
the same shapes with rotating input/weight sets, timed with triton's do_bench (CUDA events, median)
after the same second of heat (`heated_bench`). `--rounds N` times each row N times over, mlpc and
then its peers in every round, and keeps each side's middle round: the card's clocks drift over
minutes under its power limit, and a row's sides timed together see the same drift. Writes one
markdown table: ours, each peer, ratios, TFLOP/s, % of the bf16 peak measured in the same run (an
8192^3 cuBLAS GEMM).

usage: bench.py --mlpc BIN --out REPORT.md [--only NAME,...] [--merge] [--rounds N] [--no-compile] [--max-autotune NAME,...|all]
       bench.py --render docs/benchmarks.json --out docs/benchmarks.md

The measurements go to `<out>.json` (REPORT.json), each row with the run it came from (date,
device, PyTorch, the bf16 peak of that run). `--merge` (with `--only`) keeps the rows of the
existing measurements file that this run does not measure, so that a short run can refresh some
rows; a table whose rows come from more than one run says so and names each row's run (every
ratio is still between times of one run). `--render` writes the table again from a measurements
file, without a GPU.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import tempfile

# name: (model.json or None for a generated one, T, dims, activation, gated, bias, dtype)
MODELS = [
    ("gpt2-mlp", "examples/gpt2-mlp/model.json", 8192, [768, 3072, 768], "gelu_tanh", False, True, "bf16"),
    ("bert-large-ffn", "examples/bert-large-ffn/model.json", 8192, [1024, 4096, 1024], "gelu", False, True, "bf16"),
    ("seed-geglu", "examples/seed-geglu/model.json", 8192, [768, 3072, 768], "gelu_tanh", True, False, "bf16"),
    ("mlp3-relu", "examples/mlp3-relu/model.json", 8192, [1024, 4096, 4096, 1024], "relu", False, True, "bf16"),
    ("llama-swiglu", "examples/llama-swiglu/model.json", 4096, [4096, 11008, 4096], "silu", True, False, "bf16"),
    ("gemm 8192x768x3072", None, 8192, [768, 3072], None, False, False, "bf16"),
    ("gemm 8192x3072x768", None, 8192, [3072, 768], None, False, False, "bf16"),
    # llama-swiglu's GEMMs: the gate and up projections' shape, and the down projection's.
    ("gemm 4096x4096x11008", None, 4096, [4096, 11008], None, False, False, "bf16"),
    ("gemm 4096x11008x4096", None, 4096, [11008, 4096], None, False, False, "bf16"),
    # The GEMMs of mlp3-relu and bert-large-ffn (the first and the last are both models').
    ("gemm 8192x1024x4096", None, 8192, [1024, 4096], None, False, False, "bf16"),
    ("gemm 8192x4096x4096", None, 8192, [4096, 4096], None, False, False, "bf16"),
    ("gemm 8192x4096x1024", None, 8192, [4096, 1024], None, False, False, "bf16"),
    ("llama-swiglu T=16", "examples/llama-swiglu/model.json", 16, [4096, 11008, 4096], "silu", True, False, "bf16"),
    ("gpt2-mlp T=16", "examples/gpt2-mlp/model.json", 16, [768, 3072, 768], "gelu_tanh", False, True, "bf16"),
    ("llama-swiglu T=1", "examples/llama-swiglu/model.json", 1, [4096, 11008, 4096], "silu", True, False, "bf16"),
    ("gpt2-mlp T=1", "examples/gpt2-mlp/model.json", 1, [768, 3072, 768], "gelu_tanh", False, True, "bf16"),
    ("gemm 4096^3 dense", None, 4096, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.5", None, 4096, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.25", None, 4096, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.1", None, 4096, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.25 f32", None, 4096, [4096, 4096], None, False, False, "f32"),
    # Decode sizes: mlpc's block-sparse small-M entries against the dense GEMV of the unpruned
    # weight (`eager`) and torch's BSR matmul.
    ("bsr 4096^2 b32 d=0.25 T=1", None, 1, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.25 T=16", None, 16, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.1 T=16", None, 16, [4096, 4096], None, False, False, "bf16"),
    # Mid sizes: the narrow groups' short grids (a few row tiles on the whole device).
    ("bsr 4096^2 b32 d=0.25 T=256", None, 256, [4096, 4096], None, False, False, "bf16"),
    ("bsr 4096^2 b32 d=0.25 T=512", None, 512, [4096, 4096], None, False, False, "bf16"),
    ("gpt2-mlp f32", "examples/gpt2-mlp/model.json", 8192, [768, 3072, 768], "gelu_tanh", False, True, "f32"),
    ("bert-large-ffn f32", "examples/bert-large-ffn/model.json", 8192, [1024, 4096, 1024], "gelu", False, True, "f32"),
    ("seed-geglu f32", "examples/seed-geglu/model.json", 8192, [768, 3072, 768], "gelu_tanh", True, False, "f32"),
    ("mlp3-relu f32", "examples/mlp3-relu/model.json", 8192, [1024, 4096, 4096, 1024], "relu", False, True, "f32"),
    ("llama-swiglu f32", "examples/llama-swiglu/model.json", 4096, [4096, 11008, 4096], "silu", True, False, "f32"),
    # f16 runs the same Hopper kernels as bf16 (no goal of its own; users of f16 models see its
    # speed here).
    ("gpt2-mlp f16", "examples/gpt2-mlp/model.json", 8192, [768, 3072, 768], "gelu_tanh", False, True, "f16"),
    ("bert-large-ffn f16", "examples/bert-large-ffn/model.json", 8192, [1024, 4096, 1024], "gelu", False, True, "f16"),
    ("mlp3-relu f16", "examples/mlp3-relu/model.json", 8192, [1024, 4096, 4096, 1024], "relu", False, True, "f16"),
]


def model_file(src, dims, dtype, tmp, name):
    """The model.json to bench: the example with its dtype changed, or a single bias-free linear."""
    if src is None:
        m = {"mlpc": 1, "name": name.replace(" ", "-"), "dtype": dtype, "seed": 0,
             "inputs": {"x": {"shape": ["T", dims[0]]}},
             "layers": [{"op": "linear", "name": "fc", "in": dims[0], "out": dims[1], "bias": False}]}
        if name.startswith("bsr"):
            density = float(name.split("d=")[1].split()[0])
            m["sparsity"] = {"fc.weight": {"block": [32, 32], "density": density}}
    else:
        m = json.load(open(src))
        m["dtype"] = dtype
    path = os.path.join(tmp, name.replace(" ", "_").replace("=", "") + ".json")
    json.dump(m, open(path, "w"))
    return path


def flops(T, dims, gated):
    if gated:
        return 2 * T * dims[0] * dims[1] * 3
    return sum(2 * T * i * o for i, o in zip(dims[:-1], dims[1:]))


# Seconds of untimed runs, back to back, before every timing, mlpc's (`--heat-ms`) and each
# peer's: an H200 running large GEMMs drops from 1980 MHz to about 1500 under its 700 W limit
# within a second, so a timing that starts on an idle GPU measures boost clocks for a while and
# then throttled ones, by how long it runs (docs/perf-notes.md, "Measuring"). Heated first,
# every side is timed at the clocks of sustained load. Under that limit the duty cycle sets the
# clocks too: do_bench zeroes a 256 MB buffer between the runs it times (an L2 flush), so mlpc's
# timed runs get the same (`--flush-l2`).
HEAT_S = 1.0
# do_bench's phases, which `heated_bench` times the peers with and `mlpc bench` is given too
# (`--warmup-ms` / `--rep-ms`): 25 ms of warm-up and 200 ms of timed runs, counted from an estimate
# of one run with its flush. Under the power limit the clocks follow the load over a few hundred
# ms, so both sides must spend as long at the same duty cycle: before 2026-12-01 mlpc timed 200
# runs (about 27 ms for a 0.06 ms GEMM with its flush) where do_bench timed about 1500.
WARMUP_MS = 25
REP_MS = 200


def heat(fn, seconds=HEAT_S):
    """Runs `fn` back to back for `seconds` (in batches, each waited for, that double while they
    take under 10 ms)."""
    import time
    import torch
    torch.cuda.synchronize()
    start = time.perf_counter()
    batch = 1
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        if time.perf_counter() - t0 < 0.01:
            batch *= 2


def heated_bench(fn, warmup=WARMUP_MS, rep=REP_MS):
    """triton's do_bench median of `fn` after HEAT_S seconds of `fn` back to back."""
    from triton.testing import do_bench
    heat(fn)
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


# The error of a row a `+fp64` / `+ffma` target does not time (the options change f32 GEMMs only).
NOT_F32 = "not timed: the +fp64 / +ffma targets time the f32 rows only"
# The f32 GEMM kernel a target's suffix forces.
F32_OPTIONS = {"": [], "fp64": ["--f32-fp64-tensor-cores"], "ffma": ["--f32-ffma"]}


def bench_mlpc(mlpc, path, T, target, warmup_ms=WARMUP_MS, rep_ms=REP_MS):
    # TARGET, or TARGET+fp64 / TARGET+ffma: every f32 GEMM forced onto the FP64 tensor cores
    # (`--f32-fp64-tensor-cores`) or the FFMA pipes (`--f32-ffma`).
    base, _, option = target.partition("+")
    flags = ([] if base == "auto" else ["--target", base]) + F32_OPTIONS[option]
    p = subprocess.run([mlpc, "bench", path, "--bind", f"T={T}", "--warmup-ms", str(warmup_ms), "--rep-ms", str(rep_ms),
                        "--heat-ms", str(int(HEAT_S * 1000)), "--flush-l2", *flags, "--json", "/dev/stdout"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip()[-300:]
    line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line), None


def measure_peak():
    """The bf16 peak of this run: TFLOP/s of a heated 8192^3 cuBLAS GEMM."""
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    peak_ms = heated_bench(lambda: a @ b)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192 ** 3 / (peak_ms * 1e-3) / 1e12


class RowPeers:
    """The PyTorch peers of one row, set up once (inputs, weights, torch.compile's compilations)
    and then timed as often as `time` is called: `eager` (`F.linear` chains), `compile`
    (torch.compile's default mode; for `bsr` rows torch's BSR matmul) and, for the rows named in
    `max_autotune` (or every dense row for `("all",)`), `autotune` (torch.compile
    mode="max-autotune", which compiles and benchmarks GEMM candidates for tens of seconds per
    model)."""

    def __init__(self, r, no_compile, max_autotune=()):
        import torch
        import torch.nn.functional as F
        acts = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
                "silu": F.silu, None: lambda t: t}
        dts = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        T, dims, act, gated, bias, dn = r["T"], r["dims"], r["act"], r["gated"], r["bias"], r["dtype"]
        dt = dts[dn]
        f = acts[act]
        wbytes = sum(i * o for i, o in zip(dims[:-1], dims[1:])) * (3 if gated else 1) * dt.itemsize
        sets = max(2, min(8, int(4e8 // max(wbytes, 1))))
        xs = [torch.randn(T, dims[0], device="cuda", dtype=dt) for _ in range(sets)]
        if gated:
            d, h = dims[0], dims[1]
            ws = [(torch.randn(h, d, device="cuda", dtype=dt) / d ** 0.5, torch.randn(h, d, device="cuda", dtype=dt) / d ** 0.5,
                   torch.randn(d, h, device="cuda", dtype=dt) / h ** 0.5) for _ in range(sets)]
        else:
            ws = [[(torch.randn(o, i, device="cuda", dtype=dt) / i ** 0.5,
                    torch.randn(o, device="cuda", dtype=dt) * 0.1 if bias else None) for i, o in zip(dims[:-1], dims[1:])]
                  for _ in range(sets)]

        def fwd(x, w):
            if gated:
                g, u, dn_ = w
                return F.linear(f(F.linear(x, g)) * F.linear(x, u), dn_)
            for k, (wt, bb) in enumerate(w):
                x = F.linear(x, wt, bb)
                if k < len(w) - 1:
                    x = f(x)
            return x

        def rotating(fn):
            i = [0]

            def step():
                fn(i[0] % sets)
                i[0] += 1
            return step
        # name -> (the function do_bench times, do_bench's warm-up and timed ms)
        self.sides = {"eager": (rotating(lambda k: fwd(xs[k], ws[k])), WARMUP_MS, REP_MS)}
        self.errors = {}
        if r["name"].startswith("bsr"):
            # torch's BSR matmul on weights pruned as mlpc prunes them (prune-block-sparse):
            # the round(d * B) 32 x 32 blocks of largest L2 norm of a random weight, exactly
            # that many every set, rotating over the same number of sets as the other peers
            # and timed for do_bench's 25 / 200 ms like every other side.
            density = float(r["name"].split("d=")[1].split()[0])
            n, b = dims[0], 32
            blocks = (n // b) * (n // b)
            count = min(blocks, int(density * blocks + 0.5))
            wbs, xts = [], []
            for k in range(sets):
                w = torch.randn(n, n, device="cuda", dtype=dt) / n ** 0.5
                norms = w.float().reshape(n // b, b, n // b, b).pow(2).sum(dim=(1, 3)).flatten()
                keep = torch.zeros(blocks, dtype=torch.bool, device="cuda")
                keep[torch.topk(norms, count).indices] = True
                mask = keep.reshape(n // b, n // b).repeat_interleave(b, 0).repeat_interleave(b, 1)
                wbs.append((w * mask).to_sparse_bsr((b, b)))
                xts.append(xs[k].t().contiguous())
                del w, mask
            self.sides["compile"] = (rotating(lambda k: wbs[k] @ xts[k]), WARMUP_MS, REP_MS)
            return
        if not no_compile:
            comp = torch.compile(fwd)
            for k in range(sets):
                comp(xs[k], ws[k])
            self.sides["compile"] = (rotating(lambda k: comp(xs[k], ws[k])), WARMUP_MS, REP_MS)
        if "all" in max_autotune or r["name"] in max_autotune:
            try:
                tuned = torch.compile(fwd, mode="max-autotune")
                for k in range(sets):
                    tuned(xs[k], ws[k])
                self.sides["autotune"] = (rotating(lambda k: tuned(xs[k], ws[k])), WARMUP_MS, REP_MS)
            except Exception as e:  # a peer that fails to compile is reported, not fatal
                self.errors["autotune"] = str(e)[:200]
                print(r["name"], "max-autotune failed:", self.errors["autotune"], flush=True)

    def time(self):
        """Each side's median ms, each timed after its own second of heat (`heated_bench`)."""
        return {name: heated_bench(fn, warmup=warmup, rep=rep) for name, (fn, warmup, rep) in self.sides.items()}

    def close(self):
        import torch
        self.sides.clear()
        torch.cuda.empty_cache()


BEGIN, END = "<!-- bench_gpu:begin -->", "<!-- bench_gpu:end -->"


def write_section(path, text, begin=BEGIN, end=END, title="# Benchmarks", heading="## GPU"):
    """Puts `text` between the markers `begin` and `end` of `path` (the GPU ones by default),
    keeping the rest of the file; a file without them gets `heading` and the markers at its end,
    a new file `title` first."""
    try:
        doc = open(path).read()
    except FileNotFoundError:
        doc = f"{title}\n"
    if begin not in doc or end not in doc:
        section = f"{heading}\n\n" if heading else ""
        doc = doc.rstrip() + f"\n\n{section}{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


def run_of(r):
    """The run a row was measured in: (date, device, PyTorch version, bf16 peak, seconds of heat
    before each timing (0 for runs from before the heat), mlpc's warm-up and timed phases in ms
    (None for runs that counted mlpc's runs instead), rounds per row (None for runs that timed
    every row's mlpc side before any peer))."""
    sized = r.get("sized_ms")
    return (r["date"], r["device"], r["torch"], r["peak_tflops"], r.get("heat_s", 0), tuple(sized) if sized else None,
            r.get("rounds"))


def rounds_note(rounds):
    """How a run ordered its timings, for runs that timed each row's sides together."""
    if rounds is None:
        return ""
    if rounds == 1:
        return "each row's sides timed one after the other (mlpc, then its peers)"
    return (f"each row timed in {rounds} rounds of its sides one after the other (mlpc, then its peers), each side "
            "keeping its middle round")


def sized_note(sized):
    """How long mlpc's warm-up and timed phases ran, for runs that sized them as do_bench does."""
    if not sized:
        return ""
    return (f"mlpc's warm-up and timed runs sized as do_bench sizes the peers' ({sized[0]} ms and {sized[1]} ms, "
            "counted from an estimate of one run with its flush: `--warmup-ms` / `--rep-ms`)")


def timing_note(heat, sized=None):
    """How the times of a run were taken."""
    if heat and sized:
        return (f"Medians of CUDA-event timings after {heat:g} s of untimed runs back to back (every side, mlpc "
                "and each peer, timed at the clocks of sustained load, which this card's power limit holds well "
                "below its boost clock on large GEMMs), a 256 MB buffer zeroed before every timed run on both "
                "sides (do_bench's L2 flush; mlpc's `--flush-l2`), " + sized_note(sized) + ", rotating weight "
                "and input sets (random data). ")
    if heat:
        return (f"Medians of CUDA-event timings after {heat:g} s of untimed runs back to back (every side, mlpc "
                "and each peer, timed at the clocks of sustained load, which this card's power limit holds well "
                "below its boost clock on large GEMMs) and warm-up, a 256 MB buffer zeroed before every timed run "
                "on both sides (do_bench's L2 flush; mlpc's `--flush-l2`), rotating weight and input sets (random "
                "data). ")
    return "Medians of CUDA-event timings after warm-up, rotating weight and input sets (random data). "


def table(rows, targets):
    """The markdown lines of the report."""
    runs = []
    for r in rows:
        if run_of(r) not in runs:
            runs.append(run_of(r))
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    arch = [t.split(":")[-1] for t in targets]
    tuned = any("autotune_ms" in r or "autotune_error" in r for r in rows)
    head = "| model | dtype | T | kernels | " + " | ".join(
        f"mlpc {x} ms | TFLOP/s {x} | % peak {x}" for x in arch) + \
        " | host us/run | eager ms | compile ms | eager / mlpc | compile / mlpc |" + \
        (" max-autotune ms | max-autotune / mlpc |" if tuned else "")
    compile_note = ("torch.compile in its default mode, and with mode=\"max-autotune\" for the rows that show "
                    "it (`--max-autotune`; it compiles and benchmarks GEMM candidates for tens of seconds per model). "
                    if tuned else
                    "torch.compile in its default mode (max-autotune was not run: it compiles for tens of seconds per "
                    "model; `--max-autotune` adds it). ")
    if len(runs) == 1:
        date, dev, torch_version, peak, heat, sized, rounds = runs[0]
        origin = (f"Generated by `scripts/gpu/bench.py` on {date}, device: {dev}, PyTorch {torch_version}. "
                  + timing_note(heat, sized)
                  + (rounds_note(rounds)[0].upper() + rounds_note(rounds)[1:] + ". " if rounds is not None else "") +
                  f"bf16 peak measured in the same run (8192^3 cuBLAS GEMM): {peak:.0f} TFLOP/s. ")
    else:
        origin = ("Generated by `scripts/gpu/bench.py` from " + str(len(runs)) + " runs (`--merge`), named in the "
                  "`run` column: " + "; ".join(
                      f"{letters[i]}: {d}, {dev}, PyTorch {tv}, bf16 peak {pk:.0f} TFLOP/s"
                      + (f", {ht:g} s of untimed runs before each timing (mlpc's and the peers')" if ht else "")
                      + (", " + sized_note(sz) if sz else "")
                      + (", " + rounds_note(rd) if rd is not None else "")
                      for i, (d, dev, tv, pk, ht, sz, rd) in enumerate(runs))
                  + ". Each row's times, peers and ratios come from its own run (its % peak from that run's peak, "
                  "an 8192^3 cuBLAS GEMM). " + timing_note(0))
        head = "| run " + head
    out = ["",
           origin + compile_note +
           "Rows named `bsr ...` prune a 4096x4096 linear to that density of 32x32 blocks: their `eager` is the dense "
           "GEMM of the unpruned shape and their `compile` column is torch's BSR matmul; their TFLOP/s count the "
           "dense-equivalent work. Ratios are peer time / the best mlpc time (above 1: mlpc faster); host us/run is "
           "the host time of one `run` call (guards, allocation, launches) for the first target.\n",
           head,
           "|" + "---|" * (3 if len(runs) == 1 else 4) + "---:|" * (1 + 3 * len(targets) + 5 + (2 if tuned else 0))]
    for r in rows:
        peak = r["peak_tflops"]
        cells = [r["name"], r["dtype"], str(r["T"])]
        if len(runs) > 1:
            cells.insert(0, letters[runs.index(run_of(r))])
        done = [r["mlpc"].get(t) for t in targets]
        kern = next((len(m["kernels"]) for m in done if m), None)
        cells.append("-" if kern is None else str(kern))
        best = None
        for t, m in zip(targets, done):
            if m is None:
                err = (r["error"].get(t) or "").replace("|", "/")[:80]
                cells += ["-", "-", "-"] if err == NOT_F32 else [f"failed: {err}", "", ""]
                continue
            ms = m["median_ms"]
            tf = r["flops"] / (ms * 1e-3) / 1e12
            cells += [f"{ms:.4f}", f"{tf:.1f}", f"{100 * tf / peak:.0f}%"]
            best = ms if best is None else min(best, ms)
        host = done[0]["host_us"] if done[0] else float("nan")
        e, c = r.get("eager_ms"), r.get("compile_ms")
        cells += [f"{host:.1f}", f"{e:.4f}", "-" if c is None else f"{c:.4f}",
                  "-" if best is None else f"{e / best:.2f}", "-" if (best is None or c is None) else f"{c / best:.2f}"]
        if tuned:
            a = r.get("autotune_ms")
            if a is None:
                cells += ["failed" if "autotune_error" in r else "-", "-"]
            else:
                cells += [f"{a:.4f}", "-" if best is None else f"{a / best:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def write_report(out, rows, targets):
    """The table into the GPU section of `out`, the measurements into `<out>.json`."""
    write_section(out, "\n".join(table(rows, targets)[1:]).strip() + "\n")
    with open(out.replace(".md", ".json"), "w") as f:
        json.dump(dict(targets=targets, rows=rows), f, indent=1)


def load_report(path):
    """Rows and targets of a measurements file (files from before per-row runs carry the run at
    the top level and no targets: `auto`)."""
    data = json.load(open(path))
    rows = data["rows"]
    for r in rows:
        for key, top in (("date", "date"), ("device", "device"), ("torch", "torch"), ("peak_tflops", "peak_tflops")):
            if key not in r:
                if top not in data:
                    raise SystemExit(f"{path}: row `{r['name']}` has no `{key}` and the file no top-level `{top}`")
                r[key] = data[top]
    return rows, data.get("targets", ["auto"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--render", help="write the table from this measurements file instead of measuring")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of <out>.json that this run does not measure (use with --only)")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each row this many times over, mlpc and then its peers in every round; each side "
                         "keeps its middle round (default 1)")
    ap.add_argument("--max-autotune", default="",
                    help="comma-separated row names (or `all`: every dense row) to also time with torch.compile "
                         "mode=\"max-autotune\"; tens of seconds of compilation per model")
    ap.add_argument("--targets", default="auto",
                    help="comma-separated CUDA targets to time mlpc for; `auto` is mlpc's default (the GPU's own "
                         "architecture: sm_90a on Hopper); add `cuda:sm_90` to time the portable mma.sync family too, "
                         "`auto+ffma` / `auto+fp64` to time the f32 rows with every f32 GEMM forced onto the "
                         "FFMA pipes (`--f32-ffma`) / the FP64 tensor cores (`--f32-fp64-tensor-cores`)")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    only = [x for x in a.only.split(",") if x] if a.only else []
    unknown = [x for x in only if x not in [m[0] for m in MODELS]]
    if unknown:
        # A misspelt row would otherwise leave the table as it was (--merge) or empty it.
        raise SystemExit("--only: no row named " + ", ".join(repr(x) for x in unknown)
                         + "; the rows are: " + ", ".join(m[0] for m in MODELS))
    if a.render:
        rows, targets = load_report(a.render)
        write_report(a.out, rows, targets)
        return
    if not a.mlpc:
        ap.error("--mlpc is required unless --render is given")
    targets = a.targets.split(",")
    for t in targets:
        if t.partition("+")[2] not in F32_OPTIONS:
            ap.error(f"--targets: {t}: the suffix must be +fp64 or +ffma")
    kept = []
    if a.merge:
        old = a.out.replace(".md", ".json")
        if os.path.exists(old):
            kept, old_targets = load_report(old)
            if old_targets != targets:
                raise SystemExit(f"--merge: {old} was measured for targets {old_targets}, this run for {targets}")
    tmp = tempfile.mkdtemp()
    autotune = tuple(x for x in a.max_autotune.split(",") if x)
    import torch
    peak, dev, torch_version = measure_peak(), torch.cuda.get_device_name(), torch.__version__
    today = datetime.date.today().isoformat()
    rows = []
    for name, src, T, dims, act, gated, bias, dtype in MODELS:
        if only and name not in only:
            continue
        path = model_file(src, dims, dtype, tmp, name)
        row = dict(name=name, T=T, dims=dims, act=act, gated=gated, bias=bias, dtype=dtype,
                   flops=flops(T, dims, gated), mlpc={}, error={})
        peers = RowPeers(row, a.no_compile, autotune)
        # Every round times mlpc (each target) and then the peers, back to back, so that a drift
        # of the card lands on both sides of a ratio alike; each side keeps its middle round.
        done = {t: [] for t in targets}
        peer_ms = {}
        for k in range(a.rounds):
            for target in targets:
                if "+" in target and dtype != "f32":
                    row["error"][target] = NOT_F32
                    continue
                if row["error"].get(target):
                    continue
                res, err = bench_mlpc(a.mlpc, path, T, target)
                if err:
                    row["error"][target] = err
                else:
                    done[target].append(res)
                print(name, target, f"round {k + 1}", "mlpc", res and res["median_ms"], err or "", flush=True)
            for side, ms in peers.time().items():
                peer_ms.setdefault(side, []).append(ms)
            print(name, f"round {k + 1}", *(f"{s} {v[-1]:.4f}" for s, v in peer_ms.items()), flush=True)
        peers.close()
        for target in targets:
            res = done[target]
            row["error"].setdefault(target, None)
            row["mlpc"][target] = (sorted(res, key=lambda m: m["median_ms"])[(len(res) - 1) // 2]
                                   if res and not row["error"][target] else None)
        for side, ms in peer_ms.items():
            row[side + "_ms"] = statistics.median_low(ms)
        if "autotune" in peers.errors:
            row["autotune_error"] = peers.errors["autotune"]
        row.update(date=today, device=dev, torch=torch_version, peak_tflops=peak, heat_s=HEAT_S,
                   sized_ms=[WARMUP_MS, REP_MS], rounds=a.rounds,
                   round_ms={**{f"mlpc {t}": [m["median_ms"] for m in done[t]] for t in targets if done[t]},
                             **peer_ms})
        rows.append(row)
    # The measured rows replace the kept ones of the same name; the table keeps MODELS' order.
    fresh = {r["name"]: r for r in rows}
    merged = {r["name"]: r for r in kept}
    merged.update(fresh)
    order = [m[0] for m in MODELS]
    rows = sorted(merged.values(), key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    write_report(a.out, rows, targets)


if __name__ == "__main__":
    main()
