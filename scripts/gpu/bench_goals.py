#!/usr/bin/env python3
"""The measurements behind two goal checks that `bench.py`'s table does not make, in one run on a
CUDA machine, written into their own sections of docs/benchmarks.md:

- Small T (decode): gpt2, bert-large and llama-swiglu MLPs at T = 1, 4, 16 (`mlpc bench`, graph
  replay on, the default), PyTorch eager beside them, and the two floors the goal is stated in:
  the device's copy bandwidth (a 1 GiB device-to-device copy, bytes read + written) and the time
  of one empty kernel launch (`torch.cuda._sleep(0)` between CUDA events). Goal: mlpc <= 2 x
  (empty launch + weight bytes / copy bandwidth); for llama, weights read at >= 80 % of the copy
  bandwidth and >= 1.25x eager.
- Sparse MLPs: the three-Linear MLP and the bert-large FFN with every weight at density 0.25
  (32 x 32 blocks), and llama's SwiGLU MLP likewise with its gate and up weights pruned together
  (`"with"`: one pattern for the fused pair), mlpc against the dense eager model.

usage: bench_goals.py --mlpc BIN --out docs/benchmarks.md
       bench_goals.py --render docs/benchmarks-goals.json --out docs/benchmarks.md
The measurements also go to `<out>-goals.json`; `--render` writes the tables again from such a
file (no GPU needed), e.g. after a change to the derived columns.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import HEAT_S, REP_MS, WARMUP_MS, bench_mlpc, heated_bench, sized_note  # noqa: E402

DECODE = [
    ("gpt2-mlp", "examples/gpt2-mlp/model.json", [768, 3072, 768], "gelu_tanh", False, True),
    ("bert-large-ffn", "examples/bert-large-ffn/model.json", [1024, 4096, 1024], "gelu", False, True),
    ("llama-swiglu", "examples/llama-swiglu/model.json", [4096, 11008, 4096], "silu", True, False),
]
DECODE_T = [1, 4, 16]
# name, model, dims, activation, T, gated (gate, up, down: no biases; the gate pruned "with" the up)
SPARSE = [
    ("mlp3-relu", "examples/mlp3-relu/model.json", [1024, 4096, 4096, 1024], "relu", 8192, False),
    ("bert-large-ffn", "examples/bert-large-ffn/model.json", [1024, 4096, 1024], "gelu", 8192, False),
    ("llama-swiglu", "examples/llama-swiglu/model.json", [4096, 11008, 4096], "silu", 4096, True),
]
DENSITY = 0.25


def sparsity(gated):
    """The `sparsity` section of a SPARSE row: every weight at DENSITY in 32 x 32 blocks; a gated
    row's gate and up weights pruned together."""
    b = {"block": [32, 32], "density": DENSITY}
    if gated:
        return {"gate_proj.weight": dict(b, **{"with": "up_proj.weight"}), "down_proj.weight": b}
    return {"*.weight": b}


def sparse_model(name, path, tmp, gated=False):
    """The model.json of a SPARSE row: the example with every weight at DENSITY (32 x 32 blocks)."""
    m = json.load(open(path))
    m["name"] = f"{name}-sparse"
    m["sparsity"] = sparsity(gated)
    p = os.path.join(tmp, f"{name}-sparse.json")
    json.dump(m, open(p, "w"))
    return p


def section(path, name, text):
    """Puts `text` between the `<!-- NAME:begin -->` / `<!-- NAME:end -->` markers of `path`
    (appended at the end when absent), keeping the rest of the file."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin not in doc or end not in doc:
        doc = doc.rstrip() + f"\n\n{begin}\n{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + end + tail)


def weight_bytes(dims, gated, bias):
    """bf16 bytes of the weights (and biases): a gated MLP [d, h, d] has three d x h matrices."""
    if gated:
        return 2 * 3 * dims[0] * dims[1]
    return 2 * sum(i * o + (o if bias else 0) for i, o in zip(dims[:-1], dims[1:]))


DECODE_BYTES = {name: weight_bytes(dims, gated, bias) for name, _, dims, _, gated, bias in DECODE}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--render", help="write the tables from this measurements file instead of measuring")
    a = ap.parse_args()
    if a.render:
        render(json.load(open(a.render)), a.out)
        return
    if not a.mlpc:
        ap.error("--mlpc is required unless --render is given")
    os.environ.setdefault("MLPC_CACHE_DIR", "/tmp/mlpc-cache")

    import torch
    import torch.nn.functional as F

    acts = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}
    dev = torch.cuda.get_device_name()
    torch.manual_seed(0)

    # Floors: copy bandwidth (read + write) and one empty kernel between events.
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = heated_bench(lambda: dst.copy_(src), warmup=10, rep=100)
    copy_tbs = 2 * src.numel() / (copy_ms * 1e-3) / 1e12
    del src, dst
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    empty = []
    for i in range(300):
        start.record()
        torch.cuda._sleep(0)
        stop.record()
        stop.synchronize()
        if i >= 50:
            empty.append(start.elapsed_time(stop))
    empty.sort()
    empty_ms = empty[len(empty) // 2]
    print(f"copy {copy_tbs:.2f} TB/s, empty launch {empty_ms * 1e3:.1f} us", flush=True)

    tmp = tempfile.mkdtemp()
    rows = []
    for name, path, dims, act, gated, bias in DECODE:
        f = acts[act]
        wb = weight_bytes(dims, gated, bias)
        sets = max(2, min(8, int(4e8 // wb)))
        if gated:
            d, h = dims[0], dims[1]
            ws = [(torch.randn(h, d, device="cuda", dtype=torch.bfloat16), torch.randn(h, d, device="cuda", dtype=torch.bfloat16),
                   torch.randn(d, h, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
        else:
            ws = [[(torch.randn(o, i, device="cuda", dtype=torch.bfloat16), torch.randn(o, device="cuda", dtype=torch.bfloat16))
                   for i, o in zip(dims[:-1], dims[1:])] for _ in range(sets)]

        def fwd(x, w):
            if gated:
                g, u, dn = w
                return F.linear(f(F.linear(x, g)) * F.linear(x, u), dn)
            for k, (wt, bb) in enumerate(w):
                x = F.linear(x, wt, bb)
                if k < len(w) - 1:
                    x = f(x)
            return x

        for T in DECODE_T:
            xs = [torch.randn(T, dims[0], device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            i = [0]

            def step():
                fwd(xs[i[0] % sets], ws[i[0] % sets])
                i[0] += 1
            eager = heated_bench(step)
            res, err = bench_mlpc(a.mlpc, path, T, "auto")
            row = dict(name=name, T=T, eager_ms=eager, mlpc=res, error=err)
            print(name, T, res and res["median_ms"], err or "", "eager", eager, flush=True)
            rows.append(row)
        del ws
        torch.cuda.empty_cache()

    sparse_rows = []
    for name, path, dims, act, T, gated in SPARSE:
        p = sparse_model(name, path, tmp, gated)
        res, err = bench_mlpc(a.mlpc, p, T, "auto")
        f = acts[act]
        x = torch.randn(T, dims[0], device="cuda", dtype=torch.bfloat16)
        if gated:
            d, h = dims[0], dims[1]
            w = [torch.randn(h, d, device="cuda", dtype=torch.bfloat16) / d ** 0.5,
                 torch.randn(h, d, device="cuda", dtype=torch.bfloat16) / d ** 0.5,
                 torch.randn(d, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5]
        else:
            w = [(torch.randn(o, i, device="cuda", dtype=torch.bfloat16) / i ** 0.5, torch.randn(o, device="cuda", dtype=torch.bfloat16))
                 for i, o in zip(dims[:-1], dims[1:])]

        def dense():
            if gated:
                g, u, dn = w
                return F.linear(f(F.linear(x, g)) * F.linear(x, u), dn)
            y = x
            for k, (wt, bb) in enumerate(w):
                y = F.linear(y, wt, bb)
                if k < len(w) - 1:
                    y = f(y)
            return y
        eager = heated_bench(dense)
        print(name, "sparse", res and res["median_ms"], err or "", "dense eager", eager, flush=True)
        sparse_rows.append(dict(name=name, T=T, mlpc=res, error=err, eager_ms=eager))
        del w, x
        torch.cuda.empty_cache()

    data = dict(device=dev, torch=torch.__version__, date=datetime.date.today().isoformat(), copy_tbs=copy_tbs,
                empty_ms=empty_ms, heat_s=HEAT_S, sized_ms=[WARMUP_MS, REP_MS], decode=rows, sparse=sparse_rows)
    json.dump(data, open(a.out.replace(".md", "-goals.json"), "w"), indent=1)
    render(data, a.out)


def render(data, out_path):
    """The two tables from the measurements in `data`, into their sections of `out_path`."""
    dev, today, copy_tbs, empty_ms = data["device"], data["date"], data["copy_tbs"], data["empty_ms"]
    torch_version = data.get("torch", "?")
    rows, sparse_rows = data["decode"], data["sparse"]
    heat = data.get("heat_s", 0)
    heat_note = (f"; both after {heat:g} s of untimed runs back to back (the clocks of sustained load), a 256 MB "
                 "buffer zeroed before every timed run (do_bench's L2 flush; mlpc's `--flush-l2`)" if heat else "")
    if data.get("sized_ms"):
        heat_note += "; " + sized_note(data["sized_ms"])
    out = ["",
           f"Generated by `scripts/gpu/bench_goals.py` on {today}, device: {dev}, PyTorch {torch_version}. "
           f"Copy bandwidth (1 GiB device-to-device copy, bytes read + written): {copy_tbs:.2f} TB/s; one empty kernel "
           f"launch between CUDA events (`torch.cuda._sleep(0)`, median): {empty_ms * 1e3:.1f} us. "
           "mlpc: `mlpc bench` (medians of CUDA-event timings around each `run`, graph replay on, rotating weight "
           "and input sets); eager: `F.linear` chain, triton `do_bench` median" + heat_note + ". floor = empty launch + weight bytes / "
           "copy bandwidth; the goal is mlpc <= 2 x floor.\n",
           "| model | T | weights MB | mlpc ms | weights read TB/s | % of copy bandwidth | host us/run | eager ms | eager / mlpc | floor ms | mlpc / floor | <= 2x floor |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r["mlpc"]
        wb = DECODE_BYTES[r["name"]]
        floor = empty_ms + wb / (copy_tbs * 1e12) * 1e3
        if m is None:
            out.append(f"| {r['name']} | {r['T']} | {wb / 1e6:.1f} | failed: {(r['error'] or '')[:60]} |" + " |" * 8)
            continue
        ms = m["median_ms"]
        tbs = wb / (ms * 1e-3) / 1e12
        out.append(f"| {r['name']} | {r['T']} | {wb / 1e6:.1f} | {ms:.4f} | {tbs:.2f} | "
                   f"{100 * tbs / copy_tbs:.0f}% | {m['host_us']:.1f} | {r['eager_ms']:.4f} | {r['eager_ms'] / ms:.2f} | "
                   f"{floor:.4f} | {ms / floor:.2f} | {'yes' if ms <= 2 * floor else 'no'} |")
    section(out_path, "bench_decode", "\n".join(out[1:]).strip() + "\n")

    out = ["",
           f"Generated by `scripts/gpu/bench_goals.py` on {today}, device: {dev}. Every weight of the model pruned to "
           f"density {DENSITY} in 32x32 blocks (`\"sparsity\": {{\"*.weight\": ...}}`; llama-swiglu's gate and up "
           "weights pruned together, `\"with\"`, to one pattern for its fused pair), mlpc's default target; eager is "
           "the dense model (`F.linear` chain, same shapes, triton `do_bench` median)" + heat_note + ".\n",
           "| model | T | kernels | mlpc sparse ms | eager dense ms | dense eager / mlpc sparse |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in sparse_rows:
        m = r["mlpc"]
        if m is None:
            out.append(f"| {r['name']} | {r['T']} | - | failed: {(r['error'] or '')[:60]} | {r['eager_ms']:.4f} | - |")
            continue
        out.append(f"| {r['name']} | {r['T']} | {len(m['kernels'])} | {m['median_ms']:.4f} | {r['eager_ms']:.4f} | "
                   f"{r['eager_ms'] / m['median_ms']:.2f} |")
    section(out_path, "bench_sparse_models", "\n".join(out[1:]).strip() + "\n")


if __name__ == "__main__":
    main()
