//! The LLVM half of the backend: IR construction helpers ([`Cg`]), the kernels ([`emit`]), vector
//! math ([`math`]) and the JIT that turns a module into host code ([`Jit`]).

mod emit;
mod math;

use crate::spec::Spec;
use crate::{CpuError, Tiling};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::types::{BasicType, BasicTypeEnum, FloatType, IntType, VectorType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, InstructionValue, IntValue,
    PointerValue, VectorValue,
};
use inkwell::{AddressSpace, IntPredicate, OptimizationLevel};
use mlpc_ir::DType;
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

pub(crate) type R<T> = Result<T, CpuError>;

impl From<BuilderError> for CpuError {
    fn from(e: BuilderError) -> CpuError {
        CpuError::Llvm {
            stage: "building IR",
            message: e.to_string(),
        }
    }
}

/// The C signature of every exported kernel; see [`emit`].
pub(crate) type KernelFn = unsafe extern "C" fn(*const *const u8, *const i64, i64, i64, i64, i64);

/// What LLVM reports about the machine we run on.
#[derive(Clone, Debug)]
pub(crate) struct Host {
    pub cpu: String,
    pub features: String,
    pub triple: String,
}

impl Host {
    /// SIMD width in f32 lanes implied by the features.
    pub fn lanes(&self) -> u32 {
        let has = |f: &str| self.features.split(',').any(|x| x == f);
        if has("+avx512f") {
            16
        } else if has("+avx") {
            8
        } else {
            4
        }
    }

    /// Whether the host has 512-bit vectors and the AVX-512 BF16 dot product (`vdpbf16ps`).
    pub fn bf16_dot(&self) -> bool {
        self.lanes() == 16 && self.features.split(',').any(|x| x == "+avx512bf16")
    }

    /// Whether the host converts f16 to f32 in one instruction (F16C: `vcvtph2ps`).
    pub fn f16c(&self) -> bool {
        self.features.split(',').any(|x| x == "+f16c")
    }
}

static NATIVE: OnceLock<Result<Host, String>> = OnceLock::new();

/// Initialises LLVM's native target once and describes the host.
pub(crate) fn host() -> R<Host> {
    NATIVE
        .get_or_init(|| {
            Target::initialize_native(&InitializationConfig::default())?;
            Ok(Host {
                cpu: TargetMachine::get_host_cpu_name().to_string(),
                features: TargetMachine::get_host_cpu_features().to_string(),
                triple: TargetMachine::get_default_triple()
                    .as_str()
                    .to_string_lossy()
                    .into_owned(),
            })
        })
        .clone()
        .map_err(|message| CpuError::Llvm {
            stage: "initialising the native target",
            message,
        })
}

/// IR construction state for one module.
pub(crate) struct Cg<'ctx> {
    ctx: &'ctx Context,
    module: Module<'ctx>,
    b: Builder<'ctx>,
    lanes: u32,
    f32t: FloatType<'ctx>,
    i16t: IntType<'ctx>,
    i32t: IntType<'ctx>,
    i64t: IntType<'ctx>,
    /// `<lanes x float>`, `<lanes x i32>`, `<lanes x i16>`.
    vf: VectorType<'ctx>,
    vi32: VectorType<'ctx>,
    vi16: VectorType<'ctx>,
    /// [`Host::f16c`]: packed f16 panels widen with `fpext`.
    f16c: bool,
    fn_attrs: Vec<Attribute>,
}

impl<'ctx> Cg<'ctx> {
    fn new(ctx: &'ctx Context, host: &Host, lanes: u32) -> Cg<'ctx> {
        let module = ctx.create_module("mlpc");
        let width = (lanes * 32).to_string();
        let fn_attrs = vec![
            ctx.create_string_attribute("target-cpu", &host.cpu),
            ctx.create_string_attribute("target-features", &host.features),
            ctx.create_string_attribute("prefer-vector-width", &width),
            ctx.create_string_attribute("min-legal-vector-width", &width),
            ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("nounwind"), 0),
        ];
        let f32t = ctx.f32_type();
        let i16t = ctx.i16_type();
        let i32t = ctx.i32_type();
        Cg {
            ctx,
            module,
            b: ctx.create_builder(),
            lanes,
            f32t,
            i16t,
            i32t,
            i64t: ctx.i64_type(),
            vf: f32t.vec_type(lanes),
            vi32: i32t.vec_type(lanes),
            vi16: i16t.vec_type(lanes),
            f16c: host.f16c(),
            fn_attrs,
        }
    }

    /// Declares `void name(i8**, i64*, i64 x (params - 2))`.
    fn kernel_fn(&self, name: &str, params: usize, exported: bool) -> FunctionValue<'ctx> {
        let i8pp = self
            .ctx
            .i8_type()
            .ptr_type(AddressSpace::default())
            .ptr_type(AddressSpace::default());
        let i64p = self.i64t.ptr_type(AddressSpace::default());
        let mut ps = vec![i8pp.into(), i64p.into()];
        ps.resize(params, self.i64t.into());
        let ty = self.ctx.void_type().fn_type(&ps, false);
        let linkage = if exported {
            Linkage::External
        } else {
            Linkage::Internal
        };
        let f = self.module.add_function(name, ty, Some(linkage));
        for a in &self.fn_attrs {
            f.add_attribute(AttributeLoc::Function, *a);
        }
        f
    }

    fn enter(&self, f: FunctionValue<'ctx>, block: &str) {
        let bb = self.ctx.append_basic_block(f, block);
        self.b.position_at_end(bb);
    }

    fn i64(&self, v: u64) -> IntValue<'ctx> {
        self.i64t.const_int(v, false)
    }

    fn splat_f(&self, x: f32) -> VectorValue<'ctx> {
        let c = self.f32t.const_float(x as f64);
        VectorType::const_vector(&vec![c; self.lanes as usize])
    }

    fn splat_i32(&self, x: u32) -> VectorValue<'ctx> {
        let c = self.i32t.const_int(x as u64, false);
        VectorType::const_vector(&vec![c; self.lanes as usize])
    }

    /// `bufs[slot]` as `i8*`.
    fn buf(&self, bufs: PointerValue<'ctx>, slot: usize) -> R<PointerValue<'ctx>> {
        // SAFETY (of the IR): the caller passes one pointer per slot; see `emit`.
        let p = unsafe {
            self.b
                .build_in_bounds_gep(bufs, &[self.i64(slot as u64)], "buf.p")?
        };
        Ok(self.b.build_load(p, "buf")?.into_pointer_value())
    }

    fn dim(&self, dims: PointerValue<'ctx>, i: usize) -> R<IntValue<'ctx>> {
        // SAFETY (of the IR): the caller passes every dim the kernel reads; see `emit`.
        let p = unsafe {
            self.b
                .build_in_bounds_gep(dims, &[self.i64(i as u64)], "dim.p")?
        };
        Ok(self.b.build_load(p, "dim")?.into_int_value())
    }

    /// `idx[i]` of an `i64*` index array, `i` computed at run time.
    fn load_index(&self, idx: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        // SAFETY (of the IR): the index arrays are built with every entry the kernel reads; see
        // `crate::pack::BsrLayout`.
        let p = unsafe { self.b.build_in_bounds_gep(idx, &[i], "idx.p")? };
        Ok(self.b.build_load(p, "idx")?.into_int_value())
    }

    fn elem_type(&self, dt: DType) -> BasicTypeEnum<'ctx> {
        match dt {
            DType::F32 => self.f32t.into(),
            DType::F16 | DType::Bf16 => self.i16t.into(),
        }
    }

    /// `<lanes x elem_type(dt)>`: a vector of `dt` values as stored.
    fn stored_vec_type(&self, dt: DType) -> VectorType<'ctx> {
        match dt {
            DType::F32 => self.vf,
            DType::F16 | DType::Bf16 => self.vi16,
        }
    }

    /// Address of element `off` of a `dt` array starting at the `i8*` `base`.
    fn elem_ptr(
        &self,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        let ty = self.elem_type(dt).ptr_type(AddressSpace::default());
        let p = self.b.build_pointer_cast(base, ty, "typed")?;
        // SAFETY (of the IR): offsets stay inside the buffers sized by the caller.
        Ok(unsafe { self.b.build_gep(p, &[off], "elem")? })
    }

    fn intrinsic(&self, name: &str, tys: &[BasicTypeEnum<'ctx>]) -> R<FunctionValue<'ctx>> {
        Intrinsic::find(name)
            .and_then(|i| i.get_declaration(&self.module, tys))
            .ok_or_else(|| CpuError::Llvm {
                stage: "declaring intrinsics",
                message: format!("`{name}` is not available"),
            })
    }

    fn call(
        &self,
        f: FunctionValue<'ctx>,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> R<BasicValueEnum<'ctx>> {
        self.b
            .build_call(f, args, "call")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CpuError::Llvm {
                stage: "building IR",
                message: "an intrinsic returned no value".into(),
            })
    }

    fn fma(
        &self,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
        c: VectorValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let f = self.intrinsic("llvm.fmuladd", &[self.vf.into()])?;
        Ok(self
            .call(f, &[a.into(), b.into(), c.into()])?
            .into_vector_value())
    }

    /// Lanes `i` with `col + i < n`, as `<lanes x i1>`.
    fn tail_mask(&self, col: IntValue<'ctx>, n: IntValue<'ctx>) -> R<VectorValue<'ctx>> {
        let rem = self.b.build_int_sub(n, col, "rem")?;
        let w = self.i64(self.lanes as u64);
        let big = self
            .b
            .build_int_compare(IntPredicate::SGT, rem, w, "rem.big")?;
        let rem = self.b.build_select(big, w, rem, "rem.c")?.into_int_value();
        let rem = self.b.build_int_truncate(rem, self.i32t, "rem.32")?;
        let iota: Vec<IntValue<'ctx>> = (0..self.lanes)
            .map(|i| self.i32t.const_int(i as u64, false))
            .collect();
        let iota = VectorType::const_vector(&iota);
        let remv = self.splat_int(rem)?;
        Ok(self
            .b
            .build_int_compare(IntPredicate::SLT, iota, remv, "mask")?)
    }

    fn splat_int(&self, x: IntValue<'ctx>) -> R<VectorValue<'ctx>> {
        let ty = x.get_type().vec_type(self.lanes);
        let v = self
            .b
            .build_insert_element(ty.get_undef(), x, self.i32t.const_zero(), "ins")?;
        let zeros = self.i32t.vec_type(self.lanes).const_zero();
        Ok(self
            .b
            .build_shuffle_vector(v, ty.get_undef(), zeros, "splat")?)
    }

    fn splat_float(&self, x: BasicValueEnum<'ctx>) -> R<VectorValue<'ctx>> {
        let v =
            self.b
                .build_insert_element(self.vf.get_undef(), x, self.i32t.const_zero(), "ins")?;
        let zeros = self.i32t.vec_type(self.lanes).const_zero();
        Ok(self
            .b
            .build_shuffle_vector(v, self.vf.get_undef(), zeros, "splat")?)
    }

    /// An aligned full vector of a packed B panel of `dt` (64-byte aligned base), as f32.
    fn load_packed(
        &self,
        panel: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let vty = self.stored_vec_type(dt);
        let p = self.elem_ptr(panel, dt, off)?;
        let vp = self
            .b
            .build_pointer_cast(p, vty.ptr_type(AddressSpace::default()), "b.vp")?;
        let v = self.b.build_load(vp, "b")?;
        if let Some(i) = v.as_instruction_value() {
            self.align(i, self.lanes * dt.size_bytes() as u32)?;
        }
        let v = v.into_vector_value();
        if dt == DType::F16 && self.f16c {
            // One `vcvtph2ps` where `raw_to_f32`'s exact bit arithmetic takes nine operations,
            // which cost an f16 model's compute-bound GEMMs a third of their speed. Exact too;
            // only a signalling NaN comes out quiet.
            let h = self.ctx.f16_type().vec_type(self.lanes);
            let h = self.b.build_bit_cast(v, h, "b.h")?.into_vector_value();
            return Ok(self.b.build_float_ext(h, self.vf, "b.f")?);
        }
        self.raw_to_f32(v, dt)
    }

    /// The two f32 vectors of interleaved bf16 panel elements `off .. off + 2 lanes`
    /// ([`crate::pack::panel_pos`]): loaded as `lanes` 32-bit lanes, each holding one column of
    /// either vector; the low halves widen by a shift, the high halves by a mask. One operation
    /// a vector where `load_packed` takes two (the zero extension and the shift).
    fn load_packed_pair(
        &self,
        panel: PointerValue<'ctx>,
        off: IntValue<'ctx>,
    ) -> R<(VectorValue<'ctx>, VectorValue<'ctx>)> {
        let v = self.load_bf16_pairs(panel, off)?;
        let lo = self.b.build_left_shift(v, self.splat_i32(16), "b.lo")?;
        let hi = self.b.build_and(v, self.splat_i32(0xffff_0000), "b.hi")?;
        Ok((self.as_float(lo)?, self.as_float(hi)?))
    }

    /// bf16 panel elements `off .. off + 2 lanes` (64-byte aligned) as `lanes` 32-bit lanes of
    /// two bf16 values each.
    fn load_bf16_pairs(
        &self,
        panel: PointerValue<'ctx>,
        off: IntValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let p = self.elem_ptr(panel, DType::Bf16, off)?;
        let vp =
            self.b
                .build_pointer_cast(p, self.vi32.ptr_type(AddressSpace::default()), "b.pp")?;
        let v = self.b.build_load(vp, "b.pair")?;
        if let Some(i) = v.as_instruction_value() {
            self.align(i, self.lanes * 4)?;
        }
        Ok(v.into_vector_value())
    }

    /// The bf16 elements `off` and `off + 1` of `base` as one 32-bit value in every lane.
    fn splat_bf16_pair(
        &self,
        base: PointerValue<'ctx>,
        off: IntValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let p = self.elem_ptr(base, DType::Bf16, off)?;
        let p =
            self.b
                .build_pointer_cast(p, self.i32t.ptr_type(AddressSpace::default()), "a.pp")?;
        let v = self.b.build_load(p, "a.pair")?;
        if let Some(i) = v.as_instruction_value() {
            self.align(i, 2)?;
        }
        self.splat_int(v.into_int_value())
    }

    /// `acc + a[2i] b[2i] + a[2i + 1] b[2i + 1]` in each f32 lane `i` of `acc`, `a` and `b`
    /// holding pairs of bf16 values a 32-bit lane: AVX-512 BF16's `vdpbf16ps` (the products are
    /// exact; subnormal inputs and results are flushed to zero).
    fn dot_bf16(
        &self,
        acc: VectorValue<'ctx>,
        a: VectorValue<'ctx>,
        b: VectorValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let f = self.intrinsic("llvm.x86.avx512bf16.dpbf16ps.512", &[])?;
        Ok(self
            .call(f, &[acc.into(), a.into(), b.into()])?
            .into_vector_value())
    }

    /// Stores the f32 vector `v` at element `off` of `base`, aligned as a panel load is.
    fn store_vec_aligned(
        &self,
        base: PointerValue<'ctx>,
        off: IntValue<'ctx>,
        v: VectorValue<'ctx>,
    ) -> R<()> {
        let p = self.elem_ptr(base, DType::F32, off)?;
        let vp = self
            .b
            .build_pointer_cast(p, self.vf.ptr_type(AddressSpace::default()), "w.vp")?;
        let st = self.b.build_store(vp, v)?;
        self.align(st, self.lanes * 4)
    }

    /// Marks the load or store `i` as aligned to `bytes`.
    fn align(&self, i: InstructionValue<'ctx>, bytes: u32) -> R<()> {
        i.set_alignment(bytes).map_err(|m| CpuError::Llvm {
            stage: "building IR",
            message: m.to_string(),
        })
    }

    /// Element `off` of `base` converted to f32 and broadcast to every lane.
    fn load_splat(
        &self,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let raw = self.load_scalar_raw(base, dt, off)?;
        match dt {
            DType::F32 => self.splat_float(raw),
            DType::Bf16 | DType::F16 => {
                let v = self.splat_int(raw.into_int_value())?;
                self.raw_to_f32(v, dt)
            }
        }
    }

    fn load_scalar_raw(
        &self,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let p = self.elem_ptr(base, dt, off)?;
        Ok(self.b.build_load(p, "ld")?)
    }

    fn store_scalar_raw(
        &self,
        v: BasicValueEnum<'ctx>,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
    ) -> R<()> {
        let p = self.elem_ptr(base, dt, off)?;
        self.b.build_store(p, v)?;
        Ok(())
    }

    fn raw_scalar_to_f32(&self, v: BasicValueEnum<'ctx>, dt: DType) -> R<BasicValueEnum<'ctx>> {
        if dt == DType::F32 {
            return Ok(v);
        }
        let vec = self.splat_int(v.into_int_value())?;
        let f = self.raw_to_f32(vec, dt)?;
        Ok(self
            .b
            .build_extract_element(f, self.i32t.const_zero(), "x")?)
    }

    fn f32_scalar_to_raw(&self, v: BasicValueEnum<'ctx>, dt: DType) -> R<BasicValueEnum<'ctx>> {
        if dt == DType::F32 {
            return Ok(v);
        }
        let vec = self.splat_float(v)?;
        let r = self.f32_to_raw(vec, dt)?;
        Ok(self
            .b
            .build_extract_element(r, self.i32t.const_zero(), "x")?)
    }

    /// `lanes` elements at `base[off..]` (lanes off in `mask` read as 0), converted to f32.
    fn load_vec(
        &self,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
        mask: VectorValue<'ctx>,
    ) -> R<VectorValue<'ctx>> {
        let vty = self.stored_vec_type(dt);
        let p = self.elem_ptr(base, dt, off)?;
        let vp = self
            .b
            .build_pointer_cast(p, vty.ptr_type(AddressSpace::default()), "vp")?;
        let f = self.intrinsic("llvm.masked.load", &[vty.into(), vp.get_type().into()])?;
        let align = self.i32t.const_int(dt.size_bytes() as u64, false);
        let raw = self
            .call(
                f,
                &[
                    vp.into(),
                    align.into(),
                    mask.into(),
                    vty.const_zero().into(),
                ],
            )?
            .into_vector_value();
        self.raw_to_f32(raw, dt)
    }

    /// Rounds `v` to `dt` and stores the lanes in `mask` at `base[off..]`.
    fn store_vec(
        &self,
        v: VectorValue<'ctx>,
        base: PointerValue<'ctx>,
        dt: DType,
        off: IntValue<'ctx>,
        mask: VectorValue<'ctx>,
    ) -> R<()> {
        let raw = self.f32_to_raw(v, dt)?;
        let p = self.elem_ptr(base, dt, off)?;
        let vp =
            self.b
                .build_pointer_cast(p, raw.get_type().ptr_type(AddressSpace::default()), "vp")?;
        let f = self.intrinsic(
            "llvm.masked.store",
            &[raw.get_type().into(), vp.get_type().into()],
        )?;
        let align = self.i32t.const_int(dt.size_bytes() as u64, false);
        self.b
            .build_call(f, &[raw.into(), vp.into(), align.into(), mask.into()], "")?;
        Ok(())
    }

    /// `for i in (start..end).step_by(step) { body(i) }`, with signed bounds.
    fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        name: &str,
        body: impl FnOnce(&Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        self.loop_carry(start, end, step, name, &[], |cg, i, _| {
            body(cg, i)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// A counted loop carrying `init` through `body`; returns the carried values at exit.
    fn loop_carry(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        name: &str,
        init: &[BasicValueEnum<'ctx>],
        body: impl FnOnce(
            &Self,
            IntValue<'ctx>,
            &[BasicValueEnum<'ctx>],
        ) -> R<Vec<BasicValueEnum<'ctx>>>,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let pre = self.b.get_insert_block().ok_or_else(|| CpuError::Llvm {
            stage: "building IR",
            message: "loop emitted outside a block".into(),
        })?;
        let f = pre.get_parent().ok_or_else(|| CpuError::Llvm {
            stage: "building IR",
            message: "block without a function".into(),
        })?;
        let header = self.ctx.append_basic_block(f, &format!("{name}.head"));
        let body_bb = self.ctx.append_basic_block(f, &format!("{name}.body"));
        let exit = self.ctx.append_basic_block(f, &format!("{name}.exit"));
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let iv = self.b.build_phi(self.i64t, name)?;
        iv.add_incoming(&[(&start, pre)]);
        let mut phis = Vec::new();
        for v in init {
            let p = self.b.build_phi(v.get_type(), "carry")?;
            p.add_incoming(&[(v, pre)]);
            phis.push(p);
        }
        let i = iv.as_basic_value().into_int_value();
        let go = self.b.build_int_compare(IntPredicate::SLT, i, end, "go")?;
        self.b.build_conditional_branch(go, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        let carried: Vec<BasicValueEnum<'ctx>> = phis.iter().map(|p| p.as_basic_value()).collect();
        let next_vals = body(self, i, &carried)?;
        let latch = self.b.get_insert_block().unwrap_or(body_bb);
        let next = self.b.build_int_add(i, step, "next")?;
        iv.add_incoming(&[(&next, latch)]);
        for (p, v) in phis.iter().zip(&next_vals) {
            p.add_incoming(&[(v, latch)]);
        }
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(exit);
        Ok(carried)
    }
}

/// JIT-compiled code for one plan. Owns the LLVM context and execution engine that hold the
/// machine code; function addresses taken from it stay valid while it lives.
pub(crate) struct Jit {
    engine: ManuallyDrop<ExecutionEngine<'static>>,
    context: ManuallyDrop<Box<Context>>,
    pub ir: String,
    pub asm: Option<String>,
}

// SAFETY: after `compile` returns, the LLVM objects are only touched again by `Drop`, never
// concurrently; the machine code they own is immutable and called through plain function pointers.
unsafe impl Send for Jit {}
unsafe impl Sync for Jit {}

impl Drop for Jit {
    fn drop(&mut self) {
        // SAFETY: the engine borrows the context, so it goes first; neither is used afterwards.
        unsafe {
            ManuallyDrop::drop(&mut self.engine);
            ManuallyDrop::drop(&mut self.context);
        }
    }
}

/// Emits, optimises and JIT-compiles one function per spec; returns their addresses in order.
pub(crate) fn compile(
    specs: &[(String, Spec)],
    tiling: &Tiling,
    keep_asm: bool,
) -> R<(Jit, Vec<KernelFn>)> {
    let host = host()?;
    let context = Box::new(Context::create());
    // SAFETY: the context is boxed (its address never changes) and outlives every borrower: the
    // module and engine made from it are owned by the returned `Jit`, which drops them first.
    let ctx: &'static Context = unsafe { &*(&*context as *const Context) };
    let cg = Cg::new(ctx, &host, tiling.lanes);
    for (name, spec) in specs {
        cg.emit_kernel(name, spec, tiling)?;
    }
    let llvm_err = |stage: &'static str| {
        move |m: inkwell::support::LLVMString| CpuError::Llvm {
            stage,
            message: m.to_string(),
        }
    };
    cg.module
        .verify()
        .map_err(llvm_err("verifying the generated IR"))?;

    let target = Target::from_name("x86-64")
        .or_else(|| {
            let triple = TargetMachine::get_default_triple();
            Target::from_triple(&triple).ok()
        })
        .ok_or_else(|| CpuError::Llvm {
            stage: "finding the host target",
            message: host.triple.clone(),
        })?;
    let triple = TargetMachine::get_default_triple();
    let tm = target
        .create_target_machine(
            &triple,
            &host.cpu,
            &host.features,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::JITDefault,
        )
        .ok_or_else(|| CpuError::Llvm {
            stage: "creating the target machine",
            message: format!("{} {}", host.triple, host.cpu),
        })?;
    cg.module.set_triple(&triple);
    cg.module
        .set_data_layout(&tm.get_target_data().get_data_layout());
    cg.module
        .run_passes("default<O3>", &tm, PassBuilderOptions::create())
        .map_err(llvm_err("optimising"))?;
    let ir = cg.module.print_to_string().to_string();
    let asm = if keep_asm {
        let buf = tm
            .write_to_memory_buffer(&cg.module, FileType::Assembly)
            .map_err(llvm_err("emitting assembly"))?;
        Some(String::from_utf8_lossy(buf.as_slice()).into_owned())
    } else {
        None
    };
    let engine = cg
        .module
        .create_jit_execution_engine(OptimizationLevel::Aggressive)
        .map_err(llvm_err("creating the JIT"))?;
    let mut fns = Vec::with_capacity(specs.len());
    for (name, _) in specs {
        let addr = engine
            .get_function_address(name)
            .map_err(|e| CpuError::Llvm {
                stage: "looking up a compiled kernel",
                message: format!("{name}: {e}"),
            })?;
        // SAFETY: `name` was declared by `kernel_fn` with exactly the `KernelFn` signature.
        fns.push(unsafe { std::mem::transmute::<usize, KernelFn>(addr) });
    }
    let jit = Jit {
        engine: ManuallyDrop::new(engine),
        context: ManuallyDrop::new(context),
        ir,
        asm,
    };
    Ok((jit, fns))
}
