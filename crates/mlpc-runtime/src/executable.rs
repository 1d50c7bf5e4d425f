//! A plan loaded on a device: modules loaded, weights uploaded, ready to run.

use crate::device::{driver, Device, DeviceError, DeviceTensor, TensorRef};
use crate::guard::{check_guards, GuardError, TensorMeta};
use crate::tensor_map::{MapRequest, TensorMapArg, TensorMapError};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use mlpc_codegen::{CudaKernel, LaunchError, Param};
use mlpc_ir::{Bindings, BufferKind, HostTensor, Plan};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error("kernel `{kernel}`: {source}")]
    Launch {
        kernel: String,
        #[source]
        source: LaunchError,
    },
    #[error("kernel `{kernel}` reads `{buffer}` through a tensor map, but {source}")]
    TensorMap {
        kernel: String,
        buffer: String,
        #[source]
        source: TensorMapError,
    },
    #[error("the plan and its kernels disagree: {0}")]
    Mismatch(String),
    #[error("weight `{0}` has no data")]
    MissingWeight(String),
    #[error("buffer `{name}`: shape {shape} is not bound by the inputs ({bindings})")]
    Unbound {
        name: String,
        shape: String,
        bindings: String,
    },
}

/// A compiled kernel as the runtime needs it: the launch description and the CUBIN image.
#[derive(Clone, Debug)]
pub struct KernelImage {
    pub kernel: CudaKernel,
    pub cubin: Vec<u8>,
}

struct Loaded {
    kernel: CudaKernel,
    function: CudaFunction,
    /// The entries of `kernel.small_m`'s variants, in order.
    small_m: Vec<CudaFunction>,
}

/// What the last run allocated for intermediates, reused while the bindings stay the same.
struct Scratch {
    bindings: Bindings,
    buffers: BTreeMap<usize, CudaSlice<u8>>,
}

/// A plan ready to run on one device.
pub struct Executable {
    device: Device,
    plan: Plan,
    kernels: Vec<Loaded>,
    weights: BTreeMap<usize, DeviceTensor>,
    scratch: Mutex<Option<Scratch>>,
}

/// Options of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Fill outputs and intermediates with NaN (all bits set) before launching, so that an element
    /// a kernel forgets to write can never pass a comparison.
    pub poison: bool,
}

impl Executable {
    /// Loads every kernel image and uploads every weight of `plan`.
    pub fn load(
        device: &Device,
        plan: &Plan,
        images: &[KernelImage],
        weights: &dyn Fn(&str) -> Option<Arc<HostTensor>>,
    ) -> Result<Executable, RuntimeError> {
        if images.len() != plan.kernels.len() {
            return Err(RuntimeError::Mismatch(format!(
                "{} kernels in the plan, {} images",
                plan.kernels.len(),
                images.len()
            )));
        }
        let mut kernels = Vec::with_capacity(images.len());
        for (k, img) in plan.kernels.iter().zip(images) {
            if img.kernel.name != k.name {
                return Err(RuntimeError::Mismatch(format!(
                    "plan kernel `{}` got image `{}`",
                    k.name, img.kernel.name
                )));
            }
            let module = device
                .context()
                .load_module(Ptx::from_binary(img.cubin.clone()))
                .map_err(driver(format!("loading the CUBIN of kernel `{}`", k.name)))?;
            let function = module
                .load_function(&img.kernel.entry)
                .map_err(driver(format!(
                    "finding entry `{}` of kernel `{}`",
                    img.kernel.entry, k.name
                )))?;
            if img.kernel.launch.smem_bytes > 48 * 1024 {
                function
                    .set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        img.kernel.launch.smem_bytes as i32,
                    )
                    .map_err(driver(format!(
                        "raising the shared memory limit of kernel `{}`",
                        k.name
                    )))?;
            }
            // Small-M variants take no dynamic shared memory (mlpc-codegen's ABI notes).
            let small_m = img
                .kernel
                .small_m
                .iter()
                .flat_map(|s| &s.variants)
                .map(|v| {
                    module.load_function(&v.entry).map_err(driver(format!(
                        "finding entry `{}` of kernel `{}`",
                        v.entry, k.name
                    )))
                })
                .collect::<Result<Vec<_>, _>>()?;
            kernels.push(Loaded {
                kernel: img.kernel.clone(),
                function,
                small_m,
            });
        }
        let mut uploaded = BTreeMap::new();
        for (id, b) in plan.buffers.iter().enumerate() {
            if b.kind == BufferKind::Weight {
                let data =
                    weights(&b.name).ok_or_else(|| RuntimeError::MissingWeight(b.name.clone()))?;
                uploaded.insert(id, device.upload(&data)?);
            }
        }
        Ok(Executable {
            device: device.clone(),
            plan: plan.clone(),
            kernels,
            weights: uploaded,
            scratch: Mutex::new(None),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Checks the inputs against the guards; returns the bindings of the symbolic dims.
    pub fn check(&self, inputs: &BTreeMap<String, DeviceTensor>) -> Result<Bindings, GuardError> {
        self.check_refs(&refs(inputs))
    }

    /// [`Executable::check`] for borrowed views.
    pub fn check_refs(
        &self,
        inputs: &BTreeMap<String, TensorRef<'_>>,
    ) -> Result<Bindings, GuardError> {
        let stream = self.device.stream();
        let metas: Vec<(String, TensorMeta)> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.meta(stream)))
            .collect();
        check_guards(
            &self.plan,
            self.device.ordinal(),
            metas.iter().map(|(n, m)| (n.as_str(), m)),
        )
    }

    fn shape_of(&self, id: usize, b: &Bindings) -> Result<Vec<usize>, RuntimeError> {
        let buf = &self.plan.buffers[id];
        buf.ty
            .concrete_shape(b)
            .ok_or_else(|| RuntimeError::Unbound {
                name: buf.name.clone(),
                shape: buf.ty.to_string(),
                bindings: b.to_string(),
            })
    }

    /// Runs the plan on `inputs` (device tensors by input name), enqueued on the device's stream.
    /// Returns the outputs by name; they are ready once the stream is synchronised.
    pub fn run(
        &self,
        inputs: &BTreeMap<String, DeviceTensor>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, DeviceTensor>, RuntimeError> {
        self.run_refs(&refs(inputs), opts)
    }

    /// [`Executable::run`] on borrowed views of device memory.
    pub fn run_refs(
        &self,
        inputs: &BTreeMap<String, TensorRef<'_>>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, DeviceTensor>, RuntimeError> {
        let bindings = self.check_refs(inputs)?;
        let stream = self.device.stream().clone();
        let mut scratch_guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if scratch_guard
            .as_ref()
            .is_none_or(|s| s.bindings != bindings)
        {
            let mut buffers = BTreeMap::new();
            for (id, b) in self.plan.buffers.iter().enumerate() {
                if b.kind == BufferKind::Intermediate {
                    let n = self.shape_of(id, &bindings)?.iter().product::<usize>()
                        * b.ty.dtype.size_bytes();
                    buffers.insert(
                        id,
                        stream
                            .alloc_zeros::<u8>(n.max(1))
                            .map_err(driver("allocating intermediates"))?,
                    );
                }
            }
            *scratch_guard = Some(Scratch {
                bindings: bindings.clone(),
                buffers,
            });
        }
        let scratch = scratch_guard
            .as_ref()
            .ok_or_else(|| RuntimeError::Mismatch("no scratch".into()))?;

        let mut outputs: BTreeMap<usize, DeviceTensor> = BTreeMap::new();
        for (id, b) in self.plan.buffers.iter().enumerate() {
            if b.kind == BufferKind::Output {
                let shape = self.shape_of(id, &bindings)?;
                outputs.insert(id, self.device.uninit(b.ty.dtype, &shape)?);
            }
        }
        // Device addresses of every buffer.
        let mut addr: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
        for (id, b) in self.plan.buffers.iter().enumerate() {
            let (slice, len): (&CudaSlice<u8>, usize) = match b.kind {
                BufferKind::Input => {
                    let t = inputs.get(&b.name).ok_or_else(|| GuardError::Missing {
                        tensor: b.name.clone(),
                        expected: b.ty.to_string(),
                    })?;
                    (t.data, t.data.len())
                }
                BufferKind::Weight => {
                    let t = &self.weights[&id];
                    (&t.data, t.data.len())
                }
                BufferKind::Intermediate => (&scratch.buffers[&id], scratch.buffers[&id].len()),
                BufferKind::Output => (&outputs[&id].data, outputs[&id].data.len()),
            };
            let (ptr, _sync) = slice.device_ptr(&stream);
            addr.insert(id, (ptr, len));
        }
        if opts.poison {
            for (id, b) in self.plan.buffers.iter().enumerate() {
                if matches!(b.kind, BufferKind::Intermediate | BufferKind::Output) {
                    let (ptr, len) = addr[&id];
                    // SAFETY: `ptr` points at `len` bytes allocated on this stream's context above.
                    unsafe {
                        cudarc::driver::result::memset_d8_async(ptr, 0xFF, len, stream.cu_stream())
                    }
                    .map_err(driver("poisoning outputs"))?;
                }
            }
        }

        for (k, loaded) in self.plan.kernels.iter().zip(&self.kernels) {
            // A small-M variant of a GEMM, when one fits the bindings' M.
            let small = loaded
                .kernel
                .small_m_variant(&bindings)
                .map_err(|source| RuntimeError::Launch {
                    kernel: k.name.clone(),
                    source,
                })?
                .zip(loaded.kernel.small_m.as_ref())
                .map(|(i, s)| (&loaded.small_m[i], &s.variants[i].launch));
            let (function, launch) = small.unwrap_or((&loaded.function, &loaded.kernel.launch));
            let grid = launch
                .grid(&bindings, self.device.sm_count())
                .map_err(|source| RuntimeError::Launch {
                    kernel: k.name.clone(),
                    source,
                })?;
            if grid.contains(&0) {
                continue;
            }
            let mut values: Vec<Arg> = Vec::with_capacity(loaded.kernel.params.len());
            let unbound = |symbol: &str| RuntimeError::Launch {
                kernel: k.name.clone(),
                source: LaunchError::Unbound {
                    symbol: symbol.to_string(),
                },
            };
            let address = |buffer: &usize| {
                addr.get(buffer).map(|a| a.0).ok_or_else(|| {
                    RuntimeError::Mismatch(format!("kernel `{}` names buffer {buffer}", k.name))
                })
            };
            for p in &loaded.kernel.params {
                values.push(match p {
                    Param::Buffer { buffer } => Arg::U64(address(buffer)?),
                    Param::Dim { symbol } => {
                        Arg::U64(bindings.get(symbol).ok_or_else(|| unbound(symbol))?)
                    }
                    Param::TensorMap {
                        buffer,
                        rows,
                        cols,
                        row_stride,
                        box_rows,
                        box_cols,
                    } => {
                        let resolve = |e: &mlpc_ir::Extent| {
                            e.syms
                                .iter()
                                .find(|s| bindings.get(s).is_none())
                                .map_or_else(
                                    || Ok(e.resolve(&bindings).unwrap_or(u64::MAX)),
                                    |s| Err(unbound(s)),
                                )
                        };
                        let req = MapRequest {
                            address: address(buffer)?,
                            dtype: self.plan.buffers[*buffer].ty.dtype,
                            rows: resolve(rows)?,
                            cols: resolve(cols)?,
                            row_stride: resolve(row_stride)?,
                            box_rows: *box_rows,
                            box_cols: *box_cols,
                        };
                        Arg::Map(Box::new(req.encode().map_err(|source| {
                            RuntimeError::TensorMap {
                                kernel: k.name.clone(),
                                buffer: self.plan.buffers[*buffer].name.clone(),
                                source,
                            }
                        })?))
                    }
                });
            }
            let cfg = LaunchConfig {
                grid_dim: (grid[0], grid[1], grid[2]),
                block_dim: (launch.block[0], launch.block[1], launch.block[2]),
                shared_mem_bytes: launch.smem_bytes,
            };
            let mut builder = stream.launch_builder(function);
            for v in &values {
                match v {
                    Arg::U64(x) => builder.arg(x),
                    Arg::Map(m) => builder.arg(m.as_ref()),
                };
            }
            // SAFETY: the argument list matches the entry's signature by the kernel ABI
            // (pointers, 64-bit dims and tensor maps by value, in `params` order); every pointer addresses a live buffer
            // of the size the plan gives it, as checked by the guards for inputs.
            unsafe { builder.launch(cfg) }
                .map_err(driver(format!("launching kernel `{}`", k.name)))?;
        }

        let mut result = BTreeMap::new();
        for (name, id) in &self.plan.outputs {
            let b = &self.plan.buffers[*id];
            let t = match b.kind {
                BufferKind::Output | BufferKind::Intermediate => match outputs.remove(id) {
                    Some(t) => t,
                    None => self.copy_of(*id, addr[id], &bindings)?,
                },
                // An output that is an input or weight itself: hand back a copy.
                BufferKind::Input | BufferKind::Weight => self.copy_of(*id, addr[id], &bindings)?,
            };
            result.insert(name.clone(), t);
        }
        Ok(result)
    }

    fn copy_of(
        &self,
        id: usize,
        (ptr, len): (u64, usize),
        b: &Bindings,
    ) -> Result<DeviceTensor, RuntimeError> {
        let shape = self.shape_of(id, b)?;
        let t = self.device.zeros(self.plan.buffers[id].ty.dtype, &shape)?;
        let stream = self.device.stream();
        {
            let (dst, _sync) = t.data.device_ptr(stream);
            let n = len.min(t.data.len());
            // SAFETY: both ranges are live device allocations of at least `n` bytes.
            unsafe { cudarc::driver::result::memcpy_dtod_async(dst, ptr, n, stream.cu_stream()) }
                .map_err(driver("copying an output"))?;
        }
        Ok(t)
    }

    /// Convenience for callers holding host tensors: upload, run, download, synchronise.
    pub fn run_host(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, HostTensor>, RuntimeError> {
        let mut dev = BTreeMap::new();
        for (n, t) in inputs {
            dev.insert(n.clone(), self.device.upload(t)?);
        }
        let out = self.run(&dev, opts)?;
        let mut host = BTreeMap::new();
        for (n, t) in &out {
            host.insert(n.clone(), self.device.download(t)?);
        }
        self.device.synchronize()?;
        Ok(host)
    }
}

/// One kernel argument by value.
enum Arg {
    /// A device pointer or a symbol's value.
    U64(u64),
    /// A tensor map (boxed: 128 bytes, 128-byte aligned).
    Map(Box<TensorMapArg>),
}

fn refs(inputs: &BTreeMap<String, DeviceTensor>) -> BTreeMap<String, TensorRef<'_>> {
    inputs
        .iter()
        .map(|(n, t)| (n.clone(), t.as_ref()))
        .collect()
}

/// Times `iters` runs after `warmup` untimed ones, rotating through `exes` (the same plan with
/// different weights, so that weights do not stay in L2) and `inputs`. Each run is bracketed by
/// CUDA events on the stream; returns the per-run times in milliseconds.
pub fn time_runs(
    exes: &[&Executable],
    inputs: &[BTreeMap<String, DeviceTensor>],
    warmup: usize,
    iters: usize,
) -> Result<Timings, RuntimeError> {
    let (Some(first), false) = (exes.first(), inputs.is_empty()) else {
        return Err(RuntimeError::Mismatch(
            "timing needs at least one executable and one input set".into(),
        ));
    };
    let device = first.device();
    let ctx = device.context();
    let stream = device.stream();
    let mut pairs = Vec::with_capacity(iters);
    let mut host_us = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let exe = exes[i % exes.len()];
        let inp = &inputs[i % inputs.len()];
        if i < warmup {
            drop(exe.run(inp, RunOptions::default())?);
            continue;
        }
        let start = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        let end = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        start.record(stream).map_err(driver("recording an event"))?;
        let host = std::time::Instant::now();
        let out = exe.run(inp, RunOptions::default())?;
        host_us.push(host.elapsed().as_secs_f64() * 1e6);
        end.record(stream).map_err(driver("recording an event"))?;
        pairs.push((start, end, out));
    }
    device.synchronize()?;
    let gpu_ms = pairs
        .iter()
        .map(|(s, e, _)| {
            s.elapsed_ms(e)
                .map(f64::from)
                .map_err(driver("reading an event"))
        })
        .collect::<Result<Vec<f64>, DeviceError>>()?;
    Ok(Timings { gpu_ms, host_us })
}

/// What [`time_runs`] measured, per run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// Between CUDA events recorded before and after each run on the stream, in milliseconds.
    pub gpu_ms: Vec<f64>,
    /// Host time of each `run` call (guards, allocation, launches; no waiting), in microseconds.
    pub host_us: Vec<f64>,
}
