//! Compiling a plan (specs, weight packing, JIT) and running it: input checking, buffer
//! allocation, and the split of every kernel's output into tiles run on the thread pool.

use crate::llvm::{self, Jit, KernelFn};
use crate::pack::{bsr_layout, pack_b, pack_bsr, pair_rows, widen, Aligned, BsrLayout, Panels};
use crate::spec::{spec_of, Family, GemmSpec, Spec, L2_SHARE};
use crate::{CpuBackend, CpuError, Tiling, Weights};
use mlpc_ir::{bind_inputs, Bindings, BufferKind, Graph, HostTensor, MatLayout, Plan};
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The kernels that widen the 16-bit weight panels of a GEMM whose f32 panels fit L2, for
/// launches whose tasks span many rows, JIT-compiled by the first such launch (a plan run only
/// on few rows never pays for them): one reading f32 panels, and the plan's kernel that also
/// stores the f32 panels it widens ([`Spec::widening`]).
struct Wide {
    name: String,
    spec: Spec,
    widening: Spec,
    funcs: OnceLock<Result<(Jit, WideFns), String>>,
}

/// [`Wide`]'s kernels.
#[derive(Clone, Copy)]
struct WideFns {
    /// Reads f32 panels.
    reads: KernelFn,
    /// Reads the 16-bit panels and stores them widened.
    stores: KernelFn,
}

/// Serialises the compiles of [`Wide`] kernels, which runs on different threads may ask for at
/// once (each has its own LLVM context; the target registry is shared).
static WIDE_COMPILES: Mutex<()> = Mutex::new(());

impl Wide {
    fn funcs(&self, tiling: &Tiling) -> Result<WideFns, CpuError> {
        let compiled = self.funcs.get_or_init(|| {
            let _one = WIDE_COMPILES.lock().unwrap_or_else(|e| e.into_inner());
            let named = [
                (format!("{}_wide", self.name), self.spec.clone()),
                (format!("{}_widening", self.name), self.widening.clone()),
            ];
            match llvm::compile(&named, tiling, false) {
                Ok((jit, fns)) => match fns[..] {
                    [reads, stores] => Ok((jit, WideFns { reads, stores })),
                    _ => Err(format!("{} functions compiled for 2", fns.len())),
                },
                Err(e) => Err(e.to_string()),
            }
        });
        match compiled {
            Ok((_, f)) => Ok(*f),
            Err(message) => Err(CpuError::Llvm {
                stage: "compiling a GEMM's kernels for widened panels",
                message: message.clone(),
            }),
        }
    }
}

/// One compiled kernel.
pub(crate) struct Compiled {
    pub name: String,
    spec: Spec,
    func: KernelFn,
    /// For a GEMM whose 16-bit weight panels are kept in their own dtype though its f32 panels
    /// would fit L2 ([`Spec::narrowed`]): the kernels a launch whose tasks span more rows than
    /// one micro-kernel takes, widening each task's panels once.
    wide: Option<Wide>,
    /// Per operand slot: the B panels packed at compile time, for B operands that are weights.
    packed: Vec<Option<Arc<Panels>>>,
    /// For a sparse GEMM: the segments of its B panels.
    bsr: Option<Arc<BsrLayout>>,
}

pub(crate) struct Executable {
    plan: Plan,
    /// A graph holding only the plan's inputs, so that inputs are checked by the one
    /// [`bind_inputs`] every executor shares.
    inputs: Graph,
    /// Per buffer: the weight data, for weight buffers.
    weights: Vec<Option<Arc<HostTensor>>>,
    pub kernels: Vec<Compiled>,
    tiling: Tiling,
    pool: Option<rayon::ThreadPool>,
    scratch: Scratch,
    /// Declared last: the machine code goes after everything that points into it.
    pub jit: Jit,
}

/// `[A-Za-z0-9_]` only, so a kernel name is a plain symbol.
fn symbol(i: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("mlpc_k{i}_{clean}")
}

pub(crate) fn compile(
    backend: &CpuBackend,
    plan: &Plan,
    weights: &Weights,
) -> Result<Executable, CpuError> {
    plan.check().map_err(|errors| CpuError::InvalidPlan {
        plan: plan.name.clone(),
        errors,
    })?;
    let mut inputs = Graph::new(plan.name.clone());
    let mut wdata = vec![None; plan.buffers.len()];
    for (id, b) in plan.buffers.iter().enumerate() {
        match b.kind {
            BufferKind::Input => {
                inputs.add_input(b.name.clone(), b.ty.clone());
            }
            BufferKind::Weight => {
                let w = weights
                    .get(&b.name)
                    .ok_or_else(|| CpuError::MissingWeight {
                        name: b.name.clone(),
                    })?;
                let declared = b.ty.concrete_shape(&Bindings::new());
                if w.dtype() != b.ty.dtype || declared.as_deref() != Some(w.shape()) {
                    return Err(CpuError::WeightMismatch {
                        name: b.name.clone(),
                        expected: b.ty.to_string(),
                        actual_dtype: w.dtype(),
                        actual_shape: w.shape().to_vec(),
                    });
                }
                wdata[id] = Some(w.clone());
            }
            BufferKind::Intermediate | BufferKind::Output => {}
        }
    }
    let tiling = backend.tiling;
    let mut named = Vec::with_capacity(plan.kernels.len());
    let mut packed_all = Vec::with_capacity(plan.kernels.len());
    let mut wide_specs = BTreeMap::new();
    for (i, k) in plan.kernels.iter().enumerate() {
        let mut spec = spec_of(plan, k, &tiling)?;
        let weight_b = |slot: usize| wdata[spec.args[slot]].is_some();
        if let Some(narrow) = spec.narrowed(weight_b) {
            if narrow.widens_per_task() {
                wide_specs.insert(i, (symbol(i, &k.name), spec));
            }
            spec = narrow;
        }
        let mut packed = vec![None; spec.args.len()];
        let mut bsr = None;
        if let Family::Gemm(g) = &spec.family {
            let layout = g
                .sparse
                .as_ref()
                .map(|p| Arc::new(bsr_layout(p, tiling.nr)));
            for slot in g.b_slots() {
                if let Some(w) = &wdata[spec.args[slot]] {
                    let (dt, to) = (w.dtype(), g.panel_dtype(w.dtype()));
                    let mut panels = match (&g.sparse, &layout) {
                        (Some(p), Some(l)) => pack_bsr(w.bytes(), dt, to, p, l, tiling.nr),
                        _ => {
                            let (kk, n) = b_dims(w.shape(), g.b);
                            pack_b(w.bytes(), dt, to, g.b, kk, n, tiling.nr)
                        }
                    };
                    if g.bf16_dot {
                        pair_rows(&mut panels, tiling.nr);
                    }
                    packed[slot] = Some(Arc::new(panels));
                }
            }
            bsr = layout;
        }
        packed_all.push((packed, bsr));
        named.push((symbol(i, &k.name), spec));
    }
    let (jit, fns) = llvm::compile(&named, &tiling, backend.keep_asm)?;
    let kernels = plan
        .kernels
        .iter()
        .enumerate()
        .zip(named)
        .zip(fns)
        .zip(packed_all)
        .map(|((((i, k), (_, spec)), func), (packed, bsr))| Compiled {
            name: k.name.clone(),
            wide: wide_specs.remove(&i).map(|(name, wide)| Wide {
                name,
                widening: spec.widening(),
                spec: wide,
                funcs: OnceLock::new(),
            }),
            spec,
            func,
            packed,
            bsr,
        })
        .collect();
    let pool = match backend.threads {
        Some(n) => Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| CpuError::Threads {
                    message: e.to_string(),
                })?,
        ),
        None => None,
    };
    Ok(Executable {
        plan: plan.clone(),
        inputs,
        weights: wdata,
        kernels,
        tiling,
        pool,
        scratch: Scratch::default(),
        jit,
    })
}

/// `(K, N)` of a B operand stored with `shape` in `layout`.
fn b_dims(shape: &[usize], layout: MatLayout) -> (usize, usize) {
    let (r, c) = (shape[0], shape[1]);
    match layout {
        MatLayout::N => (r, c),
        MatLayout::T => (c, r),
    }
}

/// Allocations of intermediate buffers kept between runs, so that a steady stream of runs does
/// not pay for fresh pages each time.
#[derive(Default)]
struct Scratch(Mutex<Vec<Vec<u8>>>);

impl Scratch {
    /// A buffer of exactly `len` bytes, recycled when one is at hand (its contents are stale).
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .iter()
            .position(|v| v.len() == len)
            .or_else(|| free.iter().position(|v| v.capacity() >= len));
        match best {
            Some(i) => {
                let mut v = free.swap_remove(i);
                v.resize(len, 0);
                v
            }
            None => vec![0u8; len],
        }
    }

    fn give(&self, v: Vec<u8>) {
        let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < 16 {
            free.push(v);
        }
    }
}

/// Where a buffer's bytes live during one run.
enum Data<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Data<'_> {
    fn ptr(&mut self) -> *const u8 {
        match self {
            Data::Borrowed(b) => b.as_ptr(),
            Data::Owned(v) => v.as_mut_ptr(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Data::Borrowed(b) => b,
            Data::Owned(v) => v,
        }
    }
}

/// The pointers and sizes one kernel call reads.
struct Call {
    func: KernelFn,
    bufs: Vec<*const u8>,
    dims: Vec<i64>,
}

// SAFETY: the pointers stay valid for the whole parallel section (the run owns or borrows every
// buffer until all kernels return) and concurrent calls write disjoint tiles of the output.
unsafe impl Sync for Call {}

impl Call {
    fn tile(&self, r0: usize, r1: usize, c0: usize, c1: usize) {
        self.tile_fn(self.func, &self.bufs, r0, r1, c0, c1)
    }

    /// A tile by `func` over `bufs`, a kernel of the same family over the call's buffers but for
    /// widened B panels ([`Wide`]).
    fn tile_fn(
        &self,
        func: KernelFn,
        bufs: &[*const u8],
        r0: usize,
        r1: usize,
        c0: usize,
        c1: usize,
    ) {
        // SAFETY: the generated function reads `bufs` and `dims` as laid out by `Executable::run`
        // for its family, and touches only elements inside the buffers sized from the same dims
        // (a widened panel base addresses, for panels `c0..c1`, only the thread's f32 copy).
        unsafe {
            (func)(
                bufs.as_ptr(),
                self.dims.as_ptr(),
                r0 as i64,
                r1 as i64,
                c0 as i64,
                c1 as i64,
            )
        }
    }
}

impl Executable {
    pub(crate) fn run(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
        mut times: Option<&mut Vec<(String, Duration)>>,
    ) -> Result<BTreeMap<String, HostTensor>, CpuError> {
        let bindings = bind_inputs(&self.inputs, inputs.keys().map(|k| k.as_str()), |n| {
            inputs.get(n).map(|t| (t.dtype(), t.shape().to_vec()))
        })?;
        let mut shapes = Vec::with_capacity(self.plan.buffers.len());
        let mut data = Vec::with_capacity(self.plan.buffers.len());
        for (id, b) in self.plan.buffers.iter().enumerate() {
            let shape =
                b.ty.concrete_shape(&bindings)
                    .ok_or_else(|| CpuError::Unbound {
                        buffer: b.name.clone(),
                        bindings: bindings.to_string(),
                    })?;
            let bytes = shape
                .iter()
                .try_fold(b.ty.dtype.size_bytes() as u64, |a, &d| {
                    a.checked_mul(d as u64)
                })
                .filter(|&n| n <= isize::MAX as u64 / 2)
                // Asked of the allocator and given back at once (no page is touched): a buffer
                // the machine cannot hold is an error here, not an abort in the allocation below.
                .filter(|&n| Vec::<u8>::new().try_reserve_exact(n as usize).is_ok());
            let Some(bytes) = bytes else {
                return Err(CpuError::TooLarge {
                    buffer: b.name.clone(),
                    elements: shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64)),
                });
            };
            data.push(match b.kind {
                // bind_inputs checked that every input is present with this shape.
                BufferKind::Input => {
                    Data::Borrowed(inputs.get(&b.name).map(|t| t.bytes()).unwrap_or(&[]))
                }
                BufferKind::Weight => {
                    Data::Borrowed(self.weights[id].as_ref().map(|w| w.bytes()).unwrap_or(&[]))
                }
                // Every element is written by the kernel that produces the buffer, so a recycled
                // allocation needs no clearing.
                BufferKind::Intermediate => Data::Owned(self.scratch.take(bytes as usize)),
                BufferKind::Output => Data::Owned(vec![0u8; bytes as usize]),
            });
            shapes.push(shape);
        }
        let mut work = || -> Result<(), CpuError> {
            for k in &self.kernels {
                let start = Instant::now();
                self.launch(k, &shapes, &mut data)?;
                if let Some(t) = times.as_deref_mut() {
                    t.push((k.name.clone(), start.elapsed()));
                }
            }
            Ok(())
        };
        match &self.pool {
            Some(p) => p.install(work)?,
            None => work()?,
        }
        let mut out: BTreeMap<String, HostTensor> = BTreeMap::new();
        let mut taken: BTreeMap<usize, String> = BTreeMap::new();
        for (name, id) in &self.plan.outputs {
            let b = self.plan.buffer(*id);
            let t = match taken.get(id) {
                // A second output naming the same buffer gets a copy of the first.
                Some(first) => out[first].clone(),
                None => {
                    let bytes = match &mut data[*id] {
                        Data::Owned(v) if b.kind == BufferKind::Output => std::mem::take(v),
                        d => d.bytes().to_vec(),
                    };
                    HostTensor::from_bytes(b.ty.dtype, shapes[*id].clone(), bytes).map_err(|e| {
                        CpuError::Unsupported {
                            kernel: b.name.clone(),
                            message: e.to_string(),
                        }
                    })?
                }
            };
            taken.insert(*id, name.clone());
            out.insert(name.clone(), t);
        }
        for (b, d) in self.plan.buffers.iter().zip(data) {
            if let (BufferKind::Intermediate, Data::Owned(v)) = (b.kind, d) {
                self.scratch.give(v);
            }
        }
        Ok(out)
    }

    fn launch(
        &self,
        k: &Compiled,
        shapes: &[Vec<usize>],
        data: &mut [Data<'_>],
    ) -> Result<(), CpuError> {
        let threads = rayon::current_num_threads().max(1);
        let spec = &k.spec;
        let out_shape = &shapes[spec.out];
        let rows_cols = |s: &[usize]| match s.split_last() {
            Some((&c, lead)) => (lead.iter().product::<usize>(), c),
            None => (1, 1),
        };
        match &spec.family {
            Family::Gemm(g) => self.launch_gemm(k, g, shapes, data, threads),
            Family::Elementwise(_) => {
                let (rows, cols) = rows_cols(out_shape);
                let mut bufs: Vec<*const u8> = spec.args.iter().map(|&a| data[a].ptr()).collect();
                bufs.push(data[spec.out].ptr());
                let call = Call {
                    func: k.func,
                    bufs,
                    dims: vec![rows as i64, cols as i64],
                };
                split_rows(&call, rows, cols, threads);
                Ok(())
            }
            Family::Transpose => {
                let (lead, c) = rows_cols(out_shape);
                let r = out_shape.len().checked_sub(2).map_or(1, |i| out_shape[i]);
                let batch = lead.checked_div(r).unwrap_or(0);
                let call = Call {
                    func: k.func,
                    bufs: vec![data[spec.args[0]].ptr(), data[spec.out].ptr()],
                    dims: vec![batch as i64, r as i64, c as i64],
                };
                split_rows(&call, lead, c, threads);
                Ok(())
            }
        }
    }

    fn launch_gemm(
        &self,
        k: &Compiled,
        g: &GemmSpec,
        shapes: &[Vec<usize>],
        data: &mut [Data<'_>],
        threads: usize,
    ) -> Result<(), CpuError> {
        let spec = &k.spec;
        let sa = &shapes[spec.args[0]];
        let (m, kk, sam, sak) = match g.a {
            MatLayout::N => {
                let (&kk, lead) = sa.split_last().unwrap_or((&1, &[]));
                (lead.iter().product::<usize>(), kk, kk, 1)
            }
            MatLayout::T => (sa[1], sa[0], 1, sa[1]),
        };
        let (kb, n) = match &g.sparse {
            Some(p) => (p.inp as usize, p.out as usize),
            None => b_dims(&shapes[spec.args[1]], g.b),
        };
        if kb != kk || shapes[spec.out].iter().product::<usize>() != m * n {
            return Err(CpuError::Unsupported {
                kernel: k.name.clone(),
                message: format!(
                    "operand shapes {:?} do not multiply to the output {:?}",
                    spec.args.iter().map(|&a| &shapes[a]).collect::<Vec<_>>(),
                    shapes[spec.out]
                ),
            });
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let nr = self.tiling.nr;
        let mr = if g.dual {
            self.tiling.mr_dual
        } else {
            self.tiling.mr
        };
        let panels = n.div_ceil(nr);
        let slots = g.b_slots().len();
        // The widening kernels, where there are and the tasks their f32 panels would give span
        // rows enough to pay for widening them (`WIDEN_ROWS`). Then every B operand is a 16-bit
        // weight (`Spec::narrowed`).
        let wide = match &k.wide {
            Some(w) if widens(m, panels, slots * kk * nr * 4, mr, threads) => {
                Some(w.funcs(&self.tiling)?)
            }
            _ => None,
        };
        // B operands that are not weights are packed now.
        let mut fresh: Vec<Option<Panels>> = Vec::new();
        for slot in g.b_slots() {
            fresh.push(match &k.packed[slot] {
                Some(_) => None,
                None => {
                    let b = spec.args[slot];
                    let dt = self.plan.buffer(b).ty.dtype;
                    let to = g.panel_dtype(dt);
                    let mut panels = match (&g.sparse, &k.bsr) {
                        (Some(p), Some(l)) => pack_bsr(data[b].bytes(), dt, to, p, l, nr),
                        _ => pack_b(data[b].bytes(), dt, to, g.b, kk, n, nr),
                    };
                    if g.bf16_dot {
                        pair_rows(&mut panels, nr);
                    }
                    Some(panels)
                }
            });
        }
        // A stored in 16 bits is widened to f32 for the micro-kernel (the spec's A dtype).
        let wide_a = g.widen_a.map(|dt| widen(data[spec.args[0]].bytes(), dt));
        let mut bufs: Vec<*const u8> = Vec::with_capacity(spec.args.len() + 1);
        for (slot, &a) in spec.args.iter().enumerate() {
            let p = if let (0, Some(w)) = (slot, &wide_a) {
                w.as_ptr()
            } else if g.b_slots().contains(&slot) {
                match (&k.packed[slot], &fresh[slot - 1]) {
                    (Some(p), _) => p.as_ptr(),
                    (None, Some(p)) => p.as_ptr(),
                    (None, None) => unreachable!("every B slot is packed above"),
                }
            } else {
                data[a].ptr()
            };
            bufs.push(p);
        }
        bufs.push(data[spec.out].ptr());
        if let Some(l) = &k.bsr {
            bufs.push(l.index.as_ptr().cast());
        }
        let call = Call {
            func: k.func,
            bufs,
            dims: vec![m as i64, n as i64, kk as i64, sam as i64, sak as i64],
        };
        let Some(wide) = wide else {
            let panel_bytes: usize = g
                .b_slots()
                .map(|slot| kk * nr * g.panel_dtype(spec.dtypes[slot]).size_bytes())
                .sum();
            let (mc, pc) = gemm_blocks(m, panels, panel_bytes, mr, threads);
            let (rt, pt) = (m.div_ceil(mc), panels.div_ceil(pc));
            (0..rt * pt).into_par_iter().for_each(|t| {
                let (ri, pi) = (t / pt, t % pt);
                let (r0, p0) = (ri * mc, pi * pc);
                call.tile(r0, (r0 + mc).min(m), p0, (p0 + pc).min(panels));
            });
            return Ok(());
        };
        // Each task's first `mr` rows run the kernel that reads the 16-bit panels and stores
        // them widened into the thread's f32 copy, the rest the kernel that reads the copy.
        // Tasks go by panels first, so that a thread's consecutive tasks (rayon hands each
        // thread runs of them) mostly share their panels, and the later ones read the copy for
        // all their rows.
        let (mc, pc) = gemm_blocks(m, panels, slots * kk * nr * 4, mr, threads);
        let (rt, pt) = (m.div_ceil(mc), panels.div_ceil(pc));
        let launch = LAUNCHES.fetch_add(1, Ordering::Relaxed);
        (0..rt * pt).into_par_iter().for_each(|t| {
            let (pi, ri) = (t / rt, t % rt);
            let (r0, p0) = (ri * mc, pi * pc);
            let (r1, p1) = ((r0 + mc).min(m), (p0 + pc).min(panels));
            let span = match &k.bsr {
                Some(l) => l.elements(p0, p1),
                None => p0 * kk * nr..p1 * kk * nr,
            };
            WIDENED.with(|cell| {
                let mut w = cell.borrow_mut();
                let key = (launch, p0, p1);
                let fresh = w.key != Some(key);
                w.key = None;
                while w.panels.len() < slots {
                    w.panels.push(Aligned::zeroed(0));
                }
                // The kernels address panel elements from the panels' base: the base that puts
                // element `span.start` at the copy's start (never dereferenced outside `span`;
                // the generated code's address arithmetic wraps).
                let mut bases = Vec::with_capacity(slots);
                for copy in &mut w.panels[..slots] {
                    if copy.len() < span.len() {
                        *copy = Aligned::zeroed(span.len());
                    }
                    bases.push(copy.as_ptr().wrapping_sub(span.start * 4));
                }
                let mut r = r0;
                if fresh {
                    r = (r0 + mr).min(r1);
                    let mut bufs = call.bufs.clone();
                    bufs.extend(&bases);
                    call.tile_fn(wide.stores, &bufs, r0, r, p0, p1);
                }
                w.key = Some(key);
                if r < r1 {
                    let mut bufs = call.bufs.clone();
                    for (slot, &base) in g.b_slots().zip(&bases) {
                        bufs[slot] = base;
                    }
                    call.tile_fn(wide.reads, &bufs, r, r1, p0, p1);
                }
            });
        });
        Ok(())
    }
}

/// The fewest rows of A a GEMM task must span for its 16-bit weight panels to be widened to f32
/// by its first rows for the others ([`Wide`]). With fewer, the widening, the stores of the f32
/// copy and the copy's reads cost more than widening every panel vector as it is loaded (a
/// sparse dual GEMM at 16 rows, docs/perf-notes.md "16-bit weight panels widened per task").
const WIDEN_ROWS: usize = 24;

/// Whether a GEMM launch of `m` rows over `panels` panels of `wide_bytes` f32 bytes each (over
/// its B operands) widens its 16-bit weight panels per task: whether the tasks the f32 panels
/// would give span [`WIDEN_ROWS`] rows.
fn widens(m: usize, panels: usize, wide_bytes: usize, mr: usize, threads: usize) -> bool {
    let (mc, _) = gemm_blocks(m, panels, wide_bytes, mr, threads);
    mc.min(m) >= WIDEN_ROWS.max(mr + 1)
}

/// A worker thread's widened panels.
struct Widened {
    /// Whose panels `panels` hold: the launch (of [`LAUNCHES`]) and its panel range.
    key: Option<(u64, usize, usize)>,
    /// Per widened B slot: the f32 copy of the panels.
    panels: Vec<Aligned<f32>>,
}

/// Launches that widen panels, counted: a thread's widened panels are reused only within the
/// launch that widened them.
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static WIDENED: RefCell<Widened> = const {
        RefCell::new(Widened {
            key: None,
            panels: Vec::new(),
        })
    };
}

/// Rows and panels per GEMM task: the B panels of a task fit in half of L2 so that they stay
/// there while the task walks its rows, and there are enough tasks to keep every thread busy.
fn gemm_blocks(
    m: usize,
    panels: usize,
    panel_bytes: usize,
    mr: usize,
    threads: usize,
) -> (usize, usize) {
    // Callers refuse empty extents first; at least one row and panel keeps this total anyway.
    let (m, panels) = (m.max(1), panels.max(1));
    let mut pc = (L2_SHARE / panel_bytes.max(1)).clamp(1, panels);
    let mut mc = (mr * 16).min(m.div_ceil(mr) * mr);
    let tasks = |mc: usize, pc: usize| m.div_ceil(mc) * panels.div_ceil(pc);
    while tasks(mc, pc) < 4 * threads {
        if pc > 1 {
            pc = pc.div_ceil(2);
        } else if mc > mr {
            mc = (mc / 2).div_ceil(mr) * mr;
        } else {
            break;
        }
    }
    (mc, pc)
}

/// Splits `rows` rows of `cols` elements into tasks of at least 16 Ki elements.
fn split_rows(call: &Call, rows: usize, cols: usize, threads: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    let min_rows = (16 * 1024 / cols).max(1);
    let chunk = rows.div_ceil(4 * threads).max(min_rows);
    let tasks = rows.div_ceil(chunk);
    (0..tasks).into_par_iter().for_each(|t| {
        let r0 = t * chunk;
        call.tile(r0, (r0 + chunk).min(rows), 0, 0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_of_many_rows_widen_their_panels() {
        // gpt2 fc1 (K = 768, 96 panels of 32 f32 columns): a decode step reads the 16-bit
        // panels as they are, a prompt of `WIDEN_ROWS` rows widens them per task; more threads
        // give tasks of fewer rows.
        let bytes = 768 * 32 * 4;
        assert!(!widens(1, 96, bytes, 12, 2));
        assert!(!widens(WIDEN_ROWS - 1, 96, bytes, 12, 2));
        assert!(widens(WIDEN_ROWS, 96, bytes, 12, 2));
        assert!(widens(512, 96, bytes, 12, 2));
        assert!(!widens(64, 2, bytes, 12, 64));
    }

    #[test]
    fn gemm_blocks_give_every_thread_work() {
        // gpt2 fc1 at T = 512: 96 panels of K = 768.
        let (mc, pc) = gemm_blocks(512, 96, 768 * 32 * 4, 12, 2);
        assert_eq!(mc % 12, 0);
        assert!(512usize.div_ceil(mc) * 96usize.div_ceil(pc) >= 8);
        assert!(pc * 768 * 32 * 4 <= 512 * 1024);
        // One row, few panels: split down to single panels.
        assert_eq!(gemm_blocks(1, 3, 1 << 20, 12, 2), (12, 1));
    }
}
