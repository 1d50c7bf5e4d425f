#!/usr/bin/env python3
"""GPU validation of every kernel mlpc generates, in one run on a CUDA machine.

For every model of tests/cases and examples, at several token counts, and for every model the
benchmarks time (`bench.py`'s and `bench_goals.py`'s rows, generated as they generate them) at
the T they time it at: `mlpc check --backend cuda` (fresh random inputs, outputs and
intermediates poisoned with NaN before the run, every output compared with the reference
interpreter within the dtype's tolerance), so that every kernel a table times has been checked
in the same call. Also the block-sparse kernels of `gemm_bsr.cuh` that `--target auto` does not
reach on Hopper (rows `portable: ...`): the `mma.sync` kernel (`--target cuda:sm_90`) of the
block-sparse cases, f32 copies of them on the FP64 tensor cores and on the FFMA pipes, and a
linear whose row tiles fill more than one layer of its `Grid::RowTiles` launch. The
block-sparse models at decode sizes, where they run the weight-streaming small-M entries (rows
`sparse gemv: ...`, T = 1 to 64, on the Hopper kernel's module and the portable one), and the
tiled kernels those entries replace there (`--no-sparse-gemv`, rows `sparse tiled: ...`, T = 16
on the Hopper module), and the same models at a few row tiles (rows `sparse short: ...`, T =
130, 300 and 520), where the Hopper module's short grids of narrower groups run. And f16 copies
of the examples and of the sparse MLPs (rows `f16 copy: ...`), at sizes the f16 benchmark rows
do not reach. Then the guard cases (`gpu_guards` on a small case and on an example of full
size: inputs of the wrong dtype, shape, rank, strides or name are refused, a transposed view is
re-specialised, graph replays match), then `compute-sanitizer --tool memcheck` on a few models.
Writes a markdown report.

With --f32-kernel fp64 (or ffma): the f32 models of tests/cases and f32 copies of the examples
(llama left out: its reference takes minutes), every f32 GEMM that offers the choice forced onto
the FP64 tensor cores (mlpc's `--f32-fp64-tensor-cores`; the heuristic's choice) or the FFMA
pipes (`--f32-ffma`), and the sanitizer on two of the copies; no guard cases.

usage: validate.py --mlpc BIN --guards BIN --out REPORT.md [--jobs N] [--quick]
                   [--f32-kernel fp64|ffma] [--only TEXT,...] [--cache DIR]

The generated models and the compiled kernels (PTX, cubins, ptxas logs: over a thousand files for
the whole run) go to kernel-cache/ beside the report, or to --cache DIR (e.g. a directory outside
the folder a remote run returns).
"""
import argparse
import concurrent.futures as cf
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import MODELS as BENCH_MODELS, model_file  # noqa: E402
from bench_goals import DECODE, DECODE_T, SPARSE, sparse_model  # noqa: E402

# `--f32-kernel`: mlpc's option forcing that kernel, and its name in the report.
F32_FLAGS = {"fp64": "--f32-fp64-tensor-cores", "ffma": "--f32-ffma"}
F32_NAMES = {"fp64": "the FP64 tensor cores", "ffma": "the FFMA pipes"}


def f32_copies(examples, into):
    """f32 copies of the example models in the directory `into` (llama left out)."""
    os.makedirs(into, exist_ok=True)
    out = []
    for m in examples:
        if "llama" in m:
            continue
        model = json.load(open(m))
        model["dtype"] = "f32"
        path = os.path.join(into, os.path.basename(os.path.dirname(m)) + "-f32.json")
        json.dump(model, open(path, "w"))
        out.append(path)
    return out


def models(quick, f32_dir=None):
    cases = sorted(glob.glob("tests/cases/*/model.json"))
    examples = sorted(glob.glob("examples/*/model.json"))
    if f32_dir is not None:
        cases = [m for m in cases if json.load(open(m)).get("dtype") == "f32"]
        examples = f32_copies(examples, f32_dir)
    jobs = []
    # Token counts cover the small-M buckets (8, 16, 32, 64), their edges, the decode sizes the
    # small-T goal names (1, 2, 3, 7, 16, 64) and the tiled kernels.
    for m in cases:
        for t in ([1, 129] if quick else [1, 2, 3, 7, 16, 17, 33, 64, 65, 129]):
            jobs.append((m, t))
    for m in examples:
        big = "llama" in m
        ts = [1, 16, 33] if big else [1, 16, 67]
        if not quick:
            # Enough row tiles that every CTA of the persistent Hopper GEMMs computes several
            # tiles (more tiles than 2 x 132 CTAs), so the stage ring and accumulators carry over
            # from one tile to the next, as at benchmark sizes.
            ts.append(1024 if big else 2048)
        for t in ts:
            jobs.append((m, t))
    return jobs


def bench_models(into):
    """Every model the benchmarks time, at the T they time it at, each with its row's name there:
    (path, T, label). `bench.py`'s rows (the examples in the row's dtype, the single linears,
    dense and block-sparse) and `bench_goals.py`'s (the decode sizes, the sparse MLPs), written
    into `into`; a model and T that both time once. The largest references first, so that they
    do not end the run alone."""
    os.makedirs(into, exist_ok=True)

    def weights(dims):
        return sum(i * o for i, o in zip(dims, dims[1:]))

    # (key, cost, path, T, label), the key naming the model and T.
    rows = [((src or name, dtype, t), t * weights(dims) * (3 if gated else 1),
             model_file(src, dims, dtype, into, name), t, f"bench.py: {name}")
            for name, src, t, dims, _, gated, _, dtype in BENCH_MODELS]
    rows += [((path, "bf16", t), 0, path, t, f"bench_goals.py: {name} T={t}")
             for name, path, *_ in DECODE for t in DECODE_T]
    rows += [((name, "sparse", t), t * weights(dims) * (3 if gated else 1), sparse_model(name, path, into, gated), t,
              f"bench_goals.py: {name} sparse")
             for name, path, dims, _, t, gated in SPARSE]
    seen, jobs = set(), []
    for key, _, path, t, label in sorted(rows, key=lambda r: -r[1]):
        if key not in seen:
            seen.add(key)
            jobs.append((path, t, label))
    return jobs


def f16_copies(into):
    """f16 copies of the examples (llama left out) and of the sparse MLPs `bench_goals.py` times:
    (path, T, label), at a small T and at one where every persistent CTA computes several tiles
    (`bench.py`'s f16 rows are checked at their own T with the other benchmark models)."""
    os.makedirs(into, exist_ok=True)
    sources = [(os.path.basename(os.path.dirname(m)), m) for m in sorted(glob.glob("examples/*/model.json"))
               if "llama" not in m]
    sources += [(f"{name}-sparse", sparse_model(name, path, into)) for name, path, *_, gated in SPARSE if not gated]
    jobs = []
    for name, src in sources:
        model = json.load(open(src))
        model["dtype"] = "f16"
        path = os.path.join(into, f"{name}-f16.json")
        json.dump(model, open(path, "w"))
        for t in (67, 2048):
            jobs.append((path, t, f"f16 copy: {name}"))
    return jobs


# T of the tall linear of `portable_bsr`: 65547 row tiles of 128 rows (the portable kernels' BM),
# past the 65535 that one layer (`gridDim.y`) of a `Grid::RowTiles` launch holds.
TALL_T = 8390000


def portable_bsr(into):
    """The block-sparse cases on the kernels of `gemm_bsr.cuh` (`--target auto` runs the wgmma
    kernel on Hopper): (path, T, label, target, flags), the target None for the run's own."""
    os.makedirs(into, exist_ok=True)
    jobs = []
    for m in sorted(glob.glob("tests/cases/*/model.json")) + sorted(glob.glob("examples/*/model.json")):
        model = json.load(open(m))
        if "sparsity" not in model:
            continue
        name = os.path.basename(os.path.dirname(m))
        model["dtype"] = "f32"
        f32 = os.path.join(into, name + "-f32.json")
        json.dump(model, open(f32, "w"))
        for t in (77, 1000):
            jobs.append((m, t, f"portable: {name} on sm_90 (mma.sync)", "cuda:sm_90", []))
            jobs.append((f32, t, f"portable: {name} f32 (FP64 tensor cores)", None, ["--f32-fp64-tensor-cores"]))
            jobs.append((f32, t, f"portable: {name} f32 (FFMA)", None, ["--f32-ffma"]))
    for dtype, target, kernel in (("f32", None, "FP64 tensor cores"), ("bf16", "cuda:sm_90", "mma.sync")):
        tall = os.path.join(into, f"tall-linear-{dtype}.json")
        json.dump({"mlpc": 1, "name": "tall-linear", "dtype": dtype, "seed": 0,
                   "inputs": {"x": {"shape": ["T", 16]}},
                   "layers": [{"op": "linear", "name": "fc", "in": 16, "out": 32, "bias": True}],
                   "sparsity": {"fc.weight": {"block": [16, 16], "density": 0.5}}}, open(tall, "w"))
        jobs.append((tall, TALL_T, f"portable: 16 -> 32 linear {dtype} ({kernel}), row tiles in two grid layers",
                     target, []))
    # The tall ones first: their references take the longest.
    return jobs[-2:] + jobs[:-2]


def sparse_gemv(into):
    """The block-sparse cases, examples and benchmark models at decode sizes: the weight-streaming
    small-M entries, on the Hopper kernel's module (its weight rearranged) and on the portable
    one, and the tiled kernels they replace there (`--no-sparse-gemv`), which the other rows reach
    only from T = 65; then at a few row tiles, the short grids of narrower groups: (path, T, label,
    target, flags)."""
    jobs = []
    paths = sorted(glob.glob("tests/cases/*/model.json")) + sorted(glob.glob("examples/*/model.json"))
    paths = [p for p in paths if "sparsity" in json.load(open(p))]
    os.makedirs(into, exist_ok=True)
    # Not llama's (gated): its bench row checks it at its T, and its reference takes a while.
    paths += [sparse_model(name, path, into) for name, path, _, _, _, gated in SPARSE if not gated]
    for m in paths:
        name = os.path.basename(os.path.dirname(m) if m.endswith("model.json") else os.path.splitext(m)[0])
        for target in ("auto", "cuda:sm_90"):
            for t in (1, 9, 16, 33, 64):
                jobs.append((m, t, f"sparse gemv: {name} ({target})", target, []))
        jobs.append((m, 16, f"sparse tiled: {name} (auto)", "auto", ["--no-sparse-gemv"]))
        for t in (130, 300, 520):
            jobs.append((m, t, f"sparse short: {name} (auto)", "auto", []))
    return jobs


def binds(model, t):
    """`--bind` arguments for `model`: T = `t`, and B = 3 where its inputs have a B (mlpc refuses
    a binding of a symbol the model lacks)."""
    spec = json.load(open(model))
    dims = [d for i in spec.get("inputs", {}).values() for d in i.get("shape", [])]
    return ["--bind", f"T={t}"] + (["--bind", "B=3"] if "B" in dims else [])


def result(r):
    """A row's result column."""
    if not r["ok"]:
        return "FAIL " + r.get("message", "").replace("|", "/")[:200]
    if "ill" in r:
        backend, noise, reference = r["ill"]
        return (f"ok: ill-conditioned, {backend:.2e} from the unrounded math, random roundings {noise:.2e} "
                f"(within twice theirs; the reference {reference:.2e})")
    if "nearer" in r:
        backend, reference = r["nearer"]
        return (f"ok: {backend:.2e} from the unrounded math, the reference {reference:.2e} (within "
                "twice its roundings)")
    return "ok"


def check(mlpc, model, t, cache, target, extra, label=None, backend="cuda"):
    """`mlpc check` of `model` at T = `t`: one row per output (`label` names the model in them),
    read from the line `--json` appends (a check that stops with an error before comparing
    anything writes none: then one failed row with its message)."""
    label = label or model
    env = dict(os.environ, MLPC_CACHE_DIR=cache)
    cmd = [mlpc, "check", model, "--backend", backend] + binds(model, t) + ["--seed", str(t)]
    cmd += ([] if target == "auto" else ["--target", target]) + extra
    os.makedirs(cache, exist_ok=True)
    # A file of its own: checks run in parallel, several of them in one cache directory.
    fd, out = tempfile.mkstemp(prefix=f"check-T{t}-", suffix=".jsonl", dir=cache)
    os.close(fd)
    cmd += ["--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    with open(out) as f:
        lines = f.read().splitlines()
    os.remove(out)
    rows = []
    for o in json.loads(lines[-1])["outputs"] if lines else []:
        err = o["error"]
        rows.append(dict(ok=o["ok"], model=label, T=t, output=o["name"], dtype=o["dtype"],
                         shape=", ".join(str(d) for d in o["shape"]),
                         error=float("nan") if err is None else err, tol=o["tolerance"]))
        u = o["unrounded"]
        # An output out of tolerance that passes: as ill-conditioned (within twice the random
        # roundings' distance from the graph's unrounded math), or as at most twice as far from
        # that math as the reference.
        if o["ok"] and o["ill_conditioned"]:
            rows[-1]["ill"] = (u["backend"], u["random_roundings"], u["reference"])
        elif o["ok"] and not o["within_tolerance"] and u:
            rows[-1]["nearer"] = (u["backend"], u["reference"])
    if p.returncode != 0 and not rows:
        rows.append(dict(ok=False, model=label, T=t, output="-", dtype="-", shape="-", error=float("nan"), tol=0.0,
                         message=(p.stderr or p.stdout).strip()[-400:]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc", required=True)
    ap.add_argument("--guards", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", default="cuda:sm_90", help="the CUDA target the models are compiled for; `auto`: mlpc's default (the GPU's own architecture)")
    ap.add_argument("--sanitize", default="tests/cases/seed-geglu/model.json,tests/cases/batched-bf16/model.json,tests/cases/prime-dims-f16/model.json,tests/cases/residual/model.json,tests/cases/transposed-input/model.json,tests/cases/sparse-geglu-b16/model.json,tests/cases/sparse-residual-b64/model.json,tests/cases/sparse-pairs-b32/model.json")
    ap.add_argument("--f32-kernel", choices=sorted(F32_FLAGS),
                    help="f32 models only, their GEMMs forced onto this kernel (see the module docs)")
    ap.add_argument("--only", help="check only the models whose label or path contains one of these "
                    "comma-separated texts (e.g. `portable`, `sparse`; a text that matches no model is an "
                    "error); the guards and the sanitizer still run")
    ap.add_argument("--cache", help="where the generated models and compiled kernels go "
                    "(default: kernel-cache/ beside --out)")
    a = ap.parse_args()
    cache = os.path.abspath(a.cache or os.path.join(os.path.dirname(a.out) or ".", "kernel-cache"))
    # Compile every model once (fills the kernel cache) so the parallel checks do not race on it.
    f32 = a.f32_kernel
    extra = [F32_FLAGS[f32]] if f32 else []
    # (path, T, label, target, flags): the target None for the run's own (`--target`).
    jobs = [(m, t, None, None, []) for m, t in models(a.quick, os.path.join(cache, "f32-models") if f32 else None)]
    if not a.quick and not f32:
        # The benchmarks' own models at the T they are timed at, first: their references take
        # the longest (seconds to a minute each); the tall linear of the portable kernels too.
        jobs = ([(p, t, label, None, []) for p, t, label in bench_models(os.path.join(cache, "bench-models"))]
                + portable_bsr(os.path.join(cache, "portable-models"))
                + sparse_gemv(os.path.join(cache, "sparse-gemv-models")) + jobs
                + [(p, t, label, None, []) for p, t, label in f16_copies(os.path.join(cache, "f16-models"))])
    if a.only is not None:
        # A text that matches nothing is an error, not a report of "0 of 0 outputs" (or, one text
        # of several misspelt, a report that silently lacks its rows).
        keys = [k for k in a.only.split(",") if k]

        def hit(k, j):
            return k in (j[2] or "") or k in j[0]
        missed = [k for k in keys if not any(hit(k, j) for j in jobs)]
        if not keys or missed:
            names = sorted(set(j[2] or j[0] for j in jobs))
            sys.exit(f"validate.py: --only \"{a.only}\": "
                     + (f"no model's label or path contains {', '.join(repr(k) for k in missed)}" if keys
                        else "no text given")
                     + (" (with --quick)" if a.quick else "") + (f" (with --f32-kernel {f32})" if f32 else "")
                     + f"; the {len(names)} models of this run (labels, or paths where they have none):\n  "
                     + "\n  ".join(names))
        jobs = [j for j in jobs if any(hit(k, j) for k in keys)]
    dev = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    if f32:
        a.sanitize = ",".join(j[0] for j in jobs if j[0].endswith(("gpt2-mlp-f32.json", "bert-sparse-ffn-f32.json")))
        a.sanitize = ",".join(sorted(set(a.sanitize.split(","))))
    rows = []
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        for r in ex.map(lambda j: check(a.mlpc, j[0], j[1], cache + "/" + re.sub(r"\W", "_", j[0] + (j[3] or "") + "".join(j[4])),
                                        j[3] or a.target, extra + j[4], j[2]), jobs):
            rows.extend(r)
            for x in r:
                print(("ok  " if x["ok"] else "FAIL"), x["model"], "T=%d" % x["T"], x["output"], "%.2e" % x["error"],
                      x.get("message", ""), flush=True)
    # The guard cases on a small case and on an example of full size (small-M entries, tiled
    # GEMMs and a re-specialised variant at the sizes users run).
    guard_models = ["tests/cases/gpt2-mlp/model.json", "examples/gpt2-mlp/model.json"]
    guards = []
    for gm in guard_models:
        if f32:
            g = subprocess.CompletedProcess([], 0, f"not run (--f32-kernel {f32})", "")
        else:
            g = subprocess.run([a.guards, gm], capture_output=True, text=True,
                               env=dict(os.environ, MLPC_CACHE_DIR=cache + "/guards"))
        print(g.stdout, g.stderr, flush=True)
        guards.append((gm, g))
    san = []
    for m in [s for s in a.sanitize.split(",") if s]:
        p = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", a.mlpc, "check", m,
                            "--backend", "cuda"] + binds(m, 129)
                           + ([] if a.target == "auto" else ["--target", a.target]) + extra,
                           capture_output=True, text=True,
                           env=dict(os.environ, MLPC_CACHE_DIR=cache + "/san"))
        summary = [l for l in (p.stdout + p.stderr).splitlines() if "ERROR SUMMARY" in l]
        san.append((m, p.returncode, summary[-1].strip() if summary else (p.stderr or p.stdout).strip()[-200:]))
        print("sanitizer", m, p.returncode, san[-1][2], flush=True)

    ok = sum(r["ok"] for r in rows)
    out = []
    out.append("# GPU validation\n")
    flag = (f" --f32-kernel {f32}" if f32 else "") + (f" --only \"{a.only}\"" if a.only else "")
    out.append(f"Generated by `scripts/gpu/validate.py --target {a.target}{flag}` on "
               f"{datetime.date.today().isoformat()}, device: {dev}.\n")
    if f32:
        out.append("The f32 models of `tests/cases/` and f32 copies of the examples (llama left out), every f32 "
                   f"GEMM that offers the choice on {F32_NAMES[f32]} (`{F32_FLAGS[f32]}`).\n")
    bench_note = ("" if a.quick or f32 else
                  ", every model the benchmarks time at the T they time it at (rows `bench.py: ...` and "
                  "`bench_goals.py: ...`, named as in their tables), and f16 copies of the examples and of the "
                  "sparse MLPs (rows `f16 copy: ...`),")
    out.append(f"Every kernel of every model in `tests/cases/` and `examples/`{bench_note} ran through `mlpc check --backend cuda`: "
               "fresh random inputs, outputs and intermediates filled with NaN before the run, each output compared "
               "with the reference interpreter (f64) by relative Frobenius error. Tolerances: f32 1e-5, f16 2e-3, "
               "bf16 1e-2.\n")
    if a.only:
        out.append("Of those, this run checked only the models whose label or path contains one of the `--only` "
                   "texts.\n")
    nearer = sum("nearer" in r for r in rows)
    ill = sum("ill" in r for r in rows)
    if nearer or ill:
        out.append(f"**{ok} of {len(rows)} outputs pass: {ok - nearer - ill} within tolerance, {nearer + ill} out of "
                   "it but at most twice as far from the graph's unrounded math as the reference (which rounds "
                   "every intermediate)" + (f" or, {ill} of them ill-conditioned, as random roundings" if ill else "")
                   + ".**\n")
    else:
        out.append(f"**{ok} of {len(rows)} outputs within tolerance.**\n")
    out.append("| model | T | output | dtype | shape | relative error | tolerance | result |")
    out.append("|---|---:|---|---|---|---:|---:|---|")
    for r in rows:
        name = r["model"].replace("/model.json", "")
        out.append(f"| {name} | {r['T']} | {r['output']} | {r['dtype']} | [{r['shape']}] | {r['error']:.2e} | "
                   f"{r['tol']:.0e} | {result(r)} |")
    out.append("\n## Guards\n")
    for gm, g in guards:
        out.append(f"`gpu_guards {gm}` (exit status {g.returncode}): inputs on the device that break an "
                   "assumption of the kernels must be refused before any launch.\n")
        out.append("```text\n" + g.stdout.strip() + ("\n" + g.stderr.strip() if g.stderr.strip() else "") +
                   "\n```\n")
    out.append("## compute-sanitizer memcheck (T = 129)\n")
    out.append("| model | exit status | summary |")
    out.append("|---|---:|---|")
    for m, rc, s in san:
        out.append(f"| {m.replace('/model.json', '')} | {rc} | {s} |")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    with open(a.out.replace(".md", ".json"), "w") as f:
        json.dump(dict(device=dev, rows=rows, guards={gm: g.returncode for gm, g in guards}, sanitizer=san), f,
                  indent=1)
    bad = len(rows) - ok + sum(g.returncode != 0 for _, g in guards) + sum(rc != 0 for _, rc, _ in san)
    print(f"{ok}/{len(rows)} outputs ok; guards exits {[g.returncode for _, g in guards]}; "
          f"sanitizer exits {[rc for _, rc, _ in san]}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
