"""Reads the clock stamps that docs/experiments/bsr-stamps.patch makes CTA 0 of the block-sparse
Hopper kernel write over its first output tile, from an `mlpc run` output file, and prints the
per-slice times of docs/perf-notes.md (block-sparse variant 7).

    git apply docs/experiments/bsr-stamps.patch     # applies to commit eb08021 and to the kernel of block-sparse variant 9
    scripts/gpu/build.sh
    # on the CUDA machine:
    mlpc gen-inputs bsr.json --bind T=4096 -o in.safetensors
    mlpc run bsr.json -i in.safetensors -o out.safetensors
    python3 docs/experiments/bsr_stamps.py out.safetensors

Stamps (low 32 bits of clock64, per slice of CTA 0, at most 1024 slices): 0 a producer warp
before its `empty` wait, 1 after it, 2 consumer warpgroup 0 before its `full` wait, 3 after it,
4 before its release, 5 warpgroup 1 after its `full` wait, 6 the producer after its copies.
"""
import json, struct, sys
import numpy as np
f = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", f[:8])[0]
hdr = json.loads(f[8:8 + n])
name = [k for k in hdr if k != "__metadata__"][0]
meta = hdr[name]
b, e = meta["data_offsets"]
raw = np.frombuffer(f[8 + n + b: 8 + n + e], dtype=np.uint32)
rows, cols = meta["shape"]
a = raw.reshape(rows, cols // 2)
hits = np.argwhere(a[:128] == 0xC10CC10C)
r0, c0 = hits[0]
reg = a[r0:r0 + 128, c0:c0 + 128].reshape(-1).astype(np.int64)
seq = int(reg[1]); d = reg[2:2 + 8192].reshape(8, 1024)
S = min(seq, 1024)
P0, P1, C2, C3, C4, C5, P2, _ = [x[:S] for x in d]
def med(x): return float(np.median(x))
def q(x): return "med %.0f p10 %.0f p90 %.0f" % (np.median(x), np.percentile(x, 10), np.percentile(x, 90))
print("slices stamped", S, "of", seq)
s = np.arange(8, S)
print("period (C3[s]-C3[s-1])", q(C3[1:] - C3[:-1]))
print("consumer wait for full (C3-C2)", q(C3 - C2))
print("consumer work (C4-C3)", q(C4 - C3))
print("wg1 full vs wg0 full (C5-C3)", q(C5 - C3))
print("producer wait on empty (P1-P0)", q(P1 - P0))
print("producer issue (P2-P1)", q(P2 - P1))
print("producer own-slice period (P0[s+4]-P0[s])", q(P0[4:] - P0[:-4]))
print("producer loop rest (P0[s+4]-P2[s])", q(P0[4:] - P2[:-4]))
print("issued -> consumer sees full (C3-P2)", q(C3 - P2))
print("release -> producer wake (P1[s]-C4[s-8])", q(P1[s] - C4[s - 8]))
print("producer wake -> consumer sees full (C3-P1)", q(C3 - P1))
print("producer wake ahead of consumer's wait (C2-P1)", q(C2 - P1))
print("slices 0-19 and 200-219: P0 P1 C2 C3 C4 C5 rel to C3[0]")
base = C3[0]
for i in list(range(0, 20)) + list(range(200, 220)):
    if i < S:
        print(i, *(int(x[i] - base) for x in (P0, P1, P2, C2, C3, C4, C5)))
