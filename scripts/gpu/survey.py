#!/usr/bin/env python3
"""mlpc on MLP shapes beyond the benchmark table's, against PyTorch eager, in one run on a CUDA
machine (from the repository root, after `scripts/gpu/build.sh`; `run_all.sh survey`):

    python3 scripts/gpu/survey.py --mlpc target/release/mlpc --out docs/benchmarks-shapes.md

The benchmark table (`bench.py`) measures the shapes its goals name, and the tile heuristic was
tuned on them. This survey asks whether the heuristic holds elsewhere: the gated MLPs of other
well-known models, their bare GEMMs, and token counts that are not multiples of the tiles. Each
row is first checked against the reference interpreter (`mlpc check --backend cuda`, fresh random
inputs, outputs poisoned with NaN) at the T it is timed at, once per distinct model and T: the
tile a GEMM gets and the kernel entry a run launches (small-M, cooperative, split-K, short-grid or
the tile's own) depend on T (`mlpc compile --explain` lists the entries by size), so a check at
another T can pass on kernels the timing never runs. A row that fails its check is marked FAIL in
the table, left untimed, and makes the script exit 1 once the table is written. Then mlpc and
eager (`F.linear` chains, cuBLAS) are timed as `bench.py` times its rows (`RowPeers`): each row's
sides one after the other, mlpc then eager, each after a second of heat, with do_bench's 25 ms of
warm-up and 200 ms of timed runs, each run after a 256 MB L2 flush; medians; rotating weight and
input sets; `--rounds N` times each row N times over and keeps each side's middle round.
torch.compile is not timed here (it compiles for tens of seconds per shape; `bench.py` has it for
the table's models). The table goes between the markers of `--out`, the measurements into
`<out>.json`, after every row (a run cut short keeps the rows it finished); `--render FILE.json`
writes the table again without a GPU.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the harness's timing protocol and peers)

# name, T, dims ([d, h] for a gated MLP, [k, n] for a bare GEMM), activation, gated, bias.
# Gated MLPs are `down(act(gate(x)) * up(x))` without biases, as the models below use them.
SURVEY = [
    ("swiglu 4096-14336 (Mistral-7B, Llama-3-8B)", 4096, [4096, 14336], "silu", True, False),
    ("swiglu 5120-13824 (Llama-2-13B)", 4096, [5120, 13824], "silu", True, False),
    ("swiglu 8192-3584 (Llama-3-70B, an 8-way tensor-parallel shard)", 4096, [8192, 3584], "silu", True, False),
    ("swiglu 2048-8192 (Llama-3.2-1B)", 4096, [2048, 8192], "silu", True, False),
    ("gemm 4096x4096x14336", 4096, [4096, 14336], None, False, False),
    ("gemm 4096x14336x4096", 4096, [14336, 4096], None, False, False),
    ("gemm 4096x5120x13824", 4096, [5120, 13824], None, False, False),
    ("gemm 4096x13824x5120", 4096, [13824, 5120], None, False, False),
    ("llama-swiglu T=3000", 3000, [4096, 11008], "silu", True, False),
    ("gpt2-mlp T=1000", 1000, [768, 3072, 768], "gelu_tanh", False, True),
    ("gpt2-mlp T=5000", 5000, [768, 3072, 768], "gelu_tanh", False, True),
    # Mid-size rows of the table's other plain MLPs (split K, one-tile and short-grid entries).
    ("gpt2-mlp T=2560", 2560, [768, 3072, 768], "gelu_tanh", False, True),
    ("bert-large-ffn T=1000", 1000, [1024, 4096, 1024], "gelu", False, True),
    ("mlp3-relu T=500", 500, [1024, 4096, 4096, 1024], "relu", False, True),
]

BEGIN, END = "<!-- survey:begin -->", "<!-- survey:end -->"


def model_json(dims, act, gated, bias):
    """The model of a survey row: a gated MLP in graph form, or a `layers` chain."""
    if gated:
        d, h = dims
        return {"mlpc": 1, "name": "survey", "dtype": "bf16", "seed": 0,
                "params": {"gate.weight": [h, d], "up.weight": [h, d], "down.weight": [d, h]},
                "inputs": {"x": {"shape": ["T", d]}},
                "nodes": [
                    {"name": "gate.t", "op": "transpose", "inputs": ["gate.weight"]},
                    {"name": "up.t", "op": "transpose", "inputs": ["up.weight"]},
                    {"name": "down.t", "op": "transpose", "inputs": ["down.weight"]},
                    {"name": "g", "op": "matmul", "inputs": ["x", "gate.t"]},
                    {"name": "u", "op": "matmul", "inputs": ["x", "up.t"]},
                    {"name": "a", "op": act, "inputs": ["g"]},
                    {"name": "h", "op": "mul", "inputs": ["a", "u"]},
                    {"name": "y", "op": "matmul", "inputs": ["h", "down.t"]}],
                "outputs": ["y"]}
    layers = []
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append({"op": "linear", "name": f"fc{k}", "in": i, "out": o, "bias": bias})
        if act and k < len(dims) - 2:
            layers.append({"op": act})
    return {"mlpc": 1, "name": "survey", "dtype": "bf16", "seed": 0,
            "inputs": {"x": {"shape": ["T", dims[0]]}}, "layers": layers}


def check(mlpc, path, T):
    """`mlpc check` on the CUDA backend at T = `T`: None, or what failed (the outputs off the
    reference, or mlpc's error), on one line."""
    p = subprocess.run([mlpc, "check", path, "--backend", "cuda", "--bind", f"T={T}"],
                       capture_output=True, text=True)
    if p.returncode == 0:
        return None
    # `FAIL survey on cuda: output `y` bf16[...]: relative error ... (tolerance ...)`
    off = [l.split(": ", 1)[-1] for l in p.stdout.splitlines() if l.startswith("FAIL")]
    what = "; ".join(off) or (p.stderr or p.stdout).strip() or f"exit status {p.returncode}"
    return f"T={T}: " + " ".join(what.split())[-300:]


def select(only, names):
    """The names `--only` picks (comma-separated; a name may hold commas itself, as
    `swiglu 4096-14336 (Mistral-7B, Llama-3-8B)` does), and its parts that name no row."""
    if not only:
        return list(names), []
    rest = f",{only},"
    picked = [n for n in names if f",{n}," in rest]
    for n in sorted(picked, key=len, reverse=True):
        while f",{n}," in rest:
            rest = rest.replace(f",{n},", ",")
    return picked, [p for p in rest.split(",") if p]


def entry_tag(launch):
    """`kernel: mlpc_..._wgmma_tma_128x192x64_short_splitk, grid 96x1x1` -> `128x192x64_short_splitk
    (96 CTAs)`: the entry's tile and kind, and its grid."""
    kernel, _, rest = launch.partition(": ")
    entry, _, grid = rest.partition(", grid ")
    tag = entry.split("_wgmma_tma_")[-1] if "_wgmma_tma_" in entry else entry
    x = grid.split("x")[0] if grid else "?"
    return f"{tag} ({x} CTAs)"


def run_key(r):
    """The run a row was measured in: (date, device, PyTorch, rounds per row, checked at its own
    T); runs from before 2026-12-04 have neither of the last two (rounds 0, False)."""
    return (r["date"], r["device"], r["torch"], r.get("rounds") or 0, "checked_T" in r)


def run_note(date, device, torch, rounds, own_t):
    head = f"Generated by `scripts/gpu/survey.py` on {date}, device: {device}, PyTorch {torch}. "
    tail = "eager: `F.linear` chains (cuBLAS). Ratio: eager time / mlpc time (above 1: mlpc faster)."
    if not own_t:
        return (head + "Each row checked against the reference interpreter first (`mlpc check` at T = 200 "
                "and 1024, or the row's own T where it is not a multiple of 128), then timed as "
                "`bench.py` times its rows (a second of heat, do_bench's 25 ms of "
                "warm-up and 200 ms of timed runs, each after a 256 MB L2 flush; medians). " + tail)
    order = ("mlpc then eager, one after the other" if rounds == 1 else
             f"in {rounds} rounds of mlpc then eager, each side keeping its middle round")
    return (head + "Each row checked against the reference interpreter first, at the T it is timed at "
            "(`mlpc check --backend cuda --bind T=...`: the kernel entries a run launches depend on T; a row "
            "that fails is marked FAIL and not timed), then timed as `bench.py` times its rows: " + order +
            ", each side after a second of heat, do_bench's 25 ms of warm-up and 200 ms of timed runs, each "
            "run after a 256 MB L2 flush; medians. " + tail)


def table(rows):
    lines = [run_note(*run) for run in sorted({run_key(r) for r in rows})]
    lines += ["", "| shape | T | kernels | checked | mlpc ms | TFLOP/s | eager ms | TFLOP/s eager | eager / mlpc | tiles (entries, where recorded) |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m = r.get("mlpc")
        tf = lambda ms: f"{r['flops'] / (ms * 1e-3) / 1e12:.1f}" if ms else "-"
        mlpc_ms = m["median_ms"] if m else None
        eager = r.get("eager_ms")
        ratio = f"{eager / mlpc_ms:.2f}" if (eager and mlpc_ms) else "-"
        err = r.get("check_error")
        checked = "ok" if not err else "**FAIL** " + " ".join(err.replace("|", "/").split())[:160]
        # "kernel  [dtype kind K N]  tile  (source)": the shape and the tile.
        tiles = "; ".join(" ".join(t.split("  ")[1:3]) for t in (m or {}).get("tiles", []))
        # Runs since `bench --json` records them: the entry each kernel ran ("kernel: entry, grid
        # XxYxZ"), by its tile part (the small-M, split-K, one-tile and short-grid entries).
        launches = (m or {}).get("launches")
        if launches:
            tiles = "; ".join(entry_tag(l) for l in launches)
        kernels = m["kernels"] if m else None
        kernels = len(kernels) if isinstance(kernels, list) else kernels
        lines.append(f"| {r['name']} | {r['T']} | {kernels if m else '-'} | {checked} | "
                     f"{f'{mlpc_ms:.4f}' if mlpc_ms else cell(r.get('error'))} | {tf(mlpc_ms)} | "
                     f"{f'{eager:.4f}' if eager else '-'} | {tf(eager)} | {ratio} | {tiles or '-'} |")
    return "\n".join(lines) + "\n"


def cell(text):
    """`text` (an error) as one table cell: one line, no `|`, at most 120 characters; `-` for none."""
    return " ".join(text.replace("|", "/").split())[:120] if text else "-"


def write(out, rows):
    bench.write_section(out, table(rows), BEGIN, END, title="# Shape survey", heading=None)
    with open(out.replace(".md", ".json"), "w") as f:
        json.dump(dict(rows=rows), f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlpc")
    ap.add_argument("--out", required=True)
    ap.add_argument("--render", help="write the table from this measurements file instead of measuring")
    ap.add_argument("--only", default="", help="comma-separated row names (a part that names no row is an error)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each row this many times over, mlpc and then eager in every round; each side "
                         "keeps its middle round (default 1)")
    a = ap.parse_args()
    if a.render:
        write(a.out, json.load(open(a.render))["rows"])
        return
    if not a.mlpc:
        ap.error("--mlpc is required unless --render is given")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    picked, unmatched = select(a.only, [s[0] for s in SURVEY])
    if unmatched:
        ap.error("--only: no survey row is named " + ", ".join(repr(p) for p in unmatched)
                 + "; the rows are: " + "; ".join(s[0] for s in SURVEY))
    import torch
    today, dev, torch_version = datetime.date.today().isoformat(), torch.cuda.get_device_name(), torch.__version__
    tmp = tempfile.mkdtemp()
    rows, checks = [], {}
    for i, (name, T, dims, act, gated, bias) in enumerate(SURVEY):
        if name not in picked:
            continue
        model = model_json(dims, act, gated, bias)
        path = os.path.join(tmp, f"survey{i}.json")
        json.dump(model, open(path, "w"))
        row = dict(name=name, T=T, dims=dims, act=act, gated=gated, bias=bias, dtype="bf16",
                   flops=bench.flops(T, dims, gated), date=today, device=dev, torch=torch_version,
                   rounds=a.rounds, checked_T=[T], mlpc=None, error=None)
        # One check per distinct model and T: the kernel entries the timing below runs.
        key = (json.dumps(model, sort_keys=True), T)
        if key not in checks:
            checks[key] = check(a.mlpc, path, T)
        row["check_error"] = checks[key]
        rows.append(row)
        if row["check_error"]:
            print("FAIL", name, "check:", row["check_error"], "(not timed)", flush=True)
            write(a.out, rows)
            continue
        print("ok  ", name, f"check at T={T}", flush=True)
        # As bench.py times a row: every round times mlpc and then eager, back to back, so that a
        # drift of the card's clocks lands on both sides of the ratio alike; each side keeps its
        # middle round.
        peers = bench.RowPeers(row, no_compile=True)
        done, peer_ms = [], {}
        for k in range(a.rounds):
            if not row["error"]:
                res, row["error"] = bench.bench_mlpc(a.mlpc, path, T, "auto")
                if res:
                    done.append(res)
                print(name, f"round {k + 1}", "mlpc", res and res["median_ms"], row["error"] or "", flush=True)
            for side, ms in peers.time().items():
                peer_ms.setdefault(side, []).append(ms)
            print(name, f"round {k + 1}", *(f"{s} {v[-1]:.4f}" for s, v in peer_ms.items()), flush=True)
        peers.close()
        if done and not row["error"]:
            row["mlpc"] = sorted(done, key=lambda m: m["median_ms"])[(len(done) - 1) // 2]
        for side, ms in peer_ms.items():
            row[side + "_ms"] = statistics.median_low(ms)
        row.update(heat_s=bench.HEAT_S, sized_ms=[bench.WARMUP_MS, bench.REP_MS],
                   round_ms={**({"mlpc": [m["median_ms"] for m in done]} if done else {}), **peer_ms})
        # After every row: a run cut short by a time limit keeps the rows it finished.
        write(a.out, rows)
    failed = [r["name"] for r in rows if r["check_error"]]
    if failed:
        sys.exit(f"survey: {len(failed)} row(s) failed their check and were not timed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
