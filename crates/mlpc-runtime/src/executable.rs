//! A plan loaded on a device: modules loaded, weights uploaded, ready to run.
//!
//! One run: the guards check the inputs and bind the symbolic dims; what depends on those
//! bindings alone (intermediates, the entry and grid of every kernel, the graph) is made once per
//! bindings and kept in a `Scratch` until they change; outputs are allocated; the arguments of
//! every kernel are filled in (`launch::kernel_args`); poisoning memsets, when asked,
//! go on the stream; then the kernels are launched one by one or, from the second run of the
//! same bindings on, as one CUDA graph ([`crate::graph`]).

use crate::device::{driver, Device, DeviceError, DeviceTensor, TensorRef};
use crate::graph::{keyed, GraphStats, KernelGraph, Replay, Step};
use crate::guard::{check_guards, GuardError, TensorMeta};
use crate::launch::{kernel_args, launch_failed, ArgError, Entry, NodeLaunch};
use crate::tensor_map::TensorMapError;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr};
use cudarc::nvrtc::Ptx;
use mlpc_codegen::{CudaKernel, EntryBase, Grid, Launch, LaunchError, Param, Relayout};
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
    /// The entries of `kernel.short_grids`, in order.
    short: Vec<CudaFunction>,
    /// The other entries of a persistent GEMM (`Grid::Persistent::split_k` and `one_tile` of its
    /// launch and of its short-grid entries'), by name, each with the short grid whose launch
    /// it belongs to (`None`: the kernel's own).
    alternates: Vec<(String, CudaFunction, Option<usize>)>,
    /// For a persistent grid of clusters: the CTAs of the clusters the device holds at once
    /// (`cuOccupancyMaxActiveClusters` x cluster size), which sizes the grid instead of the SM
    /// count (a GPC with an odd number of free SMs leaves one out).
    resident_ctas: Option<u32>,
}

impl Loaded {
    fn function(&self, entry: Entry) -> Option<&CudaFunction> {
        match entry {
            Entry::Tiled => Some(&self.function),
            Entry::SmallM(i) => self.small_m.get(i),
            Entry::Short(i) => self.short.get(i),
            Entry::Alternate(i) => self.alternates.get(i).map(|(_, f, _)| f),
        }
    }

    fn entry_name(&self, entry: Entry) -> &str {
        match entry {
            Entry::Tiled => &self.kernel.entry,
            Entry::SmallM(i) => self
                .kernel
                .small_m
                .as_ref()
                .and_then(|s| s.variants.get(i))
                .map_or("", |v| &v.entry),
            Entry::Short(i) => self.kernel.short_grids.get(i).map_or("", |s| &s.entry),
            Entry::Alternate(i) => self.alternates.get(i).map_or("", |(name, _, _)| name),
        }
    }
}

/// What runs under one bindings need beyond their inputs and outputs, made by the first of them
/// and reused while the bindings stay the same.
struct Scratch {
    bindings: Bindings,
    /// Intermediates by buffer id; `None` for the other kinds.
    buffers: Vec<Option<CudaSlice<u8>>>,
    /// The output buffers (kind `Output`) and their shapes.
    outputs: Vec<(usize, Vec<usize>)>,
    /// The device address and size in bytes of every buffer, by buffer id: weights and
    /// intermediates set once, inputs and outputs by every run.
    addresses: Vec<u64>,
    lengths: Vec<usize>,
    /// The kernels launched under these bindings, in plan order (those with an empty grid are
    /// left out); their arguments are refilled by every run.
    launches: Vec<NodeLaunch>,
    /// The workspace the launches share (`Param::Workspace`), allocated zeroed; `None` when no
    /// launch needs one (address 0).
    workspace: Option<CudaSlice<u8>>,
    replay: Replay<KernelGraph>,
}

struct State {
    scratch: Option<Scratch>,
    stats: GraphStats,
}

/// A plan ready to run on one device.
pub struct Executable {
    // Declared first so that it is dropped first: the graphs it holds launch functions of the
    // modules that `kernels` keeps loaded.
    state: Mutex<State>,
    device: Device,
    plan: Plan,
    kernels: Vec<Loaded>,
    /// Weights by buffer id (`None` for the other kinds and for weights only read rearranged),
    /// then the rearranged copies kernels read (`CudaKernel::relayouts`), whose ids follow the
    /// plan's buffers: `relay_weights`.
    weights: Vec<Option<DeviceTensor>>,
    /// Element type of every buffer by id, the rearranged copies included (tensor-map arguments).
    dtypes: Vec<mlpc_ir::DType>,
    /// The plan buffer each rearranged copy was made from, by copy (for messages).
    relaid_from: Vec<usize>,
}

/// Options of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Fill outputs and intermediates with NaN (all bits set) before launching, so that an element
    /// a kernel forgets to write can never pass a comparison. The fills go on the stream before
    /// the kernels (before the graph launch, never into the graph).
    pub poison: bool,
    /// Replay the plan as one CUDA graph when its bindings repeat (see [`crate::graph`]).
    pub graphs: bool,
    /// Let the entries that allow it (`Launch::early_launch`: the weight-streaming kernels) start
    /// while the kernel before them in the run still finishes (programmatic dependent launch);
    /// off, every kernel starts after the one before has finished.
    pub early_launch: bool,
}

impl Default for RunOptions {
    /// No poisoning; graphs and early launches on unless the environment turns them off
    /// ([`graphs_by_default`], [`early_launch_by_default`]).
    fn default() -> RunOptions {
        RunOptions {
            poison: false,
            graphs: graphs_by_default(),
            early_launch: early_launch_by_default(),
        }
    }
}

/// Whether runs replay CUDA graphs unless told otherwise: yes, unless the switch `MLPC_NO_GRAPHS`
/// is on (`1`, `true`, `on`, `yes`: [`crate::switch`]; read at each call, so a change of the
/// variable applies to the options made after it). Explicit [`RunOptions`] are obeyed whatever
/// the variable says.
pub fn graphs_by_default() -> bool {
    !turned_off("MLPC_NO_GRAPHS")
}

/// Whether runs let kernels start early unless told otherwise: yes, unless the switch
/// `MLPC_NO_EARLY_LAUNCH` is on ([`crate::switch`]; read at each call, as for
/// [`graphs_by_default`]).
pub fn early_launch_by_default() -> bool {
    !turned_off("MLPC_NO_EARLY_LAUNCH")
}

/// Whether the `MLPC_NO_...` switch `name` turns its feature off ([`crate::switch`]'s values; a
/// value it refuses leaves the default here, and `mlpc::check_environment`, which the CLI and
/// every compile call first, reports it).
fn turned_off(name: &str) -> bool {
    crate::switch_setting(name).unwrap_or(false)
}

/// How one kernel runs under given bindings (see [`Executable::launches_for`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedLaunch {
    /// The plan kernel's name.
    pub kernel: String,
    /// The entry point launched.
    pub entry: String,
    /// Whether the entry is one of the kernel's small-M variants.
    pub small_m: bool,
    pub grid: [u32; 3],
}

/// `relaid_from[i]`: the plan buffer rearranged copy `plan.buffers.len() + i` was made from.
fn mismatch_arg(plan: &Plan, relaid_from: &[usize], kernel: &str, e: ArgError) -> RuntimeError {
    let name = |b: usize| match plan.buffers.get(b) {
        Some(x) => x.name.clone(),
        None => match relaid_from.get(b - plan.buffers.len()) {
            Some(&from) => format!("{} (rearranged for the kernel)", plan.buffers[from].name),
            None => format!("buffer {b}"),
        },
    };
    match e {
        ArgError::TensorMap(b, source) => RuntimeError::TensorMap {
            kernel: kernel.to_string(),
            buffer: name(b),
            source,
        },
        ArgError::NoBuffer(b) => {
            RuntimeError::Mismatch(format!("kernel `{kernel}` names buffer {b}"))
        }
        ArgError::Walk(bytes) => RuntimeError::Mismatch(format!(
            "kernel `{kernel}` takes a work-item table of {} bytes, but its launch has {bytes}",
            mlpc_codegen::WALK_ARG_BYTES
        )),
        ArgError::Launch(source) => RuntimeError::Launch {
            kernel: kernel.to_string(),
            source,
        },
    }
}

/// Gives each distinct rearranged copy the kernels ask for (`CudaKernel::relayouts`, in kernel
/// order) the buffer id `buffers + i` and points the arguments of the kernels that asked for it
/// at that id. Returns, per copy, the rearrangement and the first kernel asking for it.
fn assign_relayouts<'a>(
    buffers: usize,
    kernels: impl IntoIterator<Item = &'a mut CudaKernel>,
) -> Vec<(Relayout, String)> {
    let mut copies: Vec<(Relayout, String)> = Vec::new();
    for k in kernels {
        for r in k.relayouts.clone() {
            let id = buffers
                + match copies.iter().position(|(c, _)| *c == r) {
                    Some(i) => i,
                    None => {
                        copies.push((r.clone(), k.name.clone()));
                        copies.len() - 1
                    }
                };
            for p in &mut k.params {
                match p {
                    Param::Buffer { buffer } | Param::TensorMap { buffer, .. }
                        if *buffer == r.buffer =>
                    {
                        *buffer = id
                    }
                    _ => {}
                }
            }
        }
    }
    copies
}

/// Whether any argument of `kernels` names buffer `id`.
fn named<'a>(mut kernels: impl Iterator<Item = &'a CudaKernel>, id: usize) -> bool {
    kernels.any(|k| {
        k.params.iter().any(|p| match p {
            Param::Buffer { buffer } | Param::TensorMap { buffer, .. } => *buffer == id,
            Param::Dim { .. } | Param::Workspace | Param::Walk => false,
        })
    })
}

/// Makes and uploads the rearranged weight copies of `assign_relayouts`, in its order.
fn relay_weights(
    device: &Device,
    plan: &Plan,
    copies: &[(Relayout, String)],
    weights: &dyn Fn(&str) -> Option<Arc<HostTensor>>,
) -> Result<Vec<DeviceTensor>, RuntimeError> {
    copies
        .iter()
        .map(|(r, kernel)| {
            let b = plan
                .buffers
                .get(r.buffer)
                .filter(|b| b.kind == BufferKind::Weight)
                .ok_or_else(|| {
                    RuntimeError::Mismatch(format!(
                        "kernel `{kernel}` rearranges buffer {}, which is not a weight of the plan",
                        r.buffer
                    ))
                })?;
            let data =
                weights(&b.name).ok_or_else(|| RuntimeError::MissingWeight(b.name.clone()))?;
            let bytes = r.apply(data.bytes()).ok_or_else(|| {
                RuntimeError::Mismatch(format!(
                    "kernel `{kernel}` reads weight `{}` ({} bytes) rearranged in periods of {} \
                     bytes: not a whole number of periods, or not a permutation",
                    b.name,
                    data.bytes().len(),
                    r.period_bytes()
                ))
            })?;
            let host = HostTensor::from_bytes(data.dtype(), data.shape().to_vec(), bytes)
                .map_err(|e| RuntimeError::Mismatch(format!("{e}")))?;
            Ok(device.upload(&host)?)
        })
        .collect()
}

impl Executable {
    /// Loads every kernel image and uploads every weight of `plan` (or the rearranged copies its
    /// kernels read instead).
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
            if let Some(b) = img.kernel.params.iter().find_map(|p| match p {
                Param::Buffer { buffer } if *buffer >= plan.buffers.len() => Some(*buffer),
                _ => None,
            }) {
                return Err(RuntimeError::Mismatch(format!(
                    "kernel `{}` names buffer {b}; the plan has {}",
                    k.name,
                    plan.buffers.len()
                )));
            }
            let module = device
                .context()
                .load_module(Ptx::from_binary(img.cubin.clone()))
                .map_err(driver(format!("loading the CUBIN of kernel `{}`", k.name)))?;
            // An entry of the module, allowed the dynamic shared memory its launch asks for
            // (above 48 KiB only after raising the function's limit: the ABI notes).
            let entry = |name: &str, launch: &Launch| {
                let f = module.load_function(name).map_err(driver(format!(
                    "finding entry `{name}` of kernel `{}`",
                    k.name
                )))?;
                if launch.smem_bytes > 48 * 1024 {
                    f.set_attribute(
                        CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        launch.smem_bytes as i32,
                    )
                    .map_err(driver(format!(
                        "raising the shared memory limit of entry `{name}` of kernel `{}`",
                        k.name
                    )))?;
                }
                Ok::<_, DeviceError>(f)
            };
            let function = entry(&img.kernel.entry, &img.kernel.launch)?;
            let resident_ctas = match img.kernel.launch.grid {
                Grid::Persistent { cluster, .. } if cluster > 1 => {
                    let launch = &img.kernel.launch;
                    let config = cudarc::driver::LaunchConfig {
                        grid_dim: (cluster, 1, 1),
                        block_dim: (launch.block[0], launch.block[1], launch.block[2]),
                        shared_mem_bytes: launch.smem_bytes,
                    };
                    let clusters = function
                        .occupancy_max_active_clusters(config, device.stream())
                        .map_err(driver(format!(
                            "asking how many clusters of kernel `{}` fit on the device",
                            k.name
                        )))?;
                    if clusters == 0 {
                        return Err(RuntimeError::Mismatch(format!(
                            "kernel `{}`: not one cluster of {cluster} of its CTAs ({} threads, \
                             {} bytes of shared memory each) fits on this device",
                            k.name, launch.block[0], launch.smem_bytes
                        )));
                    }
                    Some(clusters * cluster)
                }
                _ => None,
            };
            // The alternates of the kernel's launch, then those of its short-grid entries'.
            let short_launches = img.kernel.short_grids.iter().enumerate();
            let mut alternates = Vec::new();
            for (launch, short) in std::iter::once((&img.kernel.launch, None))
                .chain(short_launches.map(|(i, s)| (&s.launch, Some(i))))
            {
                for name in launch.alternate_entries() {
                    alternates.push((name.to_string(), entry(name, launch)?, short));
                }
            }
            let short = img
                .kernel
                .short_grids
                .iter()
                .map(|s| entry(&s.entry, &s.launch))
                .collect::<Result<Vec<_>, _>>()?;
            let small_m = img
                .kernel
                .small_m
                .iter()
                .flat_map(|s| &s.variants)
                .map(|v| entry(&v.entry, &v.launch))
                .collect::<Result<Vec<_>, _>>()?;
            kernels.push(Loaded {
                kernel: img.kernel.clone(),
                function,
                small_m,
                short,
                alternates,
                resident_ctas,
            });
        }
        // Weights some kernels read rearranged: their copies get ids after the plan's buffers.
        let copies = assign_relayouts(
            plan.buffers.len(),
            kernels.iter_mut().map(|k| &mut k.kernel),
        );
        let relaid = relay_weights(device, plan, &copies, weights)?;
        // A weight every kernel reads rearranged is not uploaded as the plan has it.
        let mut uploaded = Vec::with_capacity(plan.buffers.len() + relaid.len());
        for (id, b) in plan.buffers.iter().enumerate() {
            let read = named(kernels.iter().map(|k| &k.kernel), id);
            uploaded.push(if b.kind == BufferKind::Weight && read {
                let data =
                    weights(&b.name).ok_or_else(|| RuntimeError::MissingWeight(b.name.clone()))?;
                Some(device.upload(&data)?)
            } else {
                None
            });
        }
        let mut dtypes: Vec<mlpc_ir::DType> = plan.buffers.iter().map(|b| b.ty.dtype).collect();
        for t in relaid {
            dtypes.push(t.dtype);
            uploaded.push(Some(t));
        }
        Ok(Executable {
            state: Mutex::new(State {
                scratch: None,
                stats: GraphStats::default(),
            }),
            device: device.clone(),
            plan: plan.clone(),
            kernels,
            weights: uploaded,
            dtypes,
            relaid_from: copies.iter().map(|(r, _)| r.buffer).collect(),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How often runs launched kernel by kernel, launched a graph, built one, updated nodes.
    pub fn graph_stats(&self) -> GraphStats {
        self.lock().stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while the lock was held left no half-made state behind that a run relies on:
        // the scratch is replaced whole, and stale graph nodes are found by comparison.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the inputs against the guards; returns the bindings of the symbolic dims.
    pub fn check(&self, inputs: &BTreeMap<String, DeviceTensor>) -> Result<Bindings, GuardError> {
        self.check_with(inputs, DeviceTensor::meta)
    }

    /// [`Executable::check`] for borrowed views.
    pub fn check_refs(
        &self,
        inputs: &BTreeMap<String, TensorRef<'_>>,
    ) -> Result<Bindings, GuardError> {
        self.check_with(inputs, TensorRef::meta)
    }

    /// [`Executable::check`] for host tensors, as [`Executable::run_host`] would upload them:
    /// a tensor the guards refuse for its name, dtype or shape is refused before any copy.
    pub fn check_host(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
    ) -> Result<Bindings, GuardError> {
        let ordinal = self.device.ordinal();
        let metas: Vec<(&str, TensorMeta)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), TensorMeta::of_upload(t, ordinal)))
            .collect();
        self.check_metas(&metas)
    }

    fn check_with<T>(
        &self,
        inputs: &BTreeMap<String, T>,
        meta: impl Fn(&T, &cudarc::driver::CudaStream) -> TensorMeta,
    ) -> Result<Bindings, GuardError> {
        let stream = self.device.stream();
        let metas: Vec<(&str, TensorMeta)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), meta(t, stream)))
            .collect();
        self.check_metas(&metas)
    }

    fn check_metas(&self, metas: &[(&str, TensorMeta)]) -> Result<Bindings, GuardError> {
        check_guards(
            &self.plan,
            self.device.ordinal(),
            metas.iter().map(|(n, m)| (*n, m)),
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

    /// The kernels launched under `bindings`, in plan order, each with the entry and grid chosen
    /// for them; kernels with an empty grid are left out. Arguments are left empty. Also the
    /// workspace bytes the launches need (the most any of them needs: they run one after the
    /// other).
    fn resolve_launches(
        &self,
        bindings: &Bindings,
    ) -> Result<(Vec<NodeLaunch>, u64), RuntimeError> {
        let mut launches = Vec::with_capacity(self.kernels.len());
        let mut workspace = 0u64;
        for (i, (k, loaded)) in self.plan.kernels.iter().zip(&self.kernels).enumerate() {
            let at = |source| RuntimeError::Launch {
                kernel: k.name.clone(),
                source,
            };
            // The choice is the kernel's own rule (`CudaKernel::choose_entry`); here it only
            // becomes a loaded function.
            let chosen = loaded
                .kernel
                .choose_entry(bindings, self.device.sm_count(), loaded.resident_ctas)
                .map_err(at)?;
            let entry = match chosen.from {
                EntryBase::SmallM(i) => Entry::SmallM(i),
                from => {
                    let short = match from {
                        EntryBase::Short(i) => Some(i),
                        _ => None,
                    };
                    match loaded
                        .alternates
                        .iter()
                        .position(|(n, _, s)| n == chosen.entry && *s == short)
                    {
                        Some(i) => Entry::Alternate(i),
                        None => short.map_or(Entry::Tiled, Entry::Short),
                    }
                }
            };
            if loaded.function(entry).is_none() || loaded.entry_name(entry) != chosen.entry {
                return Err(RuntimeError::Mismatch(format!(
                    "kernel `{}` has no loaded entry `{}`",
                    k.name, chosen.entry
                )));
            }
            let (launch, grid) = (chosen.launch, chosen.grid);
            if grid.contains(&0) {
                continue;
            }
            workspace = workspace.max(chosen.workspace_bytes);
            // The work-item table of a kernel that takes one, for the chosen launch and grid.
            let walk: Arc<[u8]> = match loaded.kernel.params.contains(&Param::Walk) {
                true => launch.walk_arg(bindings, grid[0]).into(),
                false => Arc::from(Vec::new()),
            };
            launches.push(NodeLaunch {
                kernel: i,
                entry,
                grid,
                block: launch.block,
                smem_bytes: launch.smem_bytes,
                early_launch: launch.early_launch,
                walk,
                args: Vec::with_capacity(loaded.kernel.params.len()),
            });
        }
        Ok((launches, workspace))
    }

    /// Which entry each kernel launches under `bindings`, and on what grid (kernels with an
    /// empty grid are left out, as a run leaves them out).
    pub fn launches_for(&self, bindings: &Bindings) -> Result<Vec<PlannedLaunch>, RuntimeError> {
        Ok(self
            .resolve_launches(bindings)?
            .0
            .into_iter()
            .map(|l| {
                let loaded = &self.kernels[l.kernel];
                PlannedLaunch {
                    kernel: self.plan.kernels[l.kernel].name.clone(),
                    entry: loaded.entry_name(l.entry).to_string(),
                    small_m: matches!(l.entry, Entry::SmallM(_)),
                    grid: l.grid,
                }
            })
            .collect())
    }

    /// Allocates the intermediates for `bindings` and resolves their launches.
    fn scratch_for(&self, bindings: &Bindings) -> Result<Scratch, RuntimeError> {
        let stream = self.device.stream();
        let n = self.plan.buffers.len();
        let (launches, workspace_bytes) = self.resolve_launches(bindings)?;
        let workspace = match workspace_bytes {
            0 => None,
            bytes => Some(
                stream
                    .alloc_zeros::<u8>(bytes as usize)
                    .map_err(driver(format!("allocating {bytes} bytes of workspace")))?,
            ),
        };
        let mut s = Scratch {
            bindings: bindings.clone(),
            buffers: Vec::with_capacity(n),
            outputs: Vec::new(),
            addresses: vec![0; self.weights.len()],
            lengths: vec![0; self.weights.len()],
            launches,
            workspace,
            replay: Replay::default(),
        };
        for (id, b) in self.plan.buffers.iter().enumerate() {
            let mut intermediate = None;
            match b.kind {
                BufferKind::Intermediate => {
                    let bytes = self.shape_of(id, bindings)?.iter().product::<usize>()
                        * b.ty.dtype.size_bytes();
                    let slice = stream
                        .alloc_zeros::<u8>(bytes.max(1))
                        .map_err(driver("allocating intermediates"))?;
                    s.addresses[id] = slice.device_ptr(stream).0;
                    s.lengths[id] = slice.len();
                    intermediate = Some(slice);
                }
                // A weight no kernel argument names (every kernel reads a rearranged copy)
                // keeps address 0.
                BufferKind::Weight => {
                    if let Some(w) = &self.weights[id] {
                        s.addresses[id] = w.data.device_ptr(stream).0;
                        s.lengths[id] = w.data.len();
                    }
                }
                BufferKind::Output => s.outputs.push((id, self.shape_of(id, bindings)?)),
                BufferKind::Input => {}
            }
            s.buffers.push(intermediate);
        }
        // The rearranged weight copies, after the plan's buffers.
        for (id, w) in self.weights.iter().enumerate().skip(n) {
            if let Some(w) = w {
                s.addresses[id] = w.data.device_ptr(stream).0;
                s.lengths[id] = w.data.len();
            }
        }
        Ok(s)
    }

    /// Runs the plan on `inputs` (device tensors by input name), enqueued on the device's stream.
    /// Returns the outputs by name; they are ready once the stream is synchronised.
    pub fn run(
        &self,
        inputs: &BTreeMap<String, DeviceTensor>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, DeviceTensor>, RuntimeError> {
        let bindings = self.check(inputs)?;
        self.execute(&bindings, opts, |name| inputs.get(name).map(|t| &t.data))
    }

    /// [`Executable::run`] on borrowed views of device memory.
    pub fn run_refs(
        &self,
        inputs: &BTreeMap<String, TensorRef<'_>>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, DeviceTensor>, RuntimeError> {
        let bindings = self.check_refs(inputs)?;
        self.execute(&bindings, opts, |name| inputs.get(name).map(|t| t.data))
    }

    /// Runs the plan on inputs that passed the guards with `bindings`; `input` gives the memory
    /// of each input by name.
    fn execute<'a>(
        &self,
        bindings: &Bindings,
        opts: RunOptions,
        input: impl Fn(&str) -> Option<&'a CudaSlice<u8>>,
    ) -> Result<BTreeMap<String, DeviceTensor>, RuntimeError> {
        let stream = self.device.stream();
        let mut state = self.lock();
        let State { scratch, stats } = &mut *state;
        let s = keyed(
            scratch,
            |s| s.bindings == *bindings,
            || self.scratch_for(bindings),
        )?;

        let mut outputs: Vec<(usize, DeviceTensor)> = Vec::with_capacity(s.outputs.len());
        for (id, shape) in &s.outputs {
            let t = self.device.uninit(self.plan.buffers[*id].ty.dtype, shape)?;
            s.addresses[*id] = t.data.device_ptr(stream).0;
            s.lengths[*id] = t.data.len();
            outputs.push((*id, t));
        }
        for (id, b) in self.plan.buffers.iter().enumerate() {
            if b.kind == BufferKind::Input {
                let t = input(&b.name).ok_or_else(|| GuardError::Missing {
                    tensor: b.name.clone(),
                    expected: b.ty.to_string(),
                })?;
                s.addresses[id] = t.device_ptr(stream).0;
                s.lengths[id] = t.len();
            }
        }
        if opts.poison {
            for (id, b) in self.plan.buffers.iter().enumerate() {
                if matches!(b.kind, BufferKind::Intermediate | BufferKind::Output) {
                    // SAFETY: the address points at `lengths[id]` bytes allocated above on this
                    // stream's context.
                    unsafe {
                        cudarc::driver::result::memset_d8_async(
                            s.addresses[id],
                            0xFF,
                            s.lengths[id],
                            stream.cu_stream(),
                        )
                    }
                    .map_err(driver("poisoning outputs"))?;
                }
            }
        }
        let workspace = s.workspace.as_ref().map_or(0, |w| w.device_ptr(stream).0);
        for l in &mut s.launches {
            kernel_args(
                &self.kernels[l.kernel].kernel.params,
                &s.addresses,
                workspace,
                &l.walk,
                &self.dtypes,
                bindings,
                &mut l.args,
            )
            .map_err(|e| {
                let kernel = &self.plan.kernels[l.kernel].name;
                mismatch_arg(&self.plan, &self.relaid_from, kernel, e)
            })?;
        }

        self.device
            .context()
            .bind_to_thread()
            .map_err(driver("making the device's context current"))?;
        let function = |l: &NodeLaunch| {
            self.kernels[l.kernel]
                .function(l.entry)
                .map_or(std::ptr::null_mut(), CudaFunction::cu_function)
        };
        let cu_stream = stream.cu_stream();
        match s.replay.step(opts.graphs, s.launches.len()) {
            Step::Direct => {
                for (i, l) in s.launches.iter().enumerate() {
                    // SAFETY: the arguments match the entry's signature by the kernel ABI
                    // (pointers and 64-bit dims, in `params` order); every pointer addresses a
                    // live buffer of the size the plan gives it, as checked by the guards for
                    // inputs; `resolve_launches` checked that the entry exists.
                    unsafe { l.launch(function(l), cu_stream, i > 0 && opts.early_launch) }
                        .map_err(|e| launch_failed(&self.plan.kernels[l.kernel].name, e))?;
                }
                stats.direct_runs += 1;
            }
            Step::Build | Step::Replay => {
                // SAFETY: as for the direct launches; the context was made current above.
                unsafe {
                    s.replay
                        .launch(&s.launches, function, cu_stream, opts.early_launch, stats)
                }?;
            }
        }
        s.replay.ran();

        let mut result = BTreeMap::new();
        for (name, id) in &self.plan.outputs {
            let owned = outputs
                .iter()
                .position(|(o, _)| o == id)
                .map(|i| outputs.swap_remove(i).1);
            let t = match owned {
                Some(t) => t,
                // An output that is an intermediate, an input or a weight itself, or a buffer
                // named by two outputs: hand back a copy.
                None => self.copy_of(*id, (s.addresses[*id], s.lengths[*id]), bindings)?,
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

    /// Convenience for callers holding host tensors: check, upload, run, download,
    /// synchronise. Inputs the guards refuse are refused before they are copied (a tensor of
    /// the wrong shape may not even fit on the device).
    pub fn run_host(
        &self,
        inputs: &BTreeMap<String, HostTensor>,
        opts: RunOptions,
    ) -> Result<BTreeMap<String, HostTensor>, RuntimeError> {
        self.check_host(inputs)?;
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

/// How many runs a phase of [`time_runs`] takes: a count, or as many as fill a wall time by an
/// estimate taken first. triton's `do_bench` sizes its phases the second way (25 ms of warm-up,
/// `rep` ms of timed runs, counted from the mean of five runs, each after its L2 flush), so a
/// side timed against it spends as long at the same duty cycle, which under a power limit sets
/// the clocks (docs/perf-notes.md, "Measuring").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    Count(usize),
    Millis(u64),
}

impl Runs {
    /// The number of runs, given the estimated time of one (with its flush): at least one for a
    /// wall time.
    pub fn count(self, estimate_ms: f64) -> usize {
        match self {
            Runs::Count(n) => n,
            Runs::Millis(ms) => {
                let n = ms as f64 / estimate_ms;
                if n.is_finite() && n >= 1.0 {
                    n as usize
                } else {
                    1
                }
            }
        }
    }
}

/// How [`time_runs`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimingOptions {
    /// Wall time of untimed runs back to back before the warm-up, so that the timed runs see
    /// the clocks the board's power limit holds under sustained load rather than those of a GPU
    /// that was idle a moment before (an H200 running large GEMMs drops from 1980 to about 1500
    /// MHz within a second; docs/perf-notes.md, "Measuring").
    pub heat: std::time::Duration,
    /// Untimed runs after the heat.
    pub warmup: Runs,
    /// Timed runs.
    pub iters: Runs,
    /// Bytes of a scratch buffer zeroed before every timed run, outside its events (0: none):
    /// what triton's `do_bench` does between the runs it times (256 MB), so that a comparison
    /// with it runs both sides at the same duty cycle, which under a power limit sets the clocks.
    pub flush_bytes: usize,
}

/// Times `o.iters` runs after the heat and `o.warmup` untimed ones (see [`TimingOptions`]; where
/// either is a wall time, five runs, each after its flush, estimate one run's time first),
/// rotating through `exes` (the same plan with different weights, so that weights do not stay
/// in L2) and `inputs`, every run with `opts`. Each timed run is bracketed by CUDA events on the
/// stream; returns the per-run times.
pub fn time_runs(
    exes: &[&Executable],
    inputs: &[BTreeMap<String, DeviceTensor>],
    o: TimingOptions,
    opts: RunOptions,
) -> Result<Timings, RuntimeError> {
    let TimingOptions {
        heat,
        warmup,
        iters,
        flush_bytes,
    } = o;
    let (Some(first), false) = (exes.first(), inputs.is_empty()) else {
        return Err(RuntimeError::Mismatch(
            "timing needs at least one executable and one input set".into(),
        ));
    };
    let device = first.device();
    let ctx = device.context();
    let stream = device.stream();
    let mut graph_runs = 0;
    // Batches of runs, each waited for, keep the queue short (the host enqueues far faster than
    // large plans run); a batch doubles while it takes under 10 ms, so the GPU idles only for a
    // wait's wake-up between batches.
    let heat_start = std::time::Instant::now();
    let mut batch = 1usize;
    let mut n = 0usize;
    while heat_start.elapsed() < heat {
        let t0 = std::time::Instant::now();
        for _ in 0..batch {
            drop(exes[n % exes.len()].run(&inputs[n % inputs.len()], opts)?);
            n += 1;
        }
        device.synchronize()?;
        if t0.elapsed() < std::time::Duration::from_millis(10) {
            batch *= 2;
        }
    }
    let mut scratch = if flush_bytes > 0 {
        Some(
            stream
                .alloc_zeros::<u8>(flush_bytes)
                .map_err(driver("allocating the scratch buffer that clears the L2"))?,
        )
    } else {
        None
    };
    // Where a phase is a wall time, the time of one run with its flush, as `do_bench` takes it.
    let mut next = 0usize;
    let estimate_ms = if matches!(warmup, Runs::Millis(_)) || matches!(iters, Runs::Millis(_)) {
        let start = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        let end = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        const ESTIMATE_RUNS: usize = 5;
        start.record(stream).map_err(driver("recording an event"))?;
        for _ in 0..ESTIMATE_RUNS {
            if let Some(buf) = scratch.as_mut() {
                stream
                    .memset_zeros(buf)
                    .map_err(driver("clearing the L2 through the scratch buffer"))?;
            }
            drop(exes[next % exes.len()].run(&inputs[next % inputs.len()], opts)?);
            next += 1;
        }
        end.record(stream).map_err(driver("recording an event"))?;
        device.synchronize()?;
        f64::from(start.elapsed_ms(&end).map_err(driver("reading an event"))?)
            / ESTIMATE_RUNS as f64
    } else {
        f64::NAN
    };
    let warmup = warmup.count(estimate_ms);
    let iters = iters.count(estimate_ms);
    let mut pairs: Vec<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)> =
        Vec::with_capacity(iters);
    let mut host_us = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let exe = exes[(next + i) % exes.len()];
        let inp = &inputs[(next + i) % inputs.len()];
        if i < warmup {
            drop(exe.run(inp, opts)?);
            continue;
        }
        let start = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        let end = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        // At most IN_FLIGHT timed runs queued: a long phase (do_bench's 200 ms are over a
        // thousand short runs) would otherwise fill the driver's launch queue, and `run` would
        // block on it and count the GPU's time as host time. A few milliseconds of queued work
        // keep the GPU as busy as before.
        const IN_FLIGHT: usize = 32;
        if pairs.len() >= IN_FLIGHT {
            let (_, end) = &pairs[pairs.len() - IN_FLIGHT];
            end.synchronize()
                .map_err(driver("waiting for a timed run"))?;
        }
        let before = exe.graph_stats().graph_launches;
        if let Some(buf) = scratch.as_mut() {
            stream
                .memset_zeros(buf)
                .map_err(driver("clearing the L2 through the scratch buffer"))?;
        }
        start.record(stream).map_err(driver("recording an event"))?;
        let host = std::time::Instant::now();
        let out = exe.run(inp, opts)?;
        host_us.push(host.elapsed().as_secs_f64() * 1e6);
        end.record(stream).map_err(driver("recording an event"))?;
        if exe.graph_stats().graph_launches > before {
            graph_runs += 1;
        }
        // Freed in stream order, as a caller dropping its outputs would: the next run's
        // outputs reuse the pool's memory instead of growing it by every run's outputs.
        drop(out);
        pairs.push((start, end));
    }
    device.synchronize()?;
    let gpu_ms = pairs
        .iter()
        .map(|(s, e)| {
            s.elapsed_ms(e)
                .map(f64::from)
                .map_err(driver("reading an event"))
        })
        .collect::<Result<Vec<f64>, DeviceError>>()?;
    Ok(Timings {
        gpu_ms,
        host_us,
        graph_runs,
    })
}

/// What [`time_runs`] measured, per run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// Between CUDA events recorded before and after each run on the stream, in milliseconds.
    pub gpu_ms: Vec<f64>,
    /// Host time of each `run` call (guards, allocation, argument updates, launches; no
    /// waiting), in microseconds.
    pub host_us: Vec<f64>,
    /// How many of the timed runs were launched as one CUDA graph.
    pub graph_runs: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_time_counts_runs_from_the_estimate_and_never_none() {
        // do_bench's sizes: 200 ms of 0.135 ms runs (a GEMM with its flush) are 1481 runs.
        assert_eq!(Runs::Millis(200).count(0.135), 1481);
        assert_eq!(Runs::Millis(25).count(0.135), 185);
        assert_eq!(Runs::Millis(200).count(2.0), 100);
        // A run longer than the wall time, or an estimate that is no time at all: one run.
        assert_eq!(Runs::Millis(25).count(40.0), 1);
        assert_eq!(Runs::Millis(25).count(f64::NAN), 1);
        assert_eq!(Runs::Millis(25).count(0.0), 1);
        assert_eq!(Runs::Millis(0).count(0.1), 1);
        // A count is a count, whatever the estimate.
        assert_eq!(Runs::Count(200).count(0.135), 200);
        assert_eq!(Runs::Count(0).count(f64::NAN), 0);
    }

    fn kernel(name: &str, params: Vec<Param>, relayouts: Vec<Relayout>) -> CudaKernel {
        CudaKernel {
            name: name.into(),
            entry: name.into(),
            source: String::new(),
            launch: Launch {
                block: [32, 1, 1],
                smem_bytes: 0,
                grid: mlpc_codegen::Grid::Elements {
                    numel: mlpc_ir::Extent::constant(1),
                    per_block: 1,
                },
                early_launch: false,
                walk_costs: Vec::new(),
            },
            params,
            small_m: None,
            relayouts,
            short_grids: Vec::new(),
            tile_fixed_cols: 0,
        }
    }

    fn map(buffer: usize) -> Param {
        Param::TensorMap {
            buffer,
            rows: mlpc_ir::Extent::constant(16),
            cols: mlpc_ir::Extent::constant(64),
            row_stride: mlpc_ir::Extent::constant(64),
            box_rows: 16,
            box_cols: 64,
        }
    }

    /// Kernels asking for the same rearrangement of a weight share one copy, placed after the
    /// plan's buffers; their pointer and tensor-map arguments move to it, the others stay; a
    /// weight only read rearranged is named by no argument any more.
    #[test]
    fn rearranged_weights_get_their_own_buffer_ids() {
        let r = |buffer| Relayout {
            buffer,
            chunk_bytes: 16,
            perm: vec![1, 0],
        };
        let buf = |buffer| Param::Buffer { buffer };
        let mut ks = vec![
            kernel("a", vec![buf(0), buf(1), map(1)], vec![r(1)]),
            kernel("b", vec![buf(2), buf(3)], vec![]),
            kernel("c", vec![buf(3), buf(1), map(1), buf(4)], vec![r(1), r(4)]),
        ];
        let copies = assign_relayouts(5, &mut ks);
        assert_eq!(
            copies,
            vec![(r(1), "a".to_string()), (r(4), "c".to_string())]
        );
        assert_eq!(ks[0].params, vec![buf(0), buf(5), map(5)]);
        assert_eq!(ks[1].params, vec![buf(2), buf(3)]);
        assert_eq!(ks[2].params, vec![buf(3), buf(5), map(5), buf(6)]);
        let named_ids: Vec<usize> = (0..7).filter(|&id| named(ks.iter(), id)).collect();
        assert_eq!(named_ids, vec![0, 2, 3, 5, 6]);
        // Another rearrangement of the same weight is another copy.
        let other = Relayout {
            perm: vec![0, 1],
            ..r(1)
        };
        let mut ks = vec![
            kernel("a", vec![buf(1)], vec![r(1)]),
            kernel("b", vec![buf(1)], vec![other.clone()]),
        ];
        let copies = assign_relayouts(2, &mut ks);
        assert_eq!(copies.len(), 2);
        assert_eq!(
            (ks[0].params[0].clone(), ks[1].params[0].clone()),
            (buf(2), buf(3))
        );
    }

    #[test]
    fn explicit_options_are_kept_as_given() {
        let o = RunOptions {
            poison: true,
            graphs: false,
            early_launch: false,
        };
        assert_eq!(o, o.clone());
        assert!(!RunOptions::default().poison);
        assert_eq!(RunOptions::default().graphs, graphs_by_default());
        assert_eq!(
            RunOptions::default().early_launch,
            early_launch_by_default()
        );
    }
}
