#!/usr/bin/env python3
"""Writes the jump-table slice of `wgmma_issue.cu` (the region between its `BRX BEGIN` / `BRX END`
markers): one `asm` block per nibble of a slice's mask, `brx.idx` on the nibble's value to one of
16 straight-line sequences of the kept blocks' wgmmas (m64n32k16, A from registers, K16 = 4 k16
steps a block). NVVM lowers a C++ `switch` to a tree of compares (block-sparse variant 19 in
docs/perf-notes.md); this is the one-indirect-branch form. Run from the repository root after
changing it: python3 scripts/gpu/wgmma_issue_brx.py
"""
import re
import sys

PATH = "scripts/gpu/wgmma_issue.cu"
ACC = 16  # m64n32k16: 16 f32 accumulators a thread
K16 = 4


def nibble_asm():
    # Operands: %0..%63 the four blocks' accumulators, %64..%79 the A fragments (k16 step j:
    # %64 + 4 j ..), %80..%95 the descriptors (block i, step j: %80 + 4 i + j), %96 the nibble.
    acc = lambda i: ", ".join(f"%{ACC * i + e}" for e in range(ACC))
    frag = lambda j: ", ".join(f"%{64 + 4 * j + q}" for q in range(4))
    lines = ["{", "$ts: .branchtargets " + ", ".join(f"$c{m}" for m in range(16)) + ";",
             "brx.idx.uni %96, $ts;"]
    for m in range(16):
        lines.append(f"$c{m}:")
        for i in range(4):
            if (m >> i) & 1:
                for j in range(K16):
                    lines.append(
                        f"wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{acc(i)}}}, "
                        f"{{{frag(j)}}}, %{80 + 4 * i + j}, 1, 1, 1, 0;")
        lines.append("bra.uni $done;")
    lines += ["$done:", "}"]
    return lines


def region():
    out = ["// BRX BEGIN (written by scripts/gpu/wgmma_issue_brx.py; do not edit by hand)",
           "/// The kept blocks of nibble `nib` (blocks 4n .. 4n + 3 of a slice: `a0` .. `a3` their",
           "/// accumulators, `d[i][j]` block i's descriptor at k16 step j) through one `brx.idx`.",
           "__device__ __forceinline__ void brx_nibble(float (&a0)[16], float (&a1)[16], float (&a2)[16],",
           "                                           float (&a3)[16], const u32 (&f)[4][4],",
           "                                           const u64 (&d)[4][4], u32 nib) {",
           "    asm volatile("]
    for line in nibble_asm():
        out.append(f'        "{line}\\n"')
    outs = ", ".join(f'"+f"(a{i}[{e}])' for i in range(4) for e in range(ACC))
    ins = ", ".join([f'"r"(f[{j}][{q}])' for j in range(K16) for q in range(4)]
                    + [f'"l"(d[{i}][{j}])' for i in range(4) for j in range(K16)] + ['"r"(nib)'])
    out.append(f"        : {outs}")
    out.append(f"        : {ins});")
    out.append("}")
    out.append("// BRX END")
    return "\n".join(out)


def main():
    src = open(PATH).read()
    new, n = re.subn(r"// BRX BEGIN.*?// BRX END", lambda _: region(), src, flags=re.S)
    if n != 1:
        sys.exit(f"{PATH}: no BRX BEGIN / BRX END region")
    if new != src:
        open(PATH, "w").write(new)


if __name__ == "__main__":
    main()
