//! Running a compiled model on the CPU backend (`mlpc-cpu`): the plan is JIT-compiled once, on
//! first use, and reused for every later run.

use crate::error::Error;
use crate::Tensors;
use mlpc_ir::{Graph, Plan};

pub(crate) struct CpuState {
    exe: mlpc_cpu::CpuExecutable,
}

impl CpuState {
    pub(crate) fn new(plan: &Plan, optimized: &Graph) -> Result<CpuState, Error> {
        let backend = mlpc_cpu::CpuBackend::new()?;
        Ok(CpuState {
            exe: backend.compile(plan, optimized.weights())?,
        })
    }

    pub(crate) fn run(&self, inputs: &Tensors) -> Result<Tensors, Error> {
        Ok(self.exe.run(inputs)?)
    }
}
