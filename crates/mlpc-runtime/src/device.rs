//! Opening a CUDA device and moving tensors to and from it.

use crate::guard::TensorMeta;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError};
use mlpc_ir::{DType, HostTensor};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "the CUDA driver library (libcuda.so.1) cannot be loaded: this machine has no NVIDIA driver"
    )]
    NoDriver,
    #[error(
        "`{name}`, the CUDA driver library the dynamic loader finds by name (LD_LIBRARY_PATH, \
         the ld cache), cannot be used: {reason}; take it off the loader's path"
    )]
    DriverInvalid { name: String, reason: String },
    #[error("the CUDA driver is present but reports no GPU: {0}")]
    NoDevice(String),
    #[error("device {ordinal} does not exist: the driver reports {count} device(s)")]
    BadOrdinal { ordinal: usize, count: i32 },
    /// `source` is not a `#[source]`: cudarc's `DriverError` displays as its `Debug` form, so the
    /// message says what it is instead ([`describe_driver_error`]).
    #[error("CUDA driver error while {doing}: {}", describe_driver_error(source))]
    Driver { doing: String, source: DriverError },
}

/// A driver error in words: the driver's description and the code's name, e.g. "out of memory
/// (CUDA_ERROR_OUT_OF_MEMORY)".
pub fn describe_driver_error(e: &DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{} ({:?})", s.to_string_lossy(), e.0),
        Err(_) => format!("{:?}", e.0),
    }
}

/// Turns a driver error into a [`DeviceError`] saying what was being done. The description
/// becomes a `String` only when there is an error, so that a `&'static str` costs nothing on the
/// success path of a run.
pub(crate) fn driver<D: Into<String>>(doing: D) -> impl FnOnce(DriverError) -> DeviceError {
    move |source| DeviceError::Driver {
        doing: doing.into(),
        source,
    }
}

/// An open device and the stream mlpc launches on.
#[derive(Clone, Debug)]
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    sms: u32,
}

/// Whether the CUDA driver library can be loaded on this machine. Checking first matters:
/// cudarc panics when a library it needs is missing, or lacks a function it calls.
pub fn driver_present() -> bool {
    check_driver().is_ok()
}

/// Driver functions cudarc looks up (each on its first call, panicking where it is missing)
/// for what mlpc does first: initialise, count and open devices, load modules, launch.
const DRIVER_SYMBOLS: [&str; 8] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuModuleLoadData",
    "cuLaunchKernelEx",
    "cuTensorMapEncodeTiled",
];

/// The driver library cudarc opens by name (the first of its candidate names, `libcuda.so` and
/// then versioned ones, that the dynamic loader opens), checked to be the CUDA driver:
/// [`DeviceError::NoDriver`] where none opens, [`DeviceError::DriverInvalid`] where the first
/// that opens lacks one of the functions mlpc calls first (`cuInit`, `cuLaunchKernelEx`, ...).
pub fn check_driver() -> Result<(), DeviceError> {
    static CHECKED: std::sync::OnceLock<Result<(), (String, String)>> = std::sync::OnceLock::new();
    let found = CHECKED.get_or_init(|| {
        for name in cudarc::get_lib_name_candidates("cuda") {
            // SAFETY: dlopen of the driver runs no initialisation with preconditions; the
            // handle is closed again (cudarc opens its own).
            let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
                continue;
            };
            for sym in DRIVER_SYMBOLS {
                // SAFETY: only the symbol's address is looked up; nothing is called.
                if unsafe { lib.get::<*const ()>(sym) }.is_err() {
                    return Err((name, format!("it has no {sym}: not the CUDA driver")));
                }
            }
            return Ok(());
        }
        Err((String::new(), String::new()))
    });
    match found {
        Ok(()) => Ok(()),
        Err((name, _)) if name.is_empty() => Err(DeviceError::NoDriver),
        Err((name, reason)) => Err(DeviceError::DriverInvalid {
            name: name.clone(),
            reason: reason.clone(),
        }),
    }
}

impl Device {
    /// Opens device `ordinal`, with a fresh stream.
    pub fn open(ordinal: usize) -> Result<Device, DeviceError> {
        check_driver()?;
        let count =
            CudaContext::device_count().map_err(|e| DeviceError::NoDevice(e.to_string()))?;
        if count <= 0 {
            return Err(DeviceError::NoDevice("device count is 0".into()));
        }
        if ordinal >= count as usize {
            return Err(DeviceError::BadOrdinal { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver(format!("opening device {ordinal}")))?;
        // SAFETY: every allocation, copy and launch of this `Device` goes to its one stream, so
        // the stream's order already orders every use of every buffer; cudarc's per-buffer event
        // tracking would only add host work (an event record per buffer per run). Callers that
        // touch a `DeviceTensor` from another stream must synchronise with `Device::stream` first.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(driver("reading the multiprocessor count"))?;
        Ok(Device {
            ctx,
            stream,
            ordinal,
            sms: sms.max(1) as u32,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The number of multiprocessors (the block count of a persistent kernel's grid).
    pub fn sm_count(&self) -> u32 {
        self.sms
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The compute capability `(major, minor)`, e.g. `(9, 0)` for an H100 or H200.
    pub fn compute_capability(&self) -> Result<(i32, i32), DeviceError> {
        self.ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))
    }

    /// The device's name and compute capability, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        match self.ctx.compute_capability() {
            Ok((maj, min)) => format!("{name} (sm_{maj}{min})"),
            Err(_) => name,
        }
    }

    /// Copies a host tensor to the device (row-major).
    pub fn upload(&self, t: &HostTensor) -> Result<DeviceTensor, DeviceError> {
        // An empty tensor gets one byte, as `zeros` and `uninit` do (the driver allocates no
        // zero-byte buffer), so that the guards, not the driver, say what is wrong with it.
        let data = if t.bytes().is_empty() {
            self.stream.alloc_zeros::<u8>(1)
        } else {
            self.stream.clone_htod(t.bytes())
        }
        .map_err(driver("copying a tensor to the device"))?;
        Ok(self.row_major(data, t.dtype(), t.shape()))
    }

    /// A zero-filled row-major device tensor.
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, DeviceError> {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        let data = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver("allocating device memory"))?;
        Ok(self.row_major(data, dtype, shape))
    }

    /// A row-major device tensor whose contents are undefined until a kernel writes them.
    pub fn uninit(&self, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, DeviceError> {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        // SAFETY: the bytes are only read after a kernel wrote them (or, with poisoning, after
        // they were filled); `u8` has no invalid bit patterns.
        let data = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
            .map_err(driver("allocating device memory"))?;
        Ok(self.row_major(data, dtype, shape))
    }

    fn row_major(&self, data: CudaSlice<u8>, dtype: DType, shape: &[usize]) -> DeviceTensor {
        DeviceTensor {
            dtype,
            shape: shape.to_vec(),
            strides: TensorMeta::contiguous_strides(shape),
            data,
            device: self.ordinal,
        }
    }

    /// Copies a row-major device tensor back to the host.
    pub fn download(&self, t: &DeviceTensor) -> Result<HostTensor, DeviceError> {
        let mut bytes = self
            .stream
            .clone_dtoh(&t.data)
            .map_err(driver("copying a tensor to the host"))?;
        let n = t.shape.iter().product::<usize>() * t.dtype.size_bytes();
        bytes.truncate(n);
        HostTensor::from_bytes(t.dtype, t.shape.clone(), bytes).map_err(|e| {
            DeviceError::NoDevice(format!("downloaded tensor has the wrong size: {e}"))
        })
    }

    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.stream
            .synchronize()
            .map_err(driver("synchronising the stream"))
    }
}

/// A tensor in device memory: a byte buffer with a dtype, a shape and strides (in elements).
#[derive(Debug)]
pub struct DeviceTensor {
    pub data: CudaSlice<u8>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// The ordinal of the device the memory was allocated on (informational: the guards read
    /// the memory's own device).
    pub device: usize,
}

impl DeviceTensor {
    /// The metadata the guards check.
    pub fn meta(&self, stream: &CudaStream) -> TensorMeta {
        meta_of(&self.data, self.dtype, &self.shape, &self.strides, stream)
    }

    /// A borrowed view of the same memory, shape and strides.
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            data: &self.data,
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            device: self.device,
        }
    }
}

/// Device memory borrowed with the shape and strides to read it with: how a caller hands the
/// same memory to a kernel under another view (e.g. a transposed one) without copying it.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub data: &'a CudaSlice<u8>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
    /// The ordinal of the device that holds the memory (informational: the guards read the
    /// memory's own device).
    pub device: usize,
}

impl TensorRef<'_> {
    /// The metadata the guards check.
    pub fn meta(&self, stream: &CudaStream) -> TensorMeta {
        meta_of(self.data, self.dtype, &self.shape, &self.strides, stream)
    }
}

/// The guards' view of device memory read with `dtype`, `shape` and `strides`: its address,
/// length and device are the memory's own, whatever the caller's struct says.
fn meta_of(
    data: &CudaSlice<u8>,
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
    stream: &CudaStream,
) -> TensorMeta {
    let (address, _sync) = data.device_ptr(stream);
    TensorMeta {
        dtype,
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        address,
        bytes: data.len() as u64,
        device: data.ordinal(),
    }
}
