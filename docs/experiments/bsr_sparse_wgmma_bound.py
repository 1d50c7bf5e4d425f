"""The tensor-core bound of a block-sparse GEMM on Hopper's 2:4 sparse wgmma (perf-notes,
block-sparse variant 55). Y^T = W^T X^T: the pruned weight is the sparse A operand (64 output
features = two 32-row blocks an instruction), the tokens are N. A pair of 32-wide K blocks (a, b)
is one virtual k64 whose every group of four holds two elements of a and two of b (X's columns
interleaved once, beforehand); a row that keeps one of the two takes its two, a row that keeps
neither takes zeros, and a row that keeps both needs the pair twice. A pair then costs an M tile
max over its two block rows of the blocks they keep in it, in units of a dense k32 step (two
m64nNk32 sparse instructions, each the time of a dense m64nNk16), and nothing where neither
keeps any. The K blocks are paired once for every tile (the interleave is global): in order, and
improved by swaps. Prints dense / cost, i.e. the speed-up over the dense GEMM at the dense
GEMM's efficiency and the sparse instructions at twice the dense rate, before any other cost.

    python3 docs/experiments/bsr_sparse_wgmma_bound.py
"""
import random

NB = 128  # 4096 / 32 blocks each way


def bound(density, seed, improve):
    rng = random.Random(seed)
    cells = [(k, o) for k in range(NB) for o in range(NB)]
    kept = set(rng.sample(cells, round(density * NB * NB)))
    m = [[(k, o) in kept for o in range(NB)] for k in range(NB)]
    tiles = [(2 * i, 2 * i + 1) for i in range(NB // 2)]

    def cost(a, b):
        return sum(max(m[a][o1] + m[b][o1], m[a][o2] + m[b][o2]) for o1, o2 in tiles)

    pairs = [(2 * i, 2 * i + 1) for i in range(NB // 2)]
    while improve:
        improve = False
        for i in range(len(pairs)):
            for j in range(i + 1, len(pairs)):
                (a, b), (c, e) = pairs[i], pairs[j]
                now = cost(a, b) + cost(c, e)
                for p, q in (((a, c), (b, e)), ((a, e), (b, c))):
                    if cost(*p) + cost(*q) < now:
                        pairs[i], pairs[j], improve = p, q, True
                        break
    dense = NB * len(tiles)
    # Each block row on its own (no pair ever needed twice): the most a tile's rows keep.
    rows = sum(max(sum(m[k][o] for k in range(NB)) for o in t) for t in tiles)
    return dense / sum(cost(a, b) for a, b in pairs), dense / rows


if __name__ == "__main__":
    print("density  pairs in order  pairs improved  each row alone")
    for d in (0.5, 0.25, 0.1):
        plain = [bound(d, s, False) for s in range(3)]
        better = [bound(d, s, True)[0] for s in range(3)]
        print(f"{d:7}  {sum(p[0] for p in plain) / 3:13.2f}x  {sum(better) / 3:13.2f}x"
              f"  {sum(p[1] for p in plain) / 3:13.2f}x")
