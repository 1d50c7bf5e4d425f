#!/usr/bin/env python3
"""`mlpc check` of random models changed in one or two places: refusals, not panics; right answers.

Takes the random models of `random_check.py` (graph form), and for a quarter of the seeds a random
model in sequential form (`layers`: generated linear layers with and without bias, activations,
some with a `sparsity` section), and changes each in one or two places, as a hand edit or a bad
generator would. Graph form: a weight's dimension, a node's op, an operand (another value, weight
or input; or the two reversed), the outputs, or a node removed. Sequential form: a layer's op,
`in`, `out`, `bias` or name, a layer removed or repeated, a key no layer takes. Both: the dtype, an
input's dimension or an extra leading one, the `sparsity` section (block, density, `with`, a new
spec by name or glob). Some of the changed models are still valid, most are not. Every one goes
through `mlpc check` on the backend with `--verify-each true` (the verifier after every pass), JOBS
at a time, and each result is sorted into:

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
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import random_check  # noqa: E402  (the models and the verdicts of a valid model)

OPS = ["transpose", "matmul", "add", "mul", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
DIMS = [1, 2, 3, 7, 8, 13, 16, 32, 33, 64, 96, 128, 352]
# What a refusal says when the fault is mlpc's, not the model's.
BUG = ("a bug in mlpc", "internal error")


def names(m):
    nodes = [n["name"] for n in m.get("nodes", [])]
    return list(m.get("params", {})) + list(m["inputs"]) + nodes


def change(m, r, shared_only=False):
    """Changes the graph-form model `m` in one place, chosen by `r`; returns what it did (for the
    report). `shared_only`: only the changes a sequential model takes too (dtype, inputs,
    `sparsity`)."""
    nodes = m.get("nodes", [])
    k = r.choice([4, 5, 6, 8]) if shared_only else r.randrange(10)
    if k == 0 and m.get("params"):
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
                "with": names(m)[:6] + [w, "fc2.weight"],
            }[key])
            return f"sparsity.{w}.{key} = {sp[w][key]}"
        weights = [w for w, s in m.get("params", {}).items() if len(s) == 2]
        pattern = r.choice(weights + ["*", "w*", "b*", "nothing*", "*.weight", "fc1.bias"])
        spec = {"block": r.choice([[2, 2], [8, 8], [16, 16], [32, 32], [3, 3]])}
        if r.random() < 0.8:
            spec["density"] = r.choice([0.1, 0.25, 0.5, 1.0])
        m.setdefault("sparsity", {})[pattern] = spec
        return f"sparsity.{pattern} = {json.dumps(spec)}"
    if nodes:
        n = nodes.pop(r.randrange(len(nodes)))
        return f"node {n['name']} removed"
    return "nothing"


def sequential(r):
    """A random model in sequential form (`layers`), and the token count to check it at."""
    width = r.choice(DIMS[3:])
    layers, linears = [], 0
    for _ in range(r.randint(1, 6)):
        if r.random() < 0.5:
            linears += 1
            layer = {"op": "linear", "out": r.choice(DIMS[3:])}
            if r.random() < 0.5:
                layer["in"] = width
            if r.random() < 0.3:
                layer["bias"] = False
            if r.random() < 0.3:
                layer["name"] = f"lin{linears}"
            width = layer["out"]
        else:
            layer = {"op": r.choice(random_check.ACTIVATIONS)}
        layers.append(layer)
    first = next((layer for layer in layers if layer["op"] == "linear"), None)
    d = first["in"] if first and "in" in first else r.choice(DIMS[3:])
    if first is not None:
        first["in"] = d
    shape = [2, "T", d] if r.random() < 0.2 else ["T", d]
    m = {"mlpc": 1, "dtype": r.choice(["f32", "f16", "bf16"]), "seed": r.randrange(100),
         "inputs": {"x": {"shape": shape}}, "layers": layers}
    if linears and r.random() < 0.5:
        m["sparsity"] = {r.choice(["*.weight", "fc1.weight", "lin*"]): {
            "block": r.choice([[1, 1], [2, 2], [8, 8], [16, 16]]),
            "density": r.choice(random_check.DENSITIES)}}
    return m, r.choice(random_check.TOKENS)


def change_layers(m, r):
    """Changes the sequential model `m` in one place; returns what it did."""
    layers = m["layers"]
    k = r.randrange(8)
    if k == 0 and layers:
        layer = r.choice(layers)
        layer["op"] = r.choice(OPS + ["linear", "conv"])
        return f"layer op {layer['op']}"
    if k == 1 and layers:
        i = r.randrange(len(layers))
        key = r.choice(["in", "out"])
        layers[i][key] = r.choice(DIMS + [0, -1, "T"])
        return f"layers[{i}].{key} = {layers[i][key]}"
    if k == 2 and layers:
        i = r.randrange(len(layers))
        layers[i]["bias"] = r.choice([True, False, "fc1.bias", 1])
        return f"layers[{i}].bias = {layers[i]['bias']}"
    if k == 3 and layers:
        i = r.randrange(len(layers))
        layers[i]["name"] = r.choice(["fc1", "act1", "x", "y", "fc1.weight", "a b", ""])
        return f"layers[{i}].name = {layers[i]['name']!r}"
    if k == 4 and layers:
        i = r.randrange(len(layers))
        del layers[i]
        return f"layers[{i}] removed"
    if k == 5 and layers:
        i = r.randrange(len(layers))
        layers.insert(i, copy.deepcopy(layers[i]))
        return f"layers[{i}] repeated"
    if k == 6 and layers:
        i = r.randrange(len(layers))
        key = r.choice(["weight", "in", "stride", "activation"])
        layers[i][key] = r.choice(["fc1.weight", 8, "w"])
        return f"layers[{i}].{key} = {layers[i][key]}"
    return change(m, r, shared_only=True)


def mutated(seed):
    """The changed model of `seed`, the token count, and what was changed."""
    r = random.Random(seed)
    if r.random() < 0.25:
        m, tokens = sequential(r)
        m["name"] = f"m{seed}"
        changes = [change_layers(m, r) for _ in range(r.randint(1, 2))]
        return m, tokens, changes
    mix = r.choice(["default", "products"])
    m, tokens = random_check.model(seed, mix)
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
    rc, output = random_check.run(cmd, args.timeout)
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
