#!/usr/bin/env python3
"""Runs every kernel of a bundle written by `cargo run -p mlpc-jit --example gpu_bundle -- DIR`
on the GPU and compares each one with a float64 reference computed from the plan's semantics
(those of mlpc_ir::interp), on fresh random inputs, with outputs poisoned with NaN first.

Each kernel is checked in isolation: its reference is computed from the very buffers it read, so
an error points at one kernel. Every plan runs for several values of its symbols, once with every
buffer 16-byte aligned and once with every buffer shifted by one element (the scalar, unaligned
paths of the templates).

Needs PyTorch with CUDA (for memory and the reference) and libcuda (ctypes) to load the CUBINs.
Usage: check_kernels.py DIR [--quick] [--time T]
  --quick   one value of the symbols (T = 37) instead of four
  --time T  also time every kernel at T (median of 50 launches after warm-up, CUDA events)
"""
import ctypes
import json
import math
import os
import sys

import torch

TOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
    ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def extent(e, b):
    if isinstance(e, int):
        return e
    v = 1
    for part in str(e).split("*"):
        v *= int(part) if part.isdigit() else b[part]
    return v


def act(name, x):
    if name == "relu":
        return torch.clamp(x, min=0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x * x * x)))
    if name == "silu":
        return x / (1.0 + torch.exp(-x))
    if name == "sigmoid":
        return 1.0 / (1.0 + torch.exp(-x))
    if name == "tanh":
        return torch.tanh(x)
    raise ValueError(name)


def mat(t, layout):
    m = t.double().reshape(-1, t.shape[-1]) if t.dim() >= 2 else t.double().reshape(1, -1)
    return m.T if layout == "t" else m


def chain(acc, steps, args):
    n = acc.shape[1]
    for s in steps:
        if "act" in s:
            acc = act(s["act"], acc)
            continue
        (kind, v), = s.items()
        r = args[v["operand"]].double().reshape(-1, n)
        acc = acc + r if kind in ("bias", "add") else acc * r
    return acc


def reference(op, args, out_shape):
    if op == "mat_mul":
        op = {"gemm": {"a": "n", "b": "n", "dual": None, "epilogue": []}}
    if isinstance(op, dict) and "gemm" in op:
        g = op["gemm"]
        a = mat(args[0], g["a"])
        acc = a @ mat(args[1], g["b"])
        if g["dual"]:
            up = a @ mat(args[2], g["b"])
            acc = chain(acc, g["dual"]["gate"], args) * chain(up, g["dual"]["up"], args)
        return chain(acc, g["epilogue"], args).reshape(out_shape)
    if op == "add":
        return args[0].double() + args[1].double()
    if op == "mul":
        return args[0].double() * args[1].double()
    if op == "transpose":
        return args[0].double().transpose(-1, -2)
    if isinstance(op, dict) and "act" in op:
        return act(op["act"], args[0].double())
    if isinstance(op, str):
        return act(op, args[0].double())
    raise ValueError(op)


def run_plan(pdir, plan, bindings, shift, gen, timing=False):
    kdir = os.path.join(pdir, "kernels")
    bufs = []
    for b in plan["buffers"]:
        shape = [extent(d, bindings) for d in b["shape"]]
        strides = [extent(s, bindings) for s in b["strides"]]
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 0
        flat = torch.empty(span + shift + 64, dtype=DT[b["dtype"]], device="cuda")
        if b["kind"] in ("input", "weight"):
            scale = 1.0 if b["kind"] == "input" else 1.0 / math.sqrt(max(shape[-1], 1))
            flat.copy_((torch.randn(flat.numel(), generator=gen, dtype=torch.float64) * scale).to(flat.dtype))
        else:
            flat.fill_(float("nan"))
        bufs.append(flat[shift:].as_strided(shape, strides))
    rows = []
    for k in plan["kernels"]:
        meta = json.load(open(os.path.join(kdir, k["name"] + ".json")))
        cubin = open(os.path.join(kdir, k["name"] + ".cubin"), "rb").read()
        mod = ctypes.c_void_p()
        ck(cuda.cuModuleLoadData(ctypes.byref(mod), cubin), "cuModuleLoadData")
        fn = ctypes.c_void_p()
        ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, meta["entry"].encode()), "cuModuleGetFunction")
        launch = meta["launch"]
        grid_rule = launch["grid"]
        if grid_rule["kind"] == "tiles":
            grid = [-(-extent(grid_rule["m"], bindings) // grid_rule["tile_m"]),
                    -(-extent(grid_rule["n"], bindings) // grid_rule["tile_n"]), 1]
        else:
            grid = [-(-extent(grid_rule["numel"], bindings) // grid_rule["per_block"]), 1, 1]
        vals = []
        for p in meta["params"]:
            if p["kind"] == "buffer":
                vals.append(ctypes.c_uint64(bufs[p["buffer"]].data_ptr()))
            else:
                vals.append(ctypes.c_int64(bindings[p["symbol"]]))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
        smem = launch["smem_bytes"]
        if smem > 48 * 1024:
            ck(cuda.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute")
        stream = torch.cuda.current_stream().cuda_stream

        def go():
            ck(cuda.cuLaunchKernel(fn, *grid, *launch["block"], smem, ctypes.c_void_p(stream), ptrs, None),
               "cuLaunchKernel")

        if min(grid) > 0:
            go()
        torch.cuda.synchronize()
        ms = None
        if timing and min(grid) > 0:
            for _ in range(5):
                go()
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                go()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            ms = sorted(times)[len(times) // 2]
        out = bufs[k["out"]]
        args = [bufs[i] for i in k["args"]]
        ref = reference(k["op"], args, list(out.shape))
        got = out.double()
        nan = bool(torch.isnan(got).any())
        den = torch.linalg.norm(ref).item()
        err = torch.linalg.norm(got - ref).item() / (den if den > 0 else 1.0)
        ok = (not nan) and err <= TOL[plan["dtype"]]
        if timing:
            flops = None
            op = k["op"]
            if op == "mat_mul" or (isinstance(op, dict) and "gemm" in op):
                a = mat(args[0], "n" if op == "mat_mul" else op["gemm"]["a"])
                flops = 2.0 * out.numel() * a.shape[1] * (2 if isinstance(op, dict) and op["gemm"]["dual"] else 1)
            tf = f"{flops / (ms * 1e9):.1f} TFLOP/s" if flops else f"{sum(b.numel() * b.element_size() for b in args + [out]) / (ms * 1e6):.0f} GB/s"
            print(f"time | {plan['name']} | {meta['entry']} | {dict(bindings)} | {ms * 1000:.1f} us | {tf} |")
        rows.append((plan["name"], k["name"], meta["entry"], dict(bindings), shift, err, nan, ok))
    return rows


def main():
    root = sys.argv[1]
    quick = "--quick" in sys.argv
    time_t = int(sys.argv[sys.argv.index("--time") + 1]) if "--time" in sys.argv else None
    gen = torch.Generator().manual_seed(0)
    torch.zeros(1, device="cuda")  # creates and binds the primary context
    all_rows = []
    for name in sorted(os.listdir(root)):
        pdir = os.path.join(root, name)
        plan = json.load(open(os.path.join(pdir, "plan.json")))
        syms = sorted({p for b in plan["buffers"] for d in b["shape"] if isinstance(d, str) for p in d.split("*")
                       if not p.isdigit()})
        ts = [37] if quick else [1, 37, 128, 300]
        for t in ts:
            bindings = {s: (3 if s == "B" else t) for s in syms}
            for shift in (0, 1):
                all_rows.extend(run_plan(pdir, plan, bindings, shift, gen))
        if time_t is not None:
            run_plan(pdir, plan, {s: (4 if s == "B" else time_t) for s in syms}, 0, gen, timing=True)
    bad = [r for r in all_rows if not r[-1]]
    print(f"| plan | kernel | entry | bindings | shift | rel. error | NaN | ok |")
    print(f"|---|---|---|---|---|---|---|---|")
    for r in all_rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.2e} | {r[6]} | {'ok' if r[7] else 'FAIL'} |")
    print(f"\n{len(all_rows) - len(bad)} of {len(all_rows)} kernel runs within tolerance")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
