#!/usr/bin/env python3
"""`mlpc check` of random models on one backend: a differential test of the whole compiler.

Generates COUNT random models in graph form (matmuls between a model width and a hidden width,
some in pairs that share their A operand and meet in a product, as gated MLPs do; activations;
bias, residual and other adds; products; one or two outputs; some with a batch dimension), each in
f32, f16 or bf16, about half of them with weights pruned block-sparse (blocks from 2 x 2 to 64 x
64 that divide both widths, densities 0.1 to 1 or the all-zero blocks' pattern, some gated pairs
pruned together with `with`), on widths from 1 to 352 (some odd, whose rows no 16-byte copy
aligns) and token counts from 1 to 777. Every model goes through `mlpc check` on the backend
(compiled, run on fresh random inputs with poisoned outputs, compared with the reference
interpreter), JOBS at a time, and each result is sorted, from the exit status and the JSON line
`mlpc check --json` appends, into:

  ok        within tolerance of the source graph's reference;
  nearer    out of tolerance of the source graph's reference in some output, but at most twice as
            far from the graph's unrounded math as that reference is (the check passes: the
            fused kernels round other, fewer intermediates than the source graph), or as a few
            runs with random roundings of every stored value and product term are on average
            (an ill-conditioned output: a sum that cancels, a long chain of products);
  rounding  out of tolerance of the source graph and more than twice as far as both from the
            unrounded math, but within tolerance of the optimised graph: the check fails and
            says the difference is the rounding of intermediates the fused kernels keep in f32
            (a deep f16 / bf16 chain whose every node the source graph rounds), or an f16 /
            bf16 intermediate that overflows in the source graph and not in f32; not a wrong
            kernel;
  FAIL      out of tolerance of both: a wrong result;
  error     an error before any comparison (a compile or launch error, a refused input);
  crash     no verdict at all (a signal, or killed after the time limit).

Prints one line per model that is not ok, then a summary; exits 1 when any is FAIL, error or crash.
Stopped early (SIGINT, or SIGTERM as `timeout` sends it), it prints the summary of the models
checked so far, which are the first ones by seed, says how many, and exits 2 (1 if any of them is
FAIL, error or crash). The models are written to DIR (--keep DIR, else a temporary directory, kept
and named when a model is not ok), so that `mlpc check DIR/rSEED.json -b BACKEND --bind T=N`
reproduces one (`pSEED.json` for `--mix products`: twice the share of products, longer graphs, each
node's first operand among the last three values).

usage: random_check.py --mlpc BIN [--backend cuda|cpu|reference] [--count N] [--seed S]
                       [--mix default|products] [--jobs J] [--keep DIR] [--timeout SECONDS]
                       [--target TARGET] [--arg=ARG ...]

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
import signal
import subprocess
import sys
import tempfile

ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
# (model width, hidden width) of a graph; a matmul maps one to either.
WIDTHS = [(8, 8), (8, 24), (32, 32), (32, 96), (64, 64), (64, 192), (128, 128), (128, 352),
          (256, 256), (256, 96), (48, 80), (7, 13), (33, 65), (100, 36), (1, 5)]
BLOCKS = [[2, 2], [4, 4], [8, 8], [16, 16], [32, 32], [64, 64], [16, 32], [32, 16], [32, 64],
          [24, 24], [16, 48]]
DENSITIES = [0.1, 0.25, 0.5, 0.75, 1.0]
# The graphs' mix of nodes: the share of steps that add a matmul (or a pair), an activation, a
# product (the rest add an add), the most steps, and how many of the last values an activation,
# product or add takes its first operand from. `products`: twice the share of products, longer
# graphs, shorter reach: chains of products on GEMMs, as deep product stacks and gates build them.
MIXES = {
    "default": (0.35, 0.55, 0.75, 25, 4),
    "products": (0.4, 0.48, 0.85, 40, 3),
}
# A model's name and file: the prefix and its seed.
PREFIX = {"default": "r", "products": "p"}
TOKENS = [1, 2, 3, 7, 16, 17, 64, 129, 300, 777]
# `mlpc check` prints this under an output that passes as about as near the graph's unrounded
# math as the reference (or as random roundings, for an ill-conditioned output): the lines a
# `nearer` model's report shows. The verdicts themselves come from the check's JSON line.
NEARER = "(about as near the graph's unrounded math"


def model(seed, mix="default"):
    """The random model of `seed` (of the `mix`, MIXES) and the token count to check it at."""
    to_matmul, to_act, to_product, most, reach = MIXES[mix]
    r = random.Random(seed)
    dims = r.choice(WIDTHS)
    batched = r.random() < 0.15
    params, nodes = {}, []
    width = {"x": dims[0], "z": dims[0]}  # every value's last dimension
    pairs = []  # (gate weight, up weight) of twins that meet in a product
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}{count[0]}"

    def add_node(prefix, op, inputs, w):
        n = name(prefix)
        nodes.append({"name": n, "op": op, "inputs": inputs})
        width[n] = w
        return n

    def matmul(a, out):
        weight = name("w")
        params[weight] = [out, width[a]]
        t = add_node("t", "transpose", [weight], None)
        return add_node("mm", "matmul", [a, t], out), weight

    def values(w=None):
        return [v for v, vw in width.items() if vw is not None and (w is None or vw == w)]

    for _ in range(r.randint(3, most)):
        k = r.random()
        if k < to_matmul:
            a = r.choice(values())
            out = r.choice(dims)
            gate, wg = matmul(a, out)
            if r.random() < 0.5:
                # A twin sharing A: often the two meet in a product, as a gated MLP's do.
                up, wu = matmul(a, out)
                products = (gate, up)
                if r.random() < 0.7:
                    if r.random() < 0.6:
                        gate = add_node("act", r.choice(ACTIVATIONS), [gate], out)
                    if r.random() < 0.3:
                        bias = name("b")
                        params[bias] = [out]
                        up = add_node("add", "add", [up, bias], out)
                    add_node("mul", "mul", r.sample([gate, up], 2), out)
                    pairs.append((wg, wu, products))
        elif k < to_act:
            a = r.choice(values()[-reach:])
            add_node("act", r.choice(ACTIVATIONS), [a], width[a])
        elif k < to_product:
            a = r.choice(values()[-reach:])
            add_node("mul", "mul", [a, r.choice(values(width[a]))], width[a])
        else:
            a = r.choice(values()[-reach:])
            if r.random() < 0.4:
                other = name("b")
                params[other] = [width[a]]
            else:
                other = r.choice(values(width[a]))
            add_node("add", "add", r.sample([a, other], 2), width[a])
    vs = values()
    outputs = [vs[-1]]
    if len(vs) > 3 and r.random() < 0.3:
        outputs.append(r.choice(vs[2:-1]))
    shape = [2, "T", dims[0]] if batched else ["T", dims[0]]
    m = {"mlpc": 1, "name": f"{PREFIX[mix]}{seed}", "dtype": r.choice(["f32", "f16", "bf16", "bf16"]),
         "seed": seed, "params": params, "inputs": {"x": {"shape": shape}, "z": {"shape": shape}},
         "nodes": nodes, "outputs": list(dict.fromkeys(outputs))}
    # What the outputs need: a weight pruned together with one no output needs is an error.
    live, stack = set(), list(m["outputs"])
    inputs_of = {n["name"]: n["inputs"] for n in nodes}
    while stack:
        v = stack.pop()
        if v not in live:
            live.add(v)
            stack.extend(inputs_of.get(v, []))
    matrices = [p for p, shape in params.items() if len(shape) == 2]
    blocks = [b for b in BLOCKS if all(d % b[0] == 0 and d % b[1] == 0 for d in dims)]
    if matrices and blocks and r.random() < 0.5:
        # Exact weight names; a gated pair's gate, some of the time, with its up weight.
        keep = r.random()
        block = r.choice(blocks)
        sparsity, taken = {}, set()
        for gate, up, products in pairs:
            if live.issuperset(products) and r.random() < 0.4:
                sparsity[gate] = {"block": block, "density": r.choice(DENSITIES), "with": up}
                taken |= {gate, up}
        for w in matrices:
            if w not in taken and r.random() < keep:
                spec = {"block": block}
                if r.random() < 0.9:
                    spec["density"] = r.choice(DENSITIES)
                sparsity[w] = spec
        if sparsity:
            m["sparsity"] = sparsity
    return m, r.choice(TOKENS)


def notes(lines, i):
    """The indented notes under the output line `lines[i]`."""
    out = []
    for line in lines[i + 1:]:
        if not line.startswith(" "):
            break
        out.append(line)
    return out


def classify(rc, result):
    """The verdict of one `mlpc check` from its exit status and the JSON object `--json` appended
    (None when the check stopped before comparing): ok, nearer, rounding, FAIL, error or crash."""
    if rc not in (0, 1):
        return "crash"
    if result is None:
        return "error" if rc == 1 else "crash"
    outputs = result["outputs"]
    if rc == 0:
        if not result["ok"] or not all(o["ok"] for o in outputs):
            return "FAIL"  # a check that passed with an output its own report fails
        return "nearer" if any(not o["within_tolerance"] for o in outputs) else "ok"
    fails = [o for o in outputs if not o["ok"]]
    if not fails:
        return "error"
    # Within tolerance of the optimised graph (`null`: not measured, or NaN).
    explained = all(o["optimized_graph"] is not None and o["optimized_graph"] <= o["tolerance"]
                    for o in fails)
    return "rounding" if explained else "FAIL"


def checked(cmd, timeout, directory):
    """Runs the `mlpc check` command `cmd` with `--json` into a file of its own in `directory`:
    its status, its output, and the JSON object it appended (None when it appended none)."""
    fd, path = tempfile.mkstemp(prefix="check-", suffix=".jsonl", dir=directory)
    os.close(fd)
    try:
        rc, output = run(cmd + ["--json", path], timeout)
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            result = None
        return rc, output, result
    finally:
        os.remove(path)


# The checks running now, killed when the script is stopped.
RUNNING = set()


class Stopped(Exception):
    """SIGINT or SIGTERM, raised in the main thread."""


# The signal that stopped the script, once it is stopping.
STOPPING = []


def stop(signum=None, frame=None):
    """Raises Stopped, once: `timeout` signals the command and then its whole process group, so a
    run it stops gets the signal twice, and a later one must not break off the report."""
    if not STOPPING:
        STOPPING.append(signum)
        raise Stopped()


def halt(pool, args, checked, counts, directory, bad):
    """Ends a stopped run: the checks still running killed (what they report now is not
    counted), the summary of the first `checked` models, exit status 1 if `bad` (any of them
    failed), else 2."""
    pool.shutdown(wait=False, cancel_futures=True)
    for p in list(RUNNING):
        p.kill()
    last = f", seeds {args.seed}..{args.seed + checked - 1}" if checked else ""
    print(f"stopped after {checked} of {args.count} models{last}; the rest not checked")
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    print(f"models kept in {directory}", flush=True)
    os._exit(1 if bad else 2)


def run(cmd, timeout):
    """Runs `cmd`, killed after `timeout` seconds (status 124); its status and its output."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        RUNNING.add(p)
        try:
            out, err = p.communicate(timeout=timeout)
            return p.returncode, out + err
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return 124, f"killed after {timeout} s"
        finally:
            RUNNING.discard(p)


def check(args, path, tokens):
    cmd = [args.mlpc, "check", path, "-b", args.backend, "--bind", f"T={tokens}"]
    if args.target:
        cmd += ["--target", args.target]
    cmd += args.arg
    rc, output, result = checked(cmd, args.timeout, os.path.dirname(path))
    return classify(rc, result), rc, output


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlpc", required=True)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "reference"])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="the first model's seed (default 0)")
    ap.add_argument("--mix", default="default", choices=sorted(MIXES),
                    help="the graphs' mix of nodes (default: default; products: twice the "
                    "products, longer chains)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", help="write the models here (kept)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a check may take")
    ap.add_argument("--target", help="passed to `mlpc check --target` (e.g. cuda:sm_90: the "
                    "portable kernels on a Hopper GPU)")
    ap.add_argument("--arg", action="append", default=[],
                    help="one more argument of every `mlpc check` (e.g. --arg=--f32-ffma); repeat")
    args = ap.parse_args()
    if not (os.path.isfile(args.mlpc) and os.access(args.mlpc, os.X_OK)):
        sys.exit(f"random_check.py: --mlpc {args.mlpc}: no such executable")
    directory = args.keep or tempfile.mkdtemp(prefix="mlpc-random-")
    os.makedirs(directory, exist_ok=True)
    work = []
    for seed in range(args.seed, args.seed + args.count):
        m, tokens = model(seed, args.mix)
        path = os.path.join(directory, f"{m['name']}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        work.append((seed, path, tokens, m["dtype"], "sparsity" in m))
    counts = {k: 0 for k in ("ok", "nearer", "rounding", "FAIL", "error", "crash")}
    target = " ".join(([args.target] if args.target else []) + args.arg)
    target = f" ({target})" if target else ""
    mix = "" if args.mix == "default" else f" of the {args.mix} mix"
    print(f"{args.count} random models{mix} (seeds {args.seed}..{args.seed + args.count - 1}) on "
          f"{args.backend}{target}, {args.jobs} at a time, in {directory}", flush=True)
    checked = 0
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        futures = [pool.submit(check, args, path, tokens) for _, path, tokens, _, _ in work]
        for (seed, path, tokens, dtype, sparse), fut in zip(work, futures):
            verdict, rc, output = fut.result()
            if rc in (-signal.SIGTERM, -signal.SIGINT):
                stop()  # signalled with this process, before its own handler ran
            checked += 1
            counts[verdict] += 1
            name = os.path.basename(path)
            if verdict != "ok":
                lines = output.splitlines()
                # The failures and errors; for `nearer`, the outputs that passed so, with the note
                # that gives their errors against the unrounded math.
                detail = [line.strip() for line in lines
                          if line.startswith(("FAIL", "error")) or "killed" in line][:3]
                if verdict == "nearer":
                    detail = [lines[i].strip() + " " + n.strip()
                              for i in range(len(lines)) if lines[i].startswith("ok")
                              for n in notes(lines, i) if NEARER in n][:3]
                print(f"{verdict:8} {name} T={tokens} {dtype}{' sparse' if sparse else ''} "
                      f"(exit {rc}): {' | '.join(detail)}", flush=True)
    except (KeyboardInterrupt, Stopped):
        halt(pool, args, checked, counts, directory,
             counts["FAIL"] + counts["error"] + counts["crash"])
    pool.shutdown()
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    bad = counts["FAIL"] + counts["error"] + counts["crash"]
    if not args.keep:
        if counts["ok"] + counts["nearer"] == args.count:
            shutil.rmtree(directory)
        else:
            print(f"models kept in {directory}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
