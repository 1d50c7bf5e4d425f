//! mlpc's CPU backend: runs a kernel [`Plan`] as native code.
//!
//! Each plan kernel is lowered to LLVM IR for the host's SIMD width (a register-blocked GEMM
//! micro-kernel with its fused epilogue, or a vectorised elementwise or transpose loop),
//! optimised and JIT-compiled for the host CPU through inkwell, then run over all cores: Rust
//! splits each kernel's output into tiles and a thread pool calls the generated function on them.
//! Weights are constants, so GEMM B operands that are weights are packed once, at [`compile`]
//! time, into the panel layout the micro-kernel streams.
//!
//! ```no_run
//! # use std::collections::BTreeMap;
//! # fn demo(plan: &mlpc_ir::Plan, graph: &mlpc_ir::Graph,
//! #         inputs: &BTreeMap<String, mlpc_ir::HostTensor>) -> Result<(), mlpc_cpu::CpuError> {
//! let exe = mlpc_cpu::CpuBackend::new()?.compile(plan, graph.weights())?;
//! let outputs = exe.run(inputs)?;
//! # Ok(()) }
//! ```
//!
//! Numerics: values are widened to f32 on load, computed in f32 (products accumulate in f32 with
//! fused multiply-adds), and rounded to nearest even into the output dtype on store.
//!
//! **Architecture invariant:** this crate knows a [`Plan`] and its weights, and nothing of CUDA,
//! JSON or files. LLVM sits behind the default feature `llvm`; without it the crate still builds
//! and [`CpuBackend::new`] returns [`CpuError::NoLlvm`].
//!
//! [`compile`]: CpuBackend::compile

mod error;
#[cfg(feature = "llvm")]
mod exec;
#[cfg(feature = "llvm")]
mod llvm;
#[cfg(feature = "llvm")]
mod pack;
#[cfg(feature = "llvm")]
mod spec;

pub use error::CpuError;
use mlpc_ir::{HostTensor, Plan};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The weights of a plan by buffer name, as [`mlpc_ir::Graph::weights`] holds them.
pub type Weights = BTreeMap<String, Arc<HostTensor>>;

/// Register and cache blocking of the generated GEMMs, derived from the host's SIMD width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// f32 lanes of one vector register (16 with AVX-512, 8 with AVX, 4 otherwise).
    pub lanes: u32,
    /// Output columns per micro-kernel (and per packed B panel): two vectors.
    pub nr: usize,
    /// Output rows per micro-kernel of a plain GEMM.
    pub mr: usize,
    /// Output rows per micro-kernel of a dual GEMM (two accumulator sets).
    pub mr_dual: usize,
    /// Whether GEMMs of bf16 A and bf16 B multiply pairs of bf16 values with the host's
    /// AVX-512 BF16 dot product (`vdpbf16ps`: two exact products added to each f32 lane, twice
    /// the multiply-adds of an f32 FMA an instruction), with no widening: A is read as stored
    /// and B's panels hold pairs of k rows. Set by [`CpuBackend::new`] where the host has
    /// AVX-512 BF16; [`Tiling::for_lanes`] leaves it off.
    pub bf16_dot: bool,
}

impl Tiling {
    /// The tiling for vectors of `lanes` f32: as many accumulators as the register file holds
    /// beside the B vectors and the A broadcast (32 registers with AVX-512, 16 otherwise).
    pub fn for_lanes(lanes: u32) -> Tiling {
        let (mr, mr_dual) = if lanes >= 16 { (12, 6) } else { (6, 3) };
        Tiling {
            lanes,
            nr: 2 * lanes as usize,
            mr,
            mr_dual,
            bf16_dot: false,
        }
    }
}

/// The CPU backend: compiles plans for the machine it runs on.
#[derive(Clone, Debug)]
pub struct CpuBackend {
    tiling: Tiling,
    keep_asm: bool,
    threads: Option<usize>,
}

impl CpuBackend {
    /// Initialises LLVM for the host CPU. Fails with [`CpuError::NoLlvm`] when the crate was built
    /// without its `llvm` feature.
    pub fn new() -> Result<CpuBackend, CpuError> {
        #[cfg(feature = "llvm")]
        {
            let host = llvm::host()?;
            let mut tiling = Tiling::for_lanes(host.lanes());
            tiling.bf16_dot = host.bf16_dot();
            Ok(CpuBackend {
                tiling,
                keep_asm: false,
                threads: None,
            })
        }
        #[cfg(not(feature = "llvm"))]
        {
            Err(CpuError::NoLlvm)
        }
    }

    /// The host CPU as LLVM names it, e.g. `sapphirerapids`.
    pub fn host_cpu(&self) -> String {
        #[cfg(feature = "llvm")]
        {
            llvm::host().map(|h| h.cpu).unwrap_or_default()
        }
        #[cfg(not(feature = "llvm"))]
        {
            String::new()
        }
    }

    pub fn tiling(&self) -> Tiling {
        self.tiling
    }

    /// Uses `tiling` instead of the one derived from the host (the vector width must be one the
    /// host supports).
    pub fn with_tiling(mut self, tiling: Tiling) -> CpuBackend {
        self.tiling = tiling;
        self
    }

    /// Keeps the generated assembly, for [`CpuExecutable::assembly`].
    pub fn keep_assembly(mut self, keep: bool) -> CpuBackend {
        self.keep_asm = keep;
        self
    }

    /// Runs on `n` threads instead of one per core.
    pub fn with_threads(mut self, n: usize) -> CpuBackend {
        self.threads = Some(n.max(1));
        self
    }

    /// Checks `plan`, packs the GEMM weights it reads from `weights` (by buffer name; pass
    /// [`mlpc_ir::Graph::weights`] of the optimised graph the plan was lowered from) and
    /// JIT-compiles every kernel.
    pub fn compile(&self, plan: &Plan, weights: &Weights) -> Result<CpuExecutable, CpuError> {
        #[cfg(feature = "llvm")]
        {
            exec::compile(self, plan, weights).map(|inner| CpuExecutable { inner })
        }
        #[cfg(not(feature = "llvm"))]
        {
            let _ = (plan, weights, self.keep_asm, self.threads);
            Err(CpuError::NoLlvm)
        }
    }
}

/// A plan compiled to native code, ready to run any number of times from any thread.
pub struct CpuExecutable {
    #[cfg(feature = "llvm")]
    inner: exec::Executable,
    #[cfg(not(feature = "llvm"))]
    inner: std::convert::Infallible,
}

impl CpuExecutable {
    /// Checks `inputs` (by name) exactly as [`mlpc_ir::interpret`] does, runs the kernels in plan
    /// order and returns every output by name.
    pub fn run(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
    ) -> Result<BTreeMap<String, HostTensor>, CpuError> {
        #[cfg(feature = "llvm")]
        {
            self.inner.run(inputs, None)
        }
        #[cfg(not(feature = "llvm"))]
        {
            let _ = inputs;
            match self.inner {}
        }
    }

    /// [`run`](Self::run), and the wall time of each kernel in launch order (a kernel's time
    /// includes packing a B operand that is not a weight).
    #[allow(clippy::type_complexity)]
    pub fn run_timed(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
    ) -> Result<
        (
            BTreeMap<String, HostTensor>,
            Vec<(String, std::time::Duration)>,
        ),
        CpuError,
    > {
        #[cfg(feature = "llvm")]
        {
            let mut times = Vec::with_capacity(self.inner.kernels.len());
            let out = self.inner.run(inputs, Some(&mut times))?;
            Ok((out, times))
        }
        #[cfg(not(feature = "llvm"))]
        {
            let _ = inputs;
            match self.inner {}
        }
    }

    /// The optimised LLVM IR of all the plan's kernels (not of the kernels for widened 16-bit
    /// weight panels, which the first launch that takes them compiles).
    pub fn llvm_ir(&self) -> &str {
        #[cfg(feature = "llvm")]
        {
            &self.inner.jit.ir
        }
        #[cfg(not(feature = "llvm"))]
        {
            match self.inner {}
        }
    }

    /// The host assembly, when the backend was asked to [`keep_assembly`](CpuBackend::keep_assembly).
    pub fn assembly(&self) -> Option<&str> {
        #[cfg(feature = "llvm")]
        {
            self.inner.jit.asm.as_deref()
        }
        #[cfg(not(feature = "llvm"))]
        {
            match self.inner {}
        }
    }

    /// Kernel names in launch order.
    pub fn kernel_names(&self) -> Vec<&str> {
        #[cfg(feature = "llvm")]
        {
            self.inner.kernels.iter().map(|k| k.name.as_str()).collect()
        }
        #[cfg(not(feature = "llvm"))]
        {
            match self.inner {}
        }
    }
}

#[cfg(all(test, not(feature = "llvm")))]
mod tests {
    use super::*;

    #[test]
    fn without_llvm_the_backend_says_so() {
        let err = CpuBackend::new().unwrap_err();
        assert_eq!(err, CpuError::NoLlvm);
        assert!(err.to_string().contains("built without LLVM"));
    }
}
