//! Running a compiled model on the CPU backend (`mlpc-cpu`): the plan is JIT-compiled once, on
//! first use, and reused for every later run.

use crate::error::Error;
use crate::Tensors;
use mlpc_ir::{Graph, Plan};

pub(crate) struct CpuState {
    exe: mlpc_cpu::CpuExecutable,
}

impl CpuState {
    /// Compiles `plan`; `bf16_dot` off keeps bf16 GEMMs on the f32 FMA kernels
    /// ([`crate::Compiler::cpu_bf16_dot`]).
    pub(crate) fn new(plan: &Plan, optimized: &Graph, bf16_dot: bool) -> Result<CpuState, Error> {
        let mut backend = mlpc_cpu::CpuBackend::new()?;
        if !bf16_dot {
            let mut tiling = backend.tiling();
            tiling.bf16_dot = false;
            backend = backend.with_tiling(tiling);
        }
        Ok(CpuState {
            exe: backend.compile(plan, optimized.weights())?,
        })
    }

    pub(crate) fn run(&self, inputs: &Tensors) -> Result<Tensors, Error> {
        Ok(self.exe.run(inputs)?)
    }
}
