#!/usr/bin/env python3
"""How evenly the persistent walk of the Hopper block-sparse kernel (`GemmBsrWgmma`) spreads its
work items over the CTAs, in a cost model (docs/perf-notes.md, block-sparse variant 41).

Reads the step lists a `mlpc compile --target cuda:sm_90a` output compiled into a kernel's
source (`grp_ptr`, `grp_order`, `step_info`), prices each work item (128 rows x one group) as
F cycles a slice + B a kept block + E for its epilogue (variant 18's fit of a slice, variant
32's epilogue), and prints, for T tokens on P CTAs, the busiest CTA's load over the mean for
the kernel's walk (row tiles in order, each row tile's groups in `grp_order`, handed out in a
snake: `bsr_wgmma::work_item`), for each round's items given to the least-loaded CTAs so far
(the same rounds, so the same reuse of A in L2: what the work-item tables of variant 47,
`MLPC_BSR_WALK=1`, hand the kernel), and for the longest items first over the whole grid (no
rounds), with the busiest CTA's modelled time at `--ghz`. No GPU; a model, not a measurement.

    scripts/bsr_walk_model.py out/bsr/kernels/bsr_gemm_bf16_nt_b32x32.cu --t 4096 8192
    scripts/bsr_walk_model.py ... --groups 8     # the short-grid entry of eight-row groups
"""
import argparse
import heapq
import re


def lists(path, suffix=""):
    src = open(path).read()

    def arr(name):
        m = re.search(r"__device__ const int %s%s\[\d+\] = \{([^}]*)\}" % (name, suffix), src)
        if m is None:
            raise SystemExit(f"{path}: no `{name}{suffix}` list (not a grouped sm_90a kernel?)")
        return [int(x) for x in m.group(1).split(",") if x.strip()]

    ptr, order, info = arr("grp_ptr"), arr("grp_order"), arr("step_info")
    # The comment above the lists names the mask's bits in `step_info` (16 or 24 of them).
    m = re.search(r"step_info%s\[s\] & (0x[0-9a-f]+)" % suffix, src)
    if m is None:
        raise SystemExit(f"{path}: no mask of `step_info{suffix}` in the lists' comment")
    mask = int(m.group(1), 16)
    steps = [ptr[g + 1] - ptr[g] for g in range(len(order))]
    blocks = [sum(bin(info[s] & mask).count("1") for s in range(ptr[g], ptr[g + 1]))
              for g in range(len(order))]
    return order, steps, blocks


def balance(order, steps, blocks, t, p, f, b, e):
    g_count = len(order)
    items = (t + 127) // 128 * g_count

    def cost(w):
        g = order[w % g_count]
        return steps[g] * f + blocks[g] * b + e

    mean = sum(cost(w) for w in range(items)) / p
    snake = [0.0] * p
    for w in range(items):
        r, i = divmod(w, p)
        snake[p - 1 - i if r & 1 else i] += cost(w)
    rounds = [0.0] * p
    for r0 in range(0, items, p):
        todo = sorted(range(r0, min(items, r0 + p)), key=cost, reverse=True)
        for w, c in zip(todo, sorted(range(p), key=lambda c: rounds[c])):
            rounds[c] += cost(w)
    heap = [(0.0, c) for c in range(p)]
    for w in sorted(range(items), key=cost, reverse=True):
        load, c = heapq.heappop(heap)
        heapq.heappush(heap, (load + cost(w), c))
    lpt = max(load for load, _ in heap)
    return items, max(snake) / mean, max(rounds) / mean, lpt / mean, max(snake)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", nargs="+", help="a grouped block-sparse kernel's .cu")
    ap.add_argument("--t", type=int, nargs="+", default=[4096], help="token counts")
    ap.add_argument("--ctas", type=int, default=132, help="persistent CTAs (SMs)")
    ap.add_argument("--slice", type=float, default=540, help="F: cycles a slice")
    ap.add_argument("--block", type=float, default=60, help="B: cycles a kept block")
    ap.add_argument("--epilogue", type=float, default=3500, help="E: cycles a tile's epilogue")
    ap.add_argument("--groups", type=int, help="the short-grid entry of groups of this many "
                    "block rows (its lists end in `_gN`) instead of the kernel's own")
    ap.add_argument("--ghz", type=float, default=1.75, help="SM clock for the modelled time")
    a = ap.parse_args()
    print("busiest CTA / mean: the kernel's snake, rounds to the least loaded, longest first; "
          "the snake's busiest CTA in us")
    for path in a.source:
        lst = lists(path, f"_g{a.groups}" if a.groups else "")
        for t in a.t:
            items, snake, rounds, lpt, busiest = balance(*lst, t, a.ctas, a.slice, a.block,
                                                         a.epilogue)
            print(f"{path}  T={t}  items {items}  snake {snake:.3f}  rounds {rounds:.3f}  "
                  f"longest first {lpt:.3f}  busiest {busiest / a.ghz / 1e3:.1f} us")


if __name__ == "__main__":
    main()
