#!/usr/bin/env python3
"""`mlpc check` of random models changed in one or two places: refusals, not panics; right answers.

Takes the random models of `random_check.py` (graph form), and for a quarter of the seeds a random
model in sequential form (`layers`: generated linear layers with and without bias, activations,
some with a `sparsity` section), and changes each in one or two places, as a hand edit or a bad
generator would. Graph form: a weight's dimension, a node's op, an operand (another value, weight
or input; or the two reversed), the outputs, or a node removed. Sequential form: a layer's op,
`in`, `out`, `bias` or name, a layer removed or repeated, a key no layer takes. Both: the dtype, an
input's dimension or an extra leading one, the `sparsity` section (block, density, `with`, a new
spec by name or glob). For a quarter of the graph-form seeds the weights come from a safetensors
file instead of `params` (values as mlpc generates them, stored as F32, F16 or BF16 whatever the
model's dtype), and most of their changes are to that file, as a bad writer or a cut-short copy
would make them: a tensor's dtype, shape or data offsets, a tensor left out of the header or
renamed, an unused tensor of another dtype added, a value made NaN, infinite or large, the file
cut short or with bytes added, the header's length or one of its characters changed, or the
model's `weights` path pointing elsewhere. Some of the changed models are still valid, most are
not. Every one goes through `mlpc check` on the backend with `--verify-each true` (the verifier
after every pass), JOBS at a time. For about one graph-form seed in seven the model stays as it is
and its inputs file is changed instead, in the same ways as a weights file (`mlpc gen-inputs`,
then the file changed, then `mlpc run` on the backend and on the reference interpreter, which
must both refuse it or both run it). Each result is sorted into:

  ok, nearer, rounding   a valid model, sorted as `random_check.py` sorts it;
  ran                    a changed inputs file both backends ran (their outputs are not compared:
                         the valid models' are, in `mlpc check`);
  refused                exit status 1 with an `error:` line: the model is refused with a message;
  FAIL                   a valid model whose outputs are wrong (`random_check.py`'s FAIL);
  bug                    a refusal that says it is a bug in mlpc (an internal error, a pass that
                         left an invalid graph), exit status 1 with no `error:` line, or an inputs
                         file one backend runs and the other refuses;
  crash                  any other exit status, a panic, or killed after the time limit.

Prints one line per model that is FAIL, bug or crash (with the changes made, so that the kept
model reproduces it), then a summary; exits 1 when any is. Stopped early (SIGINT, or SIGTERM as
`timeout` sends it), it prints the summary of the models checked so far (the first ones by seed)
and exits 2 (1 if any of them is FAIL, bug or crash). The models are written to DIR (--keep
DIR, else a temporary directory, kept when a model is FAIL, bug or crash) as `mSEED.json`, their
weights files beside them as `mSEED.safetensors`, the inputs files as `mSEED.in.safetensors` (as
generated) and `mSEED.bad.safetensors` (as changed).

usage: mutate_check.py --mlpc BIN [--backend cpu|cuda|reference] [--count N] [--seed S]
                       [--jobs J] [--keep DIR] [--timeout SECONDS]

Here (the CPU backend, through LLVM):
  python3 scripts/mutate_check.py --mlpc target/release/mlpc --backend cpu --count 200
"""
import argparse
import array
import concurrent.futures
import copy
import json
import math
import os
import random
import shutil
import signal
import struct
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


def values(r, dtype, shape):
    """Random values of a tensor as mlpc generates them (uniform in +-1/sqrt(fan_in), fan_in the
    last dimension), stored as the safetensors `dtype` (F32, F16 or BF16): its bytes."""
    n = math.prod(shape)
    bound = 1 / math.sqrt(shape[-1])
    bits = array.array("I", r.randbytes(4 * n))
    xs = [(u * 2.0**-31 - 1.0) * bound for u in bits]
    if dtype == "F16":
        return struct.pack(f"<{n}e", *xs)
    f32 = struct.pack(f"<{n}f", *xs)
    if dtype == "F32":
        return f32
    wide = array.array("I")
    wide.frombytes(f32)
    return array.array("H", (u >> 16 for u in wide)).tobytes()


class WeightsFile:
    """A safetensors file in the making: the header as an object, the data, and the changes to
    the bytes that serialising them makes (`cut`: the length to cut the file to; `length`: the
    header length to write; `poke`: (offset in the header, character); `tail`: bytes appended)."""

    def __init__(self, tensors):
        self.header, data, offset = {}, [], 0
        for name, (dtype, shape, b) in tensors.items():
            self.header[name] = {"dtype": dtype, "shape": shape,
                                 "data_offsets": [offset, offset + len(b)]}
            data.append(b)
            offset += len(b)
        self.data = bytearray(b"".join(data))
        self.cut = self.length = self.poke = None
        self.tail = b""

    @classmethod
    def parse(cls, b):
        """The file of bytes `b`, as mlpc writes one."""
        f = cls({})
        (length,) = struct.unpack("<Q", b[:8])
        f.header = json.loads(b[8:8 + length])
        f.data = bytearray(b[8 + length:])
        return f

    def bytes(self):
        h = json.dumps(self.header).encode()
        h += b" " * (-len(h) % 8)
        if self.poke is not None:
            i, c = self.poke
            h = h[:i % len(h)] + c + h[i % len(h) + 1:]
        length = len(h) if self.length is None else self.length
        out = struct.pack("<Q", length % 2**64) + h + bytes(self.data) + self.tail
        return out if self.cut is None else out[:self.cut % (len(out) + 1)]


def with_file(m, r):
    """Moves the graph-form model `m`'s `params` into a weights file; returns the file."""
    tensors = {}
    for name, shape in m.pop("params").items():
        dtype = r.choice(["F32", "F16", "BF16"])
        tensors[name] = (dtype, shape, values(r, dtype, shape))
    m["weights"] = f"{m['name']}.safetensors"
    return WeightsFile(tensors)


def change_file(m, f, r, key="weights"):
    """Changes the tensor file `f` in one place; returns what it did. Its path is `m[key]` (the
    model's weights file, or the inputs file of `mlpc run`)."""
    names = [n for n in f.header if n != "__metadata__"]
    k = r.randrange(11)
    if not names:
        k = r.choice([5, 9, 10])
    if k == 0:
        n = r.choice(names)
        f.header[n]["dtype"] = r.choice(["F16", "BF16", "F32", "F64", "I32", "I8", "U8", "BOOL",
                                         "F8_E4M3", "f32", "", 7])
        return f"file: {n} dtype {f.header[n]['dtype']!r}"
    if k == 1:
        n = r.choice(names)
        shape = f.header[n]["shape"]
        how = r.randrange(4)
        if how == 0:
            shape[r.randrange(len(shape))] = r.choice(DIMS + [0])
        elif how == 1:
            shape.reverse()
        elif how == 2:
            shape.insert(0, 1)
        else:
            shape.pop()
        return f"file: {n} shape {shape}"
    if k == 2:
        n = r.choice(names)
        offsets = f.header[n]["data_offsets"]
        how = r.randrange(4)
        if how == 0:
            offsets[1] += r.choice([-2, -1, 1, 2, 4096])
        elif how == 1:
            offsets[0] += r.choice([1, 2, 8])
        elif how == 2:
            offsets.reverse()
        else:
            f.header[n]["data_offsets"] = [0, offsets[1] - offsets[0]]
        return f"file: {n} data_offsets {f.header[n]['data_offsets']}"
    if k == 3:
        n = r.choice(names)
        del f.header[n]
        return f"file: {n} left out of the header"
    if k == 4:
        n = r.choice(names)
        new = r.choice(["x", "w999", n + ".weight", n.upper(), ""])
        f.header = {new if t == n else t: v for t, v in f.header.items()}
        return f"file: {n} renamed {new!r}"
    if k == 5:
        end = len(f.data)
        dtype, size = r.choice([("I64", 8), ("U8", 1), ("F64", 8), ("BOOL", 1)])
        f.header["buffer"] = {"dtype": dtype, "shape": [3], "data_offsets": [end, end + 3 * size]}
        f.data += bytes(3 * size)
        if r.random() < 0.5:
            f.header["__metadata__"] = r.choice([{"format": "pt"}, {"format": 3}, "pt"])
        return f"file: an unused {dtype} tensor added"
    if k == 6:
        n = r.choice(names)
        t = f.header[n]
        width = {"F32": 4, "F16": 2, "BF16": 2}.get(t["dtype"])
        start, end = t["data_offsets"]
        if width is None or end - start < width:
            return change_file(m, f, r, key)
        i = start + width * r.randrange((end - start) // width)
        v = r.choice([float("nan"), float("inf"), float("-inf"), 1e4, -3e4])
        b = struct.pack("<e" if width == 2 and t["dtype"] == "F16" else "<f", v)
        f.data[i:i + width] = b if t["dtype"] != "BF16" else b[2:]
        return f"file: a value of {n} = {v}"
    if k == 7:
        f.cut = r.randrange(1 << 30)
        return "file: cut short"
    if k == 8:
        f.tail = bytes(r.choice([1, 7, 8, 64]))
        return "file: bytes appended"
    if k == 9:
        f.length = r.choice([0, 1, 7, 2**31, 2**64 - 1, len(json.dumps(f.header)) + 9])
        return f"file: header length {f.length}"
    if k == 10 and r.random() < 0.5:
        f.poke = (r.randrange(1 << 20), bytes([r.choice(b'{}[]",:0 aZ\\\xff')]))
        return f"file: header character {f.poke[1]!r}"
    m[key] = r.choice(["missing.safetensors", ".", f"{m['name']}.json", "", "/"])
    return f"{key} = {m[key]!r}"


def mutated(seed):
    """The changed model of `seed`, the token count, what was changed, and the weights file (or
    None)."""
    r = random.Random(seed)
    if r.random() < 0.25:
        m, tokens = sequential(r)
        m["name"] = f"m{seed}"
        changes = [change_layers(m, r) for _ in range(r.randint(1, 2))]
        return m, tokens, changes, None
    mix = r.choice(["default", "products"])
    m, tokens = random_check.model(seed, mix)
    m["name"] = f"m{seed}"
    # The files' draws from streams of their own: the other models are as they were without them.
    rf = random.Random(f"weights file {seed}")
    f = with_file(m, rf) if rf.random() < 0.25 else None
    if random.Random(f"inputs file {seed}").random() < 0.15:
        return m, tokens, INPUTS, f
    if f is None:
        return m, tokens, [change(m, r) for _ in range(r.randint(1, 2))], None
    changes = [change_file(m, f, rf) if rf.random() < 0.7 else change(m, r)
               for _ in range(r.randint(1, 2))]
    return m, tokens, changes, f


# The changes of a model kept valid whose inputs file `mlpc run` reads is changed instead.
INPUTS = ["inputs file"]


def verdict(rc, output, result):
    if "panicked" in output or rc not in (0, 1):
        return "crash"
    lines = output.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    if any(b in line for line in errors for b in BUG):
        return "bug"
    v = random_check.classify(rc, result)
    if v != "error":
        return v
    return "refused" if errors else "bug"


def binds(m, tokens):
    symbols = sorted({d for x in m["inputs"].values() for d in x["shape"] if isinstance(d, str)})
    return [a for s in symbols for a in ("--bind", f"{s}={tokens if s == 'T' else 3}")]


def check(args, path, m, tokens):
    cmd = [args.mlpc, "check", path, "-b", args.backend, "--verify-each", "true"]
    rc, output, result = random_check.checked(cmd + binds(m, tokens), args.timeout, os.path.dirname(path))
    return verdict(rc, output, result), rc, output


def ran(rc, output):
    """The verdict of one `mlpc run`: ran, refused, bug or crash."""
    if "panicked" in output or rc not in (0, 1):
        return "crash"
    if rc == 0:
        return "ran"
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    return "refused" if errors and not any(b in e for e in errors for b in BUG) else "bug"


def run_inputs(args, path, m, tokens, seed):
    """`mlpc gen-inputs` for the valid model `path`, the inputs file changed in one or two places,
    then `mlpc run` on it on the backend and on the reference interpreter, which must both refuse
    it with a message or both run: their verdict (ran, refused, bug or crash), the status and
    output of the backend's run (or of the first command that went wrong), and the changes."""
    stem = path[:-len(".json")]
    rc, output = random_check.run([args.mlpc, "gen-inputs", path, "-o", f"{stem}.in.safetensors"]
                                  + binds(m, tokens), args.timeout)
    if rc != 0:
        return ("crash" if ran(rc, output) == "crash" else "bug"), rc, output, ["gen-inputs"]
    with open(f"{stem}.in.safetensors", "rb") as f:
        inputs = WeightsFile.parse(f.read())
    r = random.Random(f"inputs file {seed} changes")
    at = {"name": os.path.basename(stem), "input": os.path.basename(stem) + ".bad.safetensors"}
    changes = ["inputs " + change_file(at, inputs, r, "input") for _ in range(r.randint(1, 2))]
    with open(f"{stem}.bad.safetensors", "wb") as f:
        f.write(inputs.bytes())
    results = []
    for backend in (args.backend, "reference"):
        cmd = [args.mlpc, "run", path, "-b", backend, "--input",
               os.path.join(os.path.dirname(path), at["input"]),
               "--output", f"{stem}.out-{backend}.safetensors"]
        rc, output = random_check.run(cmd, args.timeout)
        results.append((ran(rc, output), rc, output))
    (v, rc, output), (vr, rcr, outr) = results
    if v == vr or v in ("bug", "crash"):
        return v, rc, output, changes
    if vr in ("bug", "crash"):
        return vr, rcr, "reference: " + outr, changes
    # One refuses what the other runs: the backends check inputs alike.
    return "bug", rc, f"{args.backend} {v}, the reference {vr}: {output} | {outr}", changes


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
        m, tokens, changes, weights = mutated(seed)
        path = os.path.join(directory, f"{m['name']}.json")
        with open(path, "w") as f:
            json.dump(m, f)
        if weights is not None:
            with open(os.path.join(directory, f"{m['name']}.safetensors"), "wb") as f:
                f.write(weights.bytes())
        work.append((seed, path, m, tokens, changes))
    counts = {k: 0 for k in ("ok", "nearer", "rounding", "ran", "refused", "FAIL", "bug",
                             "crash")}
    print(f"{args.count} changed random models (seeds {args.seed}..{args.seed + args.count - 1}) "
          f"on {args.backend}, {args.jobs} at a time, in {directory}", flush=True)
    checked = 0
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    signal.signal(signal.SIGTERM, random_check.stop)
    signal.signal(signal.SIGINT, random_check.stop)
    try:
        futures = [pool.submit(run_inputs, args, path, m, tokens, seed) if changes is INPUTS
                   else pool.submit(check, args, path, m, tokens)
                   for seed, path, m, tokens, changes in work]
        for (_, path, m, tokens, changes), fut in zip(work, futures):
            v, rc, output, *made = fut.result()
            if rc in (-signal.SIGTERM, -signal.SIGINT):
                random_check.stop()  # signalled with this process, before its own handler ran
            checked += 1
            changes = made[0] if made else changes
            counts[v] += 1
            if v in ("FAIL", "bug", "crash"):
                tail = " | ".join(line.strip() for line in output.splitlines()[-3:])
                print(f"{v:8} {os.path.basename(path)} T={tokens} ({'; '.join(changes)}) "
                      f"(exit {rc}): {tail}", flush=True)
    except (KeyboardInterrupt, random_check.Stopped):
        random_check.halt(pool, args, checked, counts, directory,
                          counts["FAIL"] + counts["bug"] + counts["crash"])
    pool.shutdown()
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
