#!/usr/bin/env python3
"""`mlpc check` of random models changed in one or two places: refusals, not panics; right answers.

Takes the random models of `random_check.py` (seed S of its mix) and changes each in one or two
places, as a hand edit or a bad generator would: a weight's dimension, a node's op, an operand
(another value, weight or input; or the two reversed), the dtype, an input's dimension or an
extra leading one, the outputs, the `sparsity` section (block, density, `with`, a new spec by
name or glob), or a node removed. Some of the changed models are still valid, most are not. Every
one goes through `mlpc check` on the backend with `--verify-each true` (the verifier after every
pass), JOBS at a time, and each result is sorted into:

  ok, nearer, rounding   a valid model, sorted as `random_check.py` sorts it;
  refused                exit status 1 with an `error:` line: the model is refused with a message;
  FAIL                   a valid model whose outputs are wrong (`random_check.py`'s FAIL);
  bug                    a refusal that says it is a bug in mlpc (an internal error, a pass that
                         left an invalid graph), or exit status 1 with no `error:` line;
  crash                  any other exit status, a panic, or killed after the time limit.

Prints one line per model that is FAIL, bug or crash (with the changes made, so that the kept
model reproduces it), then a summary; exits 1 when any is. The models are written to DIR (--keep
DIR, else a temporary directory, kept when a model is FAIL, bug or crash) as `mSEED.json`.

usage: mutate_check.py --mlpc BIN [--backend cpu|cuda|reference] [--count N] [--seed S]
                       [--jobs J] [--keep DIR] [--timeout SECONDS]

Here (the CPU backend, through LLVM):
  python3 scripts/mutate_check.py --mlpc target/release/mlpc --backend cpu --count 200
"""
import argparse
import concurrent.futures
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import random_check  # noqa: E402  (the models and the verdicts of a valid model)

OPS = ["transpose", "matmul", "add", "mul", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
DIMS = [1, 2, 3, 7, 8, 13, 16, 32, 33, 64, 96, 128, 352]
# What a refusal says when the fault is mlpc's, not the model's.
BUG = ("a bug in mlpc", "internal error")


def names(m):
    return list(m["params"]) + list(m["inputs"]) + [n["name"] for n in m["nodes"]]


def change(m, r):
    """Changes `m` in one place, chosen by `r`; returns what it did (for the report)."""
    nodes = m["nodes"]
    k = r.randrange(10)
    if k == 0 and m["params"]:
        w = r.choice(list(m["params"]))
        shape = m["params"][w]
        i = r.randrange(len(shape))
        shape[i] = r.choice(DIMS)
        return f"params.{w}[{i}] = {shape[i]}"
    if k == 1 and nodes:
        n = r.choice(nodes)
        n["op"] = r.choice(OPS)
        return f"node {n['name']}: op {n['op']}"
    if k == 2 and nodes:
        n = r.choice(nodes)
        if n["inputs"]:
            i = r.randrange(len(n["inputs"]))
            n["inputs"][i] = r.choice(names(m))
            return f"node {n['name']}: operand {i} = {n['inputs'][i]}"
    if k == 3 and nodes:
        n = r.choice(nodes)
        n["inputs"].reverse()
        return f"node {n['name']}: operands reversed"
    if k == 4:
        m["dtype"] = r.choice(["f32", "f16", "bf16"])
        return f"dtype {m['dtype']}"
    if k == 5:
        x = r.choice(list(m["inputs"]))
        shape = m["inputs"][x]["shape"]
        i = r.randrange(len(shape))
        shape[i] = r.choice(["T", "S", 1, 2, 32, 64, 96])
        return f"inputs.{x}.shape[{i}] = {shape[i]}"
    if k == 6:
        x = r.choice(list(m["inputs"]))
        m["inputs"][x]["shape"].insert(0, r.choice([1, 2, "B"]))
        return f"inputs.{x}: leading dim {m['inputs'][x]['shape'][0]}"
    if k == 7:
        o = r.choice(names(m))
        if r.random() < 0.5:
            m["outputs"].append(o)
            return f"output {o} added"
        m["outputs"] = [o]
        return f"outputs = [{o}]"
    if k == 8:
        sp = m.get("sparsity")
        if sp and r.random() < 0.7:
            w = r.choice(list(sp))
            key = r.choice(["block", "density", "with"])
            sp[w][key] = r.choice({
                "block": [[2, 2], [3, 3], [8, 8], [32, 32], [64, 64], [4, 16], [0, 4]],
                "density": [0.0, 0.01, 0.1, 0.5, 1.0, 1.5],
                "with": names(m)[:6] + [w],
            }[key])
            return f"sparsity.{w}.{key} = {sp[w][key]}"
        weights = [w for w, s in m["params"].items() if len(s) == 2]
        pattern = r.choice(weights + ["*", "w*", "b*", "nothing*"])
        spec = {"block": r.choice([[2, 2], [8, 8], [16, 16], [32, 32], [3, 3]])}
        if r.random() < 0.8:
            spec["density"] = r.choice([0.1, 0.25, 0.5, 1.0])
        m.setdefault("sparsity", {})[pattern] = spec
        return f"sparsity.{pattern} = {json.dumps(spec)}"
    if nodes:
        n = nodes.pop(r.randrange(len(nodes)))
        return f"node {n['name']} removed"
    return "nothing"


def mutated(seed):
    """The changed model of `seed`, the token count, and what was changed."""
    r = random.Random(seed)
    mix = r.choice(["default", "products"])
    m, tokens = random_check.model(seed, mix)
    m = copy.deepcopy(m)
    m["name"] = f"m{seed}"
    changes = [change(m, r) for _ in range(r.randint(1, 2))]
    return m, tokens, changes


def verdict(rc, output):
    if "panicked" in output or rc not in (0, 1):
        return "crash"
    lines = output.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    if any(b in line for line in errors for b in BUG):
        return "bug"
    v = random_check.classify(rc, output)
    if v != "error":
        return v
    return "refused" if errors else "bug"


def check(args, path, m, tokens):
    symbols = sorted({d for x in m["inputs"].values() for d in x["shape"] if isinstance(d, str)})
    cmd = [args.mlpc, "check", path, "-b", args.backend, "--verify-each", "true"]
    for s in symbols:
        cmd += ["--bind", f"{s}={tokens if s == 'T' else 3}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        rc, output = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, output = 124, f"killed after {args.timeout} s"
    return verdict(rc, output), rc, output


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlpc", required=True)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "reference"])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="the first model's seed (default 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", help="write the models here (kept)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a check may take")
    args = ap.parse_args()
    if not (os.path.isfile(args.mlpc) and os.access(args.mlpc, os.X_OK)):
        sys.exit(f"mutate_check.py: --mlpc {args.mlpc}: no such executable")
    directory = args.keep or tempfile.mkdtemp(prefix="mlpc-mutate-")
    os.makedirs(directory, exist_ok=True)
    work = []
    for seed in range(args.seed, args.seed + args.count):
        m, tokens, changes = mutated(seed)
        path = os.path.join(directory, f"{m['name']}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        work.append((path, m, tokens, changes))
    counts = {k: 0 for k in ("ok", "nearer", "rounding", "refused", "FAIL", "bug", "crash")}
    print(f"{args.count} changed random models (seeds {args.seed}..{args.seed + args.count - 1}) "
          f"on {args.backend}, {args.jobs} at a time, in {directory}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(check, args, path, m, tokens) for path, m, tokens, _ in work]
        for (path, m, tokens, changes), fut in zip(work, futures):
            v, rc, output = fut.result()
            counts[v] += 1
            if v in ("FAIL", "bug", "crash"):
                tail = " | ".join(line.strip() for line in output.splitlines()[-3:])
                print(f"{v:8} {os.path.basename(path)} T={tokens} ({'; '.join(changes)}) "
                      f"(exit {rc}): {tail}", flush=True)
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    bad = counts["FAIL"] + counts["bug"] + counts["crash"]
    if not args.keep:
        if bad:
            print(f"models kept in {directory}")
        else:
            shutil.rmtree(directory)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
