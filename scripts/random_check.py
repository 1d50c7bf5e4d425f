#!/usr/bin/env python3
"""`mlpc check` of random models on one backend: a differential test of the whole compiler.

Generates COUNT random models in graph form (matmuls, some in pairs that share their A operand and
meet in a product, as gated MLPs do; activations; bias, residual and other adds; products; one or
two outputs), each in f32, f16 or bf16, half of them with their weights pruned block-sparse
(blocks from 16 x 16 to 64 x 64, or tiny ones on tiny widths; densities 0.1 to 1), on widths from
8 to 256 and token counts from 1 to 777. Every model goes through `mlpc check` on the backend
(compiled, run on fresh random inputs with poisoned outputs, compared with the reference
interpreter), JOBS at a time, and each result is sorted into:

  ok        within tolerance of the source graph's reference;
  rounding  out of tolerance of the source graph, but within it of the optimised graph: the check
            says the difference is the rounding of intermediates the fused kernels keep in f32
            (a deep f16 / bf16 chain whose every node the source graph rounds); not a wrong kernel;
  FAIL      out of tolerance of both: a wrong result;
  error     an error before any comparison (a compile or launch error, a refused input);
  crash     no verdict at all (a signal, or killed after the time limit).

Prints one line per model that is not ok, then a summary; exits 1 when any is FAIL, error or
crash. The models are written to DIR (--keep DIR, else a temporary directory, kept and named when
a model is not ok), so that `mlpc check DIR/rSEED.json -b BACKEND --bind T=N` reproduces one.

usage: random_check.py --mlpc BIN [--backend cuda|cpu|reference] [--count N] [--seed S]
                       [--jobs J] [--keep DIR] [--timeout SECONDS] [--target TARGET]

On a CUDA machine, with binaries built by scripts/gpu/build.sh:
  python3 scripts/random_check.py --mlpc target/release/mlpc --backend cuda --count 400 --jobs 12
Here (the CPU backend, through LLVM; about 0.4 s a model on two cores):
  python3 scripts/random_check.py --mlpc target/release/mlpc --backend cpu --count 100
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
WIDTHS = [8, 32, 64, 128, 256]
BLOCKS = [[2, 2], [4, 4], [8, 8], [16, 16], [32, 32], [64, 64], [16, 32], [32, 16], [32, 64]]
DENSITIES = [0.1, 0.25, 0.5, 0.75, 1.0]
TOKENS = [1, 2, 3, 7, 16, 17, 64, 129, 300, 777]
ROUNDING = "against the optimised graph, which rounds only where the kernels store"


def model(seed):
    """The random model of `seed` and the token count to check it at."""
    r = random.Random(seed)
    w = r.choice(WIDTHS)
    params, nodes, values = {}, [], ["x", "z"]
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}{count[0]}"

    def matmul(a):
        weight, t, mm = name("w"), name("t"), name("mm")
        params[weight] = [w, w]
        nodes.append({"name": t, "op": "transpose", "inputs": [weight]})
        nodes.append({"name": mm, "op": "matmul", "inputs": [a, t]})
        values.append(mm)
        return mm

    for _ in range(r.randint(3, 25)):
        k = r.random()
        if k < 0.35:
            a = r.choice(values)
            gate = matmul(a)
            if r.random() < 0.5:
                # A twin sharing A: often the two meet in a product, as a gated MLP's do.
                up = matmul(a)
                if r.random() < 0.7:
                    if r.random() < 0.6:
                        act = name("act")
                        nodes.append({"name": act, "op": r.choice(ACTIVATIONS), "inputs": [gate]})
                        values.append(act)
                        gate = act
                    if r.random() < 0.3:
                        bias, add = name("b"), name("add")
                        params[bias] = [w]
                        nodes.append({"name": add, "op": "add", "inputs": [up, bias]})
                        values.append(add)
                        up = add
                    mul = name("mul")
                    nodes.append({"name": mul, "op": "mul", "inputs": r.sample([gate, up], 2)})
                    values.append(mul)
        elif k < 0.55:
            act = name("act")
            nodes.append({"name": act, "op": r.choice(ACTIVATIONS), "inputs": [r.choice(values[-4:])]})
            values.append(act)
        elif k < 0.75:
            mul = name("mul")
            nodes.append({"name": mul, "op": "mul", "inputs": [r.choice(values[-4:]), r.choice(values)]})
            values.append(mul)
        else:
            a = r.choice(values[-4:])
            if r.random() < 0.4:
                other = name("b")
                params[other] = [w]
            else:
                other = r.choice(values)
            add = name("add")
            nodes.append({"name": add, "op": "add", "inputs": r.sample([a, other], 2)})
            values.append(add)
    outputs = [values[-1]]
    if len(values) > 3 and r.random() < 0.3:
        outputs.append(r.choice(values[2:-1]))
    m = {"mlpc": 1, "name": f"r{seed}", "dtype": r.choice(["f32", "f16", "bf16", "bf16"]),
         "seed": seed, "params": params,
         "inputs": {"x": {"shape": ["T", w]}, "z": {"shape": ["T", w]}},
         "nodes": nodes, "outputs": list(dict.fromkeys(outputs))}
    matrices = [p for p, shape in params.items() if len(shape) == 2]
    if matrices and r.random() < 0.5:
        block = r.choice([b for b in BLOCKS if w % b[0] == 0 and w % b[1] == 0])
        m["sparsity"] = {"w*": {"block": block, "density": r.choice(DENSITIES)}}
    return m, r.choice(TOKENS)


def classify(rc, output):
    if rc == 0:
        return "ok"
    if rc != 1:
        return "crash"
    lines = output.splitlines()
    fails = [i for i, line in enumerate(lines) if line.startswith("FAIL ")]
    if not fails:
        return "error"
    explained = all(i + 1 < len(lines) and ROUNDING in lines[i + 1] for i in fails)
    return "rounding" if explained else "FAIL"


def check(args, path, tokens):
    cmd = [args.mlpc, "check", path, "-b", args.backend, "--bind", f"T={tokens}"]
    if args.target:
        cmd += ["--target", args.target]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        rc, output = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, output = 124, f"killed after {args.timeout} s"
    return classify(rc, output), rc, output


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlpc", required=True)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "reference"])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="the first model's seed (default 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", help="write the models here (kept)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a check may take")
    ap.add_argument("--target", help="passed to `mlpc check --target` (e.g. cuda:sm_90: the "
                    "portable kernels on a Hopper GPU)")
    args = ap.parse_args()
    if not (os.path.isfile(args.mlpc) and os.access(args.mlpc, os.X_OK)):
        sys.exit(f"random_check.py: --mlpc {args.mlpc}: no such executable")
    directory = args.keep or tempfile.mkdtemp(prefix="mlpc-random-")
    os.makedirs(directory, exist_ok=True)
    work = []
    for seed in range(args.seed, args.seed + args.count):
        m, tokens = model(seed)
        path = os.path.join(directory, f"r{seed}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        work.append((seed, path, tokens, m["dtype"], "sparsity" in m))
    counts = {k: 0 for k in ("ok", "rounding", "FAIL", "error", "crash")}
    target = f" ({args.target})" if args.target else ""
    print(f"{args.count} random models (seeds {args.seed}..{args.seed + args.count - 1}) on "
          f"{args.backend}{target}, {args.jobs} at a time, in {directory}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(check, args, path, tokens) for _, path, tokens, _, _ in work]
        for (seed, path, tokens, dtype, sparse), fut in zip(work, futures):
            verdict, rc, output = fut.result()
            counts[verdict] += 1
            if verdict != "ok":
                detail = [line.strip() for line in output.splitlines()
                          if line.startswith(("FAIL", "error")) or "killed" in line][:3]
                print(f"{verdict:8} r{seed}.json T={tokens} {dtype}{' sparse' if sparse else ''} "
                      f"(exit {rc}): {' | '.join(detail)}", flush=True)
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    bad = counts["FAIL"] + counts["error"] + counts["crash"]
    if not args.keep:
        if counts["ok"] == args.count:
            shutil.rmtree(directory)
        else:
            print(f"models kept in {directory}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
