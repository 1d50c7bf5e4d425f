//! LLVM IR for the kernels of a plan.
//!
//! Every kernel becomes one exported function with the same C signature
//! `void k(i8** bufs, i64* dims, i64 r0, i64 r1, i64 c0, i64 c1)`: `bufs` holds one pointer per
//! operand slot then the output, `dims` the run-time sizes, and `[r0, r1) x [c0, c1)` the part of
//! the output this call computes, so that the caller decides how the work is split over threads.
//!
//! - GEMM: `c0..c1` are panels of `nr` output columns (B packed by [`crate::pack`]), `r0..r1` rows.
//!   For each panel and each block of `mr` rows an unrolled micro-kernel keeps `mr x nr`
//!   accumulators (two sets for a dual GEMM) in vector registers over the whole K loop: one
//!   broadcast of `A[i, k]` per row, `nr / lanes` aligned loads of the panel (f32, or f16 / bf16
//!   widened as loaded: `GemmSpec::wide_b`; bf16 panels two vectors from one load of
//!   interleaved halves, [`crate::pack::panel_pos`]; with `GemmSpec::store_wide` each widened vector is
//!   also stored into f32 panels whose bases follow the index in `bufs`), `llvm.fmuladd` per
//!   accumulator. The epilogue chain runs on the accumulators, then one masked store per vector
//!   converts to the output dtype. A row tail of `rem < mr` rows runs one micro-kernel per binary
//!   digit of `rem` (8, 4, 2, 1 rows); column tails are zero-padded panels and masked loads and
//!   stores. `dims = [M, N, K, a_row_stride, a_k_stride]`.
//! - Sparse GEMM: the same micro-kernel, but the K loop runs over the segments of the panel (the k
//!   ranges of kept blocks, [`crate::pack::BsrLayout`]), whose index follows the output in `bufs`;
//!   a panel without segments stores the epilogue of zero.
//! - Elementwise: rows `r0..r1` of the output seen as `[rows, cols]`, vectorised along the row
//!   with a masked tail; `dims = [rows, cols]`.
//! - Transpose: output rows `r0..r1` of `[batch * R, C]` gathered from `[batch, C, R]`;
//!   `dims = [batch, R, C]`.
//!
//! Values are converted to f32 when loaded and rounded to nearest even when stored (bf16 and f16 by
//! integer bit code, so no conversion routine from a runtime library is ever called; f16 B panels
//! by `fpext`, one `vcvtph2ps`, where the host has F16C).

use super::{Cg, R};
use crate::pack::interleaved;
use crate::spec::{EwOp, EwSpec, Family, GemmSpec, Spec, Step};
use crate::CpuError;
use crate::Tiling;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::{AddressSpace, IntPredicate};
use mlpc_ir::DType;

/// The shared arguments of a kernel body.
struct Frame<'ctx> {
    bufs: PointerValue<'ctx>,
    dims: PointerValue<'ctx>,
}

impl<'ctx> Cg<'ctx> {
    /// Emits the exported function `name` for `spec`.
    pub(crate) fn emit_kernel(
        &self,
        name: &str,
        spec: &Spec,
        t: &Tiling,
    ) -> R<FunctionValue<'ctx>> {
        match &spec.family {
            Family::Gemm(g) => self.emit_gemm(name, spec, g, t),
            Family::Elementwise(e) => self.emit_elementwise(name, spec, e),
            Family::Transpose => self.emit_transpose(name, spec),
        }
    }

    fn frame(&self, f: FunctionValue<'ctx>) -> Frame<'ctx> {
        Frame {
            bufs: f
                .get_nth_param(0)
                .map(|p| p.into_pointer_value())
                .unwrap_or_else(|| {
                    unreachable!("kernel functions are declared with their parameters")
                }),
            dims: f
                .get_nth_param(1)
                .map(|p| p.into_pointer_value())
                .unwrap_or_else(|| {
                    unreachable!("kernel functions are declared with their parameters")
                }),
        }
    }

    fn param(&self, f: FunctionValue<'ctx>, i: u32) -> IntValue<'ctx> {
        f.get_nth_param(i)
            .map(|p| p.into_int_value())
            .unwrap_or_else(|| unreachable!("kernel functions are declared with their parameters"))
    }

    // ---------------------------------------------------------------- GEMM

    fn emit_gemm(
        &self,
        name: &str,
        spec: &Spec,
        g: &GemmSpec,
        t: &Tiling,
    ) -> R<FunctionValue<'ctx>> {
        let mr = if g.dual { t.mr_dual } else { t.mr };
        // Full blocks of `mr` rows; a tail of `rem < mr` rows is split into its binary digits, so
        // only log2(mr) + 1 micro-kernels are compiled.
        let full = self.emit_micro_kernel(&format!("{name}.mk{mr}"), spec, g, t, mr)?;
        let bits: Vec<usize> = (0..usize::BITS)
            .map(|b| 1usize << b)
            .take_while(|&b| b < mr)
            .collect();
        let tails: Vec<(usize, FunctionValue<'ctx>)> = bits
            .iter()
            .rev()
            .map(|&b| {
                Ok((
                    b,
                    self.emit_micro_kernel(&format!("{name}.mk{b}"), spec, g, t, b)?,
                ))
            })
            .collect::<R<_>>()?;
        let f = self.kernel_fn(name, 6, true);
        self.enter(f, "entry");
        let fr = self.frame(f);
        let (r0, r1, p0, p1) = (
            self.param(f, 2),
            self.param(f, 3),
            self.param(f, 4),
            self.param(f, 5),
        );
        let mr_c = self.i64(mr as u64);
        self.for_range(p0, p1, self.i64(1), "panel", |cg, p| {
            cg.for_range(r0, r1, mr_c, "rows", |cg, r| {
                let rem = cg.b.build_int_sub(r1, r, "rem")?;
                let cont = cg.ctx.append_basic_block(f, "mk.cont");
                let full_bb = cg.ctx.append_basic_block(f, "mk.full");
                let tail_bb = cg.ctx.append_basic_block(f, "mk.tail");
                let is_full =
                    cg.b.build_int_compare(IntPredicate::SGE, rem, mr_c, "is.full")?;
                cg.b.build_conditional_branch(is_full, full_bb, tail_bb)?;
                cg.b.position_at_end(full_bb);
                cg.b.build_call(
                    full,
                    &[fr.bufs.into(), fr.dims.into(), r.into(), p.into()],
                    "",
                )?;
                cg.b.build_unconditional_branch(cont)?;
                cg.b.position_at_end(tail_bb);
                for &(bit, mk) in &tails {
                    // Rows of the larger digits come first.
                    let above =
                        cg.b.build_and(rem, cg.i64(!((bit as u64) * 2 - 1)), "above")?;
                    let row = cg.b.build_int_add(r, above, "tail.row")?;
                    let has = cg.b.build_and(rem, cg.i64(bit as u64), "has")?;
                    let has =
                        cg.b.build_int_compare(IntPredicate::NE, has, cg.i64(0), "has.bit")?;
                    let call_bb = cg.ctx.append_basic_block(f, &format!("mk.tail{bit}"));
                    let next_bb = cg.ctx.append_basic_block(f, &format!("mk.after{bit}"));
                    cg.b.build_conditional_branch(has, call_bb, next_bb)?;
                    cg.b.position_at_end(call_bb);
                    cg.b.build_call(
                        mk,
                        &[fr.bufs.into(), fr.dims.into(), row.into(), p.into()],
                        "",
                    )?;
                    cg.b.build_unconditional_branch(next_bb)?;
                    cg.b.position_at_end(next_bb);
                }
                cg.b.build_unconditional_branch(cont)?;
                cg.b.position_at_end(cont);
                Ok(())
            })
        })?;
        self.b.build_return(None)?;
        Ok(f)
    }

    /// `mk(bufs, dims, row, panel)`: rows `row .. row + rows` of output panel `panel`.
    fn emit_micro_kernel(
        &self,
        name: &str,
        spec: &Spec,
        g: &GemmSpec,
        t: &Tiling,
        rows: usize,
    ) -> R<FunctionValue<'ctx>> {
        let nv = t.nr / self.lanes as usize;
        if nv % 2 == 1
            && g.b_slots()
                .any(|s| interleaved(t.nr, g.panel_dtype(spec.dtypes[s])))
        {
            return Err(CpuError::Unsupported {
                kernel: name.to_string(),
                message: format!(
                    "bf16 panels of {} columns are read in pairs of {}-lane vectors",
                    t.nr, self.lanes
                ),
            });
        }
        let f = self.kernel_fn(name, 4, false);
        self.enter(f, "entry");
        let fr = self.frame(f);
        let (row, panel) = (self.param(f, 2), self.param(f, 3));
        let n = self.dim(fr.dims, 1)?;
        let k = self.dim(fr.dims, 2)?;
        let (sam, sak) = (self.dim(fr.dims, 3)?, self.dim(fr.dims, 4)?);
        let a = self.buf(fr.bufs, 0)?;
        let a_dt = spec.dtypes[0];
        let nr = self.i64(t.nr as u64);

        let a_rows: Vec<IntValue<'ctx>> = (0..rows)
            .map(|i| {
                let r = self.b.build_int_add(row, self.i64(i as u64), "a.row")?;
                Ok(self.b.build_int_mul(r, sam, "a.off")?)
            })
            .collect::<R<_>>()?;

        // One k step: `b_row` is the row of the panels (their bases and dtypes in `panels`),
        // `a_k` the column of A it multiplies; with `store_wide`, `wide` holds the bases of the
        // f32 panels each loaded vector is stored to.
        let step = |cg: &Self,
                    panels: &[(PointerValue<'ctx>, DType)],
                    wide: &[PointerValue<'ctx>],
                    b_row: IntValue<'ctx>,
                    a_k: IntValue<'ctx>,
                    acc: &[BasicValueEnum<'ctx>]|
         -> R<Vec<BasicValueEnum<'ctx>>> {
            let mut bv = Vec::new();
            let row_off = cg.b.build_int_mul(b_row, nr, "b.row")?;
            let lanes = cg.lanes as usize;
            let at = |j: usize| {
                cg.b.build_int_add(row_off, cg.i64((j * lanes) as u64), "b.off")
            };
            for (pi, &(p, dt)) in panels.iter().enumerate() {
                let mut v = Vec::with_capacity(nv);
                if interleaved(t.nr, dt) {
                    // Vector `j < nv / 2` and vector `nv / 2 + j` from one load.
                    let mut hi = Vec::with_capacity(nv / 2);
                    for j in 0..nv / 2 {
                        let (l, h) = cg.load_packed_pair(p, at(2 * j)?)?;
                        v.push(l);
                        hi.push(h);
                    }
                    v.extend(hi);
                } else {
                    for j in 0..nv {
                        v.push(cg.load_packed(p, dt, at(j)?)?);
                    }
                }
                if let Some(&w) = wide.get(pi) {
                    for (j, &x) in v.iter().enumerate() {
                        cg.store_vec_aligned(w, at(j)?, x)?;
                    }
                }
                bv.extend(v);
            }
            let a_k = cg.b.build_int_mul(a_k, sak, "a.k")?;
            let mut out = acc.to_vec();
            for (i, a_row) in a_rows.iter().enumerate() {
                let off = cg.b.build_int_add(*a_row, a_k, "a.idx")?;
                let av = cg.load_splat(a, a_dt, off)?;
                for pi in 0..panels.len() {
                    for j in 0..nv {
                        let idx = (pi * rows + i) * nv + j;
                        let v = cg.fma(av, bv[pi * nv + j], acc[idx].into_vector_value())?;
                        out[idx] = v.into();
                    }
                }
            }
            Ok(out)
        };

        // With the bf16 dot product: one step takes rows `b_row`, `b_row + 1` of the panels
        // (paired, `crate::pack::pair_rows`) and columns `a_k`, `a_k + 1` of A.
        let dot = |cg: &Self,
                   panels: &[(PointerValue<'ctx>, DType)],
                   b_row: IntValue<'ctx>,
                   a_k: IntValue<'ctx>,
                   acc: &[BasicValueEnum<'ctx>]|
         -> R<Vec<BasicValueEnum<'ctx>>> {
            let row_off = cg.b.build_int_mul(b_row, nr, "b.row")?;
            let mut bv = Vec::with_capacity(panels.len() * nv);
            for &(p, _) in panels {
                for j in 0..nv {
                    let at = cg.i64((j * 2 * cg.lanes as usize) as u64);
                    let at = cg.b.build_int_add(row_off, at, "b.off")?;
                    bv.push(cg.load_bf16_pairs(p, at)?);
                }
            }
            let a_k = cg.b.build_int_mul(a_k, sak, "a.k")?;
            let mut out = acc.to_vec();
            for (i, a_row) in a_rows.iter().enumerate() {
                let off = cg.b.build_int_add(*a_row, a_k, "a.idx")?;
                let av = cg.splat_bf16_pair(a, off)?;
                for pi in 0..panels.len() {
                    for j in 0..nv {
                        let idx = (pi * rows + i) * nv + j;
                        let v = cg.dot_bf16(acc[idx].into_vector_value(), av, bv[pi * nv + j])?;
                        out[idx] = v.into();
                    }
                }
            }
            Ok(out)
        };
        let k_step = self.i64(if g.bf16_dot { 2 } else { 1 });

        let zero: BasicValueEnum<'ctx> = self.vf.const_zero().into();
        let nacc = g.b_slots().len() * rows * nv;
        // The f32 panels' bases, after the output and the index.
        let wide_bases: Vec<PointerValue<'ctx>> = if g.store_wide {
            let first = spec.dtypes.len() + usize::from(g.sparse.is_some());
            (0..g.b_slots().len())
                .map(|i| self.buf(fr.bufs, first + i))
                .collect::<R<_>>()?
        } else {
            Vec::new()
        };
        let accs = match &g.sparse {
            None => {
                // Panel bases: panel * K * nr.
                let panel_len = self.b.build_int_mul(k, nr, "panel.len")?;
                let panel_off = self.b.build_int_mul(panel, panel_len, "panel.off")?;
                let mut panels = Vec::new();
                for slot in g.b_slots() {
                    let (p, dt) = (self.buf(fr.bufs, slot)?, g.panel_dtype(spec.dtypes[slot]));
                    panels.push((self.elem_ptr(p, dt, panel_off)?, dt));
                }
                let wide = wide_bases
                    .iter()
                    .map(|&w| self.elem_ptr(w, DType::F32, panel_off))
                    .collect::<R<Vec<_>>>()?;
                self.loop_carry(
                    self.i64(0),
                    k,
                    k_step,
                    "k",
                    &vec![zero; nacc],
                    |cg, kk, acc| {
                        if g.bf16_dot {
                            dot(cg, &panels, kk, kk, acc)
                        } else {
                            step(cg, &panels, &wide, kk, kk, acc)
                        }
                    },
                )?
            }
            Some(_) => {
                // The segments of this panel, from the index after the output pointer.
                let idx = self.buf(fr.bufs, spec.dtypes.len())?;
                let idx = self.b.build_pointer_cast(
                    idx,
                    self.i64t.ptr_type(AddressSpace::default()),
                    "idx",
                )?;
                let panels_n = self.b.build_int_add(
                    self.b.build_int_signed_div(
                        self.b.build_int_add(
                            n,
                            self.b.build_int_sub(nr, self.i64(1), "nr1")?,
                            "n.up",
                        )?,
                        nr,
                        "panels",
                    )?,
                    self.i64(1),
                    "seg.base",
                )?;
                let seg_lo = self.load_index(idx, panel)?;
                let next = self.b.build_int_add(panel, self.i64(1), "panel.next")?;
                let seg_hi = self.load_index(idx, next)?;
                let slots: Vec<(PointerValue<'ctx>, DType)> = g
                    .b_slots()
                    .map(|slot| Ok((self.buf(fr.bufs, slot)?, g.panel_dtype(spec.dtypes[slot]))))
                    .collect::<R<_>>()?;
                self.loop_carry(
                    seg_lo,
                    seg_hi,
                    self.i64(1),
                    "seg",
                    &vec![zero; nacc],
                    |cg, s, acc| {
                        let at = cg.b.build_int_add(
                            panels_n,
                            cg.b.build_int_mul(s, cg.i64(3), "seg.3")?,
                            "seg.at",
                        )?;
                        let k0 = cg.load_index(idx, at)?;
                        let at1 = cg.b.build_int_add(at, cg.i64(1), "seg.at1")?;
                        let len = cg.load_index(idx, at1)?;
                        let at2 = cg.b.build_int_add(at, cg.i64(2), "seg.at2")?;
                        let off = cg.load_index(idx, at2)?;
                        let panels: Vec<(PointerValue<'ctx>, DType)> = slots
                            .iter()
                            .map(|&(p, dt)| Ok((cg.elem_ptr(p, dt, off)?, dt)))
                            .collect::<R<_>>()?;
                        let wide = wide_bases
                            .iter()
                            .map(|&w| cg.elem_ptr(w, DType::F32, off))
                            .collect::<R<Vec<_>>>()?;
                        cg.loop_carry(cg.i64(0), len, k_step, "k", acc, |cg, kk, acc| {
                            let a_k = cg.b.build_int_add(k0, kk, "a.kk")?;
                            if g.bf16_dot {
                                dot(cg, &panels, kk, a_k, acc)
                            } else {
                                step(cg, &panels, &wide, kk, a_k, acc)
                            }
                        })
                    },
                )?
            }
        };

        // Epilogue and store.
        let out_slot = spec.dtypes.len() - 1;
        let out = self.buf(fr.bufs, out_slot)?;
        let out_dt = spec.dtypes[out_slot];
        let col0 = self.b.build_int_mul(panel, nr, "col0")?;
        for j in 0..nv {
            let col =
                self.b
                    .build_int_add(col0, self.i64((j * self.lanes as usize) as u64), "col")?;
            let mask = self.tail_mask(col, n)?;
            for i in 0..rows {
                let r = self.b.build_int_add(row, self.i64(i as u64), "row")?;
                let rn = self.b.build_int_mul(r, n, "row.off")?;
                let at = |pi: usize| accs[(pi * rows + i) * nv + j].into_vector_value();
                let ctx = EpiCtx {
                    fr: &fr,
                    spec,
                    col,
                    row_off: rn,
                    mask,
                };
                let mut v = at(0);
                if g.dual {
                    let gate = self.chain(&g.gate, v, &ctx)?;
                    let up = self.chain(&g.up, at(1), &ctx)?;
                    v = self.b.build_float_mul(gate, up, "glu")?;
                }
                v = self.chain(&g.epi, v, &ctx)?;
                let off = self.b.build_int_add(rn, col, "out.off")?;
                self.store_vec(v, out, out_dt, off, mask)?;
            }
        }
        self.b.build_return(None)?;
        Ok(f)
    }

    fn chain(
        &self,
        steps: &[Step],
        mut v: VectorValue<'ctx>,
        c: &EpiCtx<'_, 'ctx>,
    ) -> R<VectorValue<'ctx>> {
        for step in steps {
            v = match *step {
                Step::Act(a) => self.activation(a, v)?,
                Step::Bias(s) => {
                    let p = self.buf(c.fr.bufs, s)?;
                    let x = self.load_vec(p, c.spec.dtypes[s], c.col, c.mask)?;
                    self.b.build_float_add(v, x, "bias")?
                }
                Step::Add(s) | Step::Mul(s) => {
                    let p = self.buf(c.fr.bufs, s)?;
                    let off = self.b.build_int_add(c.row_off, c.col, "epi.off")?;
                    let x = self.load_vec(p, c.spec.dtypes[s], off, c.mask)?;
                    if matches!(step, Step::Add(_)) {
                        self.b.build_float_add(v, x, "res")?
                    } else {
                        self.b.build_float_mul(v, x, "mul")?
                    }
                }
            };
        }
        Ok(v)
    }

    // ---------------------------------------------------------------- elementwise

    fn emit_elementwise(&self, name: &str, spec: &Spec, e: &EwSpec) -> R<FunctionValue<'ctx>> {
        let f = self.kernel_fn(name, 6, true);
        self.enter(f, "entry");
        let fr = self.frame(f);
        let (r0, r1) = (self.param(f, 2), self.param(f, 3));
        let cols = self.dim(fr.dims, 1)?;
        let nargs = e.row_broadcast.len();
        let ptrs: Vec<PointerValue<'ctx>> = (0..=nargs)
            .map(|s| self.buf(fr.bufs, s))
            .collect::<R<_>>()?;
        let w = self.i64(self.lanes as u64);
        self.for_range(r0, r1, self.i64(1), "row", |cg, r| {
            let row_off = cg.b.build_int_mul(r, cols, "row.off")?;
            cg.for_range(cg.i64(0), cols, w, "col", |cg, c| {
                let mask = cg.tail_mask(c, cols)?;
                let off = cg.b.build_int_add(row_off, c, "off")?;
                let mut vals = Vec::new();
                for (s, &bcast) in e.row_broadcast.iter().enumerate() {
                    let o = if bcast { c } else { off };
                    vals.push(cg.load_vec(ptrs[s], spec.dtypes[s], o, mask)?);
                }
                let v = match e.op {
                    EwOp::Add => cg.b.build_float_add(vals[0], vals[1], "add")?,
                    EwOp::Mul => cg.b.build_float_mul(vals[0], vals[1], "mul")?,
                    EwOp::Act(a) => cg.activation(a, vals[0])?,
                };
                cg.store_vec(v, ptrs[nargs], spec.dtypes[nargs], off, mask)
            })
        })?;
        self.b.build_return(None)?;
        Ok(f)
    }

    // ---------------------------------------------------------------- transpose

    fn emit_transpose(&self, name: &str, spec: &Spec) -> R<FunctionValue<'ctx>> {
        let f = self.kernel_fn(name, 6, true);
        self.enter(f, "entry");
        let fr = self.frame(f);
        let (q0, q1) = (self.param(f, 2), self.param(f, 3));
        let rr = self.dim(fr.dims, 1)?;
        let cc = self.dim(fr.dims, 2)?;
        let src = self.buf(fr.bufs, 0)?;
        let dst = self.buf(fr.bufs, 1)?;
        let (sdt, ddt) = (spec.dtypes[0], spec.dtypes[1]);
        self.for_range(q0, q1, self.i64(1), "q", |cg, q| {
            let b = cg.b.build_int_signed_div(q, rr, "b")?;
            let br = cg.b.build_int_mul(b, rr, "b.r")?;
            let i = cg.b.build_int_sub(q, br, "i")?;
            let plane = cg.b.build_int_mul(br, cc, "plane")?;
            let base = cg.b.build_int_add(plane, i, "base")?;
            let out_row = cg.b.build_int_mul(q, cc, "out.row")?;
            cg.for_range(cg.i64(0), cc, cg.i64(1), "j", |cg, j| {
                let jr = cg.b.build_int_mul(j, rr, "j.r")?;
                let si = cg.b.build_int_add(base, jr, "src.i")?;
                let di = cg.b.build_int_add(out_row, j, "dst.i")?;
                let v = cg.load_scalar_raw(src, sdt, si)?;
                if sdt == ddt {
                    cg.store_scalar_raw(v, dst, ddt, di)
                } else {
                    let x = cg.raw_scalar_to_f32(v, sdt)?;
                    let y = cg.f32_scalar_to_raw(x, ddt)?;
                    cg.store_scalar_raw(y, dst, ddt, di)
                }
            })
        })?;
        self.b.build_return(None)?;
        Ok(f)
    }
}

/// What an epilogue step needs to address its operand.
struct EpiCtx<'a, 'ctx> {
    fr: &'a Frame<'ctx>,
    spec: &'a Spec,
    col: IntValue<'ctx>,
    row_off: IntValue<'ctx>,
    mask: VectorValue<'ctx>,
}
