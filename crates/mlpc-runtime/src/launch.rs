//! Kernel arguments and launches: what one kernel of a run needs, whether it is launched on its
//! own (`cuLaunchKernel`) or as a node of the plan's CUDA graph (see [`crate::graph`]).
//!
//! The argument list of an entry is built by one function, `kernel_args`, from the kernel's
//! [`Param`]s; both launch paths turn the same `&[KernelArg]` into the driver's array of argument
//! pointers ([`KernelArg::as_param`]). A new argument kind of the kernel ABI is a new variant of
//! [`KernelArg`] and an arm in those two places, nothing else.

use crate::device::DeviceError;
use crate::tensor_map::{MapRequest, TensorMapArg, TensorMapError};
use cudarc::driver::sys;
use mlpc_codegen::{LaunchError, Param};
use mlpc_ir::{Bindings, DType, Extent};
use smallvec::SmallVec;
use std::ffi::c_void;
use std::sync::Arc;

/// One argument of a kernel entry, by value, as the driver copies it at launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// A device pointer or a symbol's value (`long long`): 8 bytes.
    U64(u64),
    /// A tensor map (128 bytes) and what it was encoded from, so that an unchanged request
    /// reuses it instead of encoding it again.
    Map(TensorMapArg, MapRequest),
    /// A persistent walk's work-item table (`Param::Walk`: `mlpc_codegen::WALK_ARG_BYTES`
    /// bytes), shared with the launch it was computed for.
    Walk(Arc<[u8]>),
}

impl KernelArg {
    /// The address of the argument's bytes, as `cuLaunchKernel` and kernel graph nodes take it.
    /// Valid while `self` is neither moved nor dropped.
    pub fn as_param(&self) -> *mut c_void {
        match self {
            KernelArg::U64(v) => v as *const u64 as *mut c_void,
            KernelArg::Map(m, _) => &m.0 as *const sys::CUtensorMap as *mut c_void,
            KernelArg::Walk(bytes) => bytes.as_ptr() as *mut c_void,
        }
    }
}

/// The driver's argument array for `args`: one pointer per argument, into `args`. Most entries
/// take fewer than 16 arguments, so the array lives on the stack.
pub(crate) fn param_array(args: &[KernelArg]) -> SmallVec<[*mut c_void; 16]> {
    args.iter().map(KernelArg::as_param).collect()
}

/// Why an argument list could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ArgError {
    /// A `Param::Buffer` names a buffer the plan does not have.
    NoBuffer(usize),
    Launch(LaunchError),
    /// The buffer (by id) cannot be described by a tensor map.
    TensorMap(usize, TensorMapError),
    /// The launch's work-item table has this many bytes, not `WALK_ARG_BYTES`.
    Walk(usize),
}

/// Fills `out` with the arguments of an entry taking `params`, given the device address and
/// element type of every plan buffer (`addresses[id]`, `dtypes[id]`), the address of the run's
/// workspace (`Param::Workspace`; 0 when the run needs none), the launch's work-item table
/// (`Param::Walk`, [`NodeLaunch::walk`]) and the run's `bindings`.
/// `out` keeps its capacity, so that a run reusing it allocates nothing, and a tensor map whose
/// request equals the one already in its slot is kept rather than encoded again.
pub(crate) fn kernel_args(
    params: &[Param],
    addresses: &[u64],
    workspace: u64,
    walk: &Arc<[u8]>,
    dtypes: &[DType],
    bindings: &Bindings,
    out: &mut Vec<KernelArg>,
) -> Result<(), ArgError> {
    out.truncate(params.len());
    let address = |b: usize| addresses.get(b).copied().ok_or(ArgError::NoBuffer(b));
    let value = |e: &Extent| match e.syms.iter().find(|s| bindings.get(s).is_none()) {
        Some(s) => Err(ArgError::Launch(LaunchError::Unbound {
            symbol: s.to_string(),
        })),
        None => Ok(e.resolve(bindings).unwrap_or(u64::MAX)),
    };
    for (i, p) in params.iter().enumerate() {
        let arg = match p {
            Param::Buffer { buffer } => KernelArg::U64(address(*buffer)?),
            Param::Workspace => KernelArg::U64(workspace),
            Param::Walk if walk.len() == mlpc_codegen::WALK_ARG_BYTES => {
                KernelArg::Walk(walk.clone())
            }
            Param::Walk => return Err(ArgError::Walk(walk.len())),
            Param::Dim { symbol } => KernelArg::U64(bindings.get(symbol).ok_or_else(|| {
                ArgError::Launch(LaunchError::Unbound {
                    symbol: symbol.clone(),
                })
            })?),
            Param::TensorMap {
                buffer,
                rows,
                cols,
                row_stride,
                box_rows,
                box_cols,
            } => {
                let req = MapRequest {
                    address: address(*buffer)?,
                    dtype: *dtypes.get(*buffer).ok_or(ArgError::NoBuffer(*buffer))?,
                    rows: value(rows)?,
                    cols: value(cols)?,
                    row_stride: value(row_stride)?,
                    box_rows: *box_rows,
                    box_cols: *box_cols,
                };
                match out.get(i) {
                    Some(KernelArg::Map(map, old)) if *old == req => KernelArg::Map(*map, req),
                    _ => KernelArg::Map(
                        req.encode().map_err(|e| ArgError::TensorMap(*buffer, e))?,
                        req,
                    ),
                }
            }
        };
        match out.get_mut(i) {
            Some(slot) => *slot = arg,
            None => out.push(arg),
        }
    }
    Ok(())
}

/// Which entry of a loaded kernel runs: its own, one of its small-M variants, or another entry
/// of a persistent GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Tiled,
    /// Index into the kernel's `small_m.variants`.
    SmallM(usize),
    /// A persistent GEMM's entry on smaller tiles, on its own launch: index into
    /// `CudaKernel::short_grids`.
    Short(usize),
    /// Another entry of a persistent GEMM on the launch of the tiled or the short-grid entry
    /// (`Launch::alternate_entry`: the split-K one, or the one-tile one), by index into the
    /// loaded kernel's alternates.
    Alternate(usize),
}

/// One kernel launch of a run. Everything but `args` follows from the bindings alone, so it is
/// resolved once per bindings; `args` is refilled by every run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NodeLaunch {
    /// The kernel's index in the plan.
    pub kernel: usize,
    pub entry: Entry,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem_bytes: u32,
    /// The entry may start while the kernel before it runs (`Launch::early_launch`); used only
    /// when the kernel before is one of the same run's.
    pub early_launch: bool,
    /// The bytes of the entry's `Param::Walk` argument under the launch's bindings
    /// (`Launch::walk_arg`), empty where the kernel takes none.
    pub walk: Arc<[u8]>,
    pub args: Vec<KernelArg>,
}

impl Clone for NodeLaunch {
    fn clone(&self) -> NodeLaunch {
        NodeLaunch {
            args: self.args.clone(),
            walk: self.walk.clone(),
            ..*self
        }
    }

    /// Reuses `self.args`' allocation: a graph node's last launch is overwritten on every
    /// update.
    fn clone_from(&mut self, source: &NodeLaunch) {
        self.args.clone_from(&source.args);
        self.kernel = source.kernel;
        self.entry = source.entry;
        self.grid = source.grid;
        self.block = source.block;
        self.smem_bytes = source.smem_bytes;
        self.early_launch = source.early_launch;
        self.walk.clone_from(&source.walk);
    }
}

impl NodeLaunch {
    /// The driver's description of this launch as a graph kernel node. Its `kernelParams`
    /// points into `params`, which must outlive every use of the result.
    pub(crate) fn node_params(
        &self,
        function: sys::CUfunction,
        params: &mut [*mut c_void],
    ) -> sys::CUDA_KERNEL_NODE_PARAMS {
        sys::CUDA_KERNEL_NODE_PARAMS {
            func: function,
            gridDimX: self.grid[0],
            gridDimY: self.grid[1],
            gridDimZ: self.grid[2],
            blockDimX: self.block[0],
            blockDimY: self.block[1],
            blockDimZ: self.block[2],
            sharedMemBytes: self.smem_bytes,
            kernelParams: params.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            // Both are ignored when `func` is set.
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }

    /// Enqueues this launch on `stream`. `after_kernel`: the work before it on the stream is a
    /// kernel of the same run, so an `early_launch` entry may overlap it (programmatic stream
    /// serialization); otherwise the launch waits for everything before it, as usual.
    ///
    /// # Safety
    /// `function` must be a live entry of the stream's context whose signature matches `args`,
    /// and every pointer argument must address memory that stays live until the kernel ran.
    pub(crate) unsafe fn launch(
        &self,
        function: sys::CUfunction,
        stream: sys::CUstream,
        after_kernel: bool,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut params = param_array(&self.args);
        if !(self.early_launch && after_kernel) {
            return cudarc::driver::result::launch_kernel(
                function,
                (self.grid[0], self.grid[1], self.grid[2]),
                (self.block[0], self.block[1], self.block[2]),
                self.smem_bytes,
                stream,
                &mut params,
            );
        }
        // SAFETY: plain data; every field the driver reads is set below.
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: self.grid[0],
            gridDimY: self.grid[1],
            gridDimZ: self.grid[2],
            blockDimX: self.block[0],
            blockDimY: self.block[1],
            blockDimZ: self.block[2],
            sharedMemBytes: self.smem_bytes,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()).result()
    }
}

/// A launch failure as a [`DeviceError`], built only when there is one.
pub(crate) fn launch_failed(kernel: &str, source: cudarc::driver::DriverError) -> DeviceError {
    DeviceError::Driver {
        doing: format!("launching kernel `{kernel}`"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlpc_ir::Symbol;

    fn no_walk() -> Arc<[u8]> {
        Arc::from(Vec::new())
    }

    fn bindings(values: &[(&str, u64)]) -> Bindings {
        let mut b = Bindings::new();
        for (s, v) in values {
            b.bind(&Symbol::from(*s), *v).unwrap();
        }
        b
    }

    #[test]
    fn arguments_follow_the_params_in_order() {
        let params = vec![
            Param::Buffer { buffer: 2 },
            Param::Buffer { buffer: 0 },
            Param::Dim { symbol: "T".into() },
            Param::Workspace,
        ];
        let mut out = vec![KernelArg::U64(99); 7];
        kernel_args(
            &params,
            &[0x1000, 0x2000, 0x3000],
            0x9000,
            &no_walk(),
            &[DType::Bf16; 3],
            &bindings(&[("T", 5)]),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [
                KernelArg::U64(0x3000),
                KernelArg::U64(0x1000),
                KernelArg::U64(5),
                KernelArg::U64(0x9000)
            ]
        );
    }

    #[test]
    fn a_missing_buffer_or_symbol_is_an_error() {
        let mut out = Vec::new();
        let e = kernel_args(
            &[Param::Buffer { buffer: 3 }],
            &[1, 2, 3],
            0,
            &no_walk(),
            &[DType::Bf16; 3],
            &Bindings::new(),
            &mut out,
        );
        assert_eq!(e, Err(ArgError::NoBuffer(3)));
        let e = kernel_args(
            &[Param::Dim { symbol: "B".into() }],
            &[],
            0,
            &no_walk(),
            &[],
            &bindings(&[("T", 5)]),
            &mut out,
        );
        assert_eq!(
            e,
            Err(ArgError::Launch(LaunchError::Unbound {
                symbol: "B".into()
            }))
        );
    }

    fn map_param() -> Param {
        Param::TensorMap {
            buffer: 1,
            rows: Extent::of_dim(&mlpc_ir::Dim::sym("T")),
            cols: Extent::constant(768),
            row_stride: Extent::constant(768),
            box_rows: 128,
            box_cols: 64,
        }
    }

    #[test]
    fn an_unchanged_tensor_map_request_keeps_its_encoding() {
        let req = MapRequest {
            address: 0x2000,
            dtype: DType::Bf16,
            rows: 5,
            cols: 768,
            row_stride: 768,
            box_rows: 128,
            box_cols: 64,
        };
        // The slot holds the map of this very request (marked bytes): kept, not encoded again
        // (encoding needs the driver, absent here).
        let mut marked = TensorMapArg(sys::CUtensorMap { opaque: [0; 16] });
        marked.0.opaque[0] = 0xABCD;
        let mut out = vec![KernelArg::U64(1), KernelArg::Map(marked, req)];
        kernel_args(
            &[Param::Buffer { buffer: 0 }, map_param()],
            &[0x1000, 0x2000],
            0,
            &no_walk(),
            &[DType::Bf16; 2],
            &bindings(&[("T", 5)]),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [KernelArg::U64(0x1000), KernelArg::Map(marked, req)]);
    }

    #[test]
    fn a_tensor_map_the_copy_engine_cannot_read_is_an_error_naming_the_buffer() {
        let mut out = Vec::new();
        // A base address off a 16-byte boundary fails the checks before the driver is asked.
        let e = kernel_args(
            &[map_param()],
            &[0x1000, 0x2008],
            0,
            &no_walk(),
            &[DType::Bf16; 2],
            &bindings(&[("T", 5)]),
            &mut out,
        );
        assert_eq!(
            e,
            Err(ArgError::TensorMap(1, TensorMapError::Address(0x2008)))
        );
        let e = kernel_args(
            &[map_param()],
            &[0x1000, 0x2000],
            0,
            &no_walk(),
            &[DType::Bf16; 2],
            &Bindings::new(),
            &mut out,
        );
        assert_eq!(
            e,
            Err(ArgError::Launch(LaunchError::Unbound {
                symbol: "T".into()
            }))
        );
    }

    #[test]
    fn a_work_item_table_is_passed_by_value_and_checked_for_its_size() {
        let walk: Arc<[u8]> = Arc::from(vec![7u8; mlpc_codegen::WALK_ARG_BYTES]);
        let mut out = Vec::new();
        kernel_args(
            &[Param::Buffer { buffer: 0 }, Param::Walk],
            &[0x1000],
            0,
            &walk,
            &[DType::Bf16],
            &Bindings::new(),
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [KernelArg::U64(0x1000), KernelArg::Walk(walk.clone())]);
        // The driver reads the argument's bytes where the parameter array points.
        let ptrs = param_array(&out);
        assert_eq!(ptrs[1] as *const u8, walk.as_ptr());
        let e = kernel_args(
            &[Param::Walk],
            &[],
            0,
            &no_walk(),
            &[],
            &Bindings::new(),
            &mut out,
        );
        assert_eq!(e, Err(ArgError::Walk(0)));
    }

    #[test]
    fn the_param_array_points_at_each_argument() {
        let args = [KernelArg::U64(7), KernelArg::U64(u64::MAX)];
        let ptrs = param_array(&args);
        assert_eq!(ptrs.len(), 2);
        // SAFETY: each pointer addresses a `u64` of `args`, which is alive.
        let read: Vec<u64> = ptrs
            .iter()
            .map(|&p| unsafe { *(p as *const u64) })
            .collect();
        assert_eq!(read, [7, u64::MAX]);
    }

    #[test]
    fn node_params_carry_the_launch() {
        let launch = NodeLaunch {
            kernel: 1,
            entry: Entry::SmallM(0),
            grid: [3, 2, 1],
            block: [128, 1, 1],
            smem_bytes: 4096,
            early_launch: false,
            walk: no_walk(),
            args: vec![KernelArg::U64(1), KernelArg::U64(2)],
        };
        let mut params = param_array(&launch.args);
        let p = launch.node_params(std::ptr::null_mut(), &mut params);
        assert_eq!((p.gridDimX, p.gridDimY, p.gridDimZ), (3, 2, 1), "grid");
        assert_eq!((p.blockDimX, p.sharedMemBytes), (128, 4096));
        assert_eq!(p.kernelParams, params.as_mut_ptr());
        assert!(p.extra.is_null());
    }
}
