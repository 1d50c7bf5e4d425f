//! Running a compiled model on the CUDA backend (`mlpc-runtime`): the device is opened and the
//! kernels loaded once, on first use.

use crate::compiler::Compiled;
use crate::error::Error;
use crate::Tensors;
use mlpc_runtime::{Device, Executable, KernelImage, RunOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) struct GpuState {
    pub(crate) exe: Arc<Executable>,
    pub(crate) images: Vec<KernelImage>,
    /// The Hopper GEMM tile of each tunable kernel, and where it came from.
    pub(crate) tiles: Vec<crate::tiles::TileNote>,
}

/// The images of every kernel of `c` for `arch` with the Hopper GEMM tiles `tiles`, compiling
/// them now if needed.
pub(crate) fn images(
    c: &Compiled,
    arch: mlpc_codegen::Arch,
    tiles: &mlpc_codegen::TileOverrides,
) -> Result<Vec<KernelImage>, Error> {
    let (kernels, compiled) = c.kernels_for(arch, tiles)?;
    Ok(kernels
        .into_iter()
        .zip(compiled.iter())
        .map(|(kernel, ck)| KernelImage {
            kernel,
            cubin: ck.cubin.clone(),
        })
        .collect())
}

impl GpuState {
    /// The kernels of `c` loaded on `device`, whose stream runs them.
    pub(crate) fn new(c: &Compiled, device: Device) -> Result<GpuState, Error> {
        let arch = c.arch_for_device(device.compute_capability()?)?;
        let (tiles, notes) = c.device_tiles(arch, &device.describe())?;
        let images = images(c, arch, &tiles)?;
        let weights = |name: &str| c.optimized().weight(name).cloned();
        let exe = Arc::new(Executable::load(&device, c.plan(), &images, &weights)?);
        Ok(GpuState {
            exe,
            images,
            tiles: notes,
        })
    }

    pub(crate) fn run(&self, inputs: &Tensors, opts: RunOptions) -> Result<Tensors, Error> {
        Ok(self.exe.run_host(inputs, opts)?)
    }

    /// Loads the same plan again with other weights (for timing with weights out of L2).
    pub(crate) fn with_weights(
        &self,
        c: &Compiled,
        weights: &BTreeMap<String, Arc<mlpc_ir::HostTensor>>,
    ) -> Result<Executable, Error> {
        let lookup = |name: &str| weights.get(name).cloned();
        Ok(Executable::load(
            self.exe.device(),
            c.plan(),
            &self.images,
            &lookup,
        )?)
    }
}
