//! The CUDA runtime: the only crate that talks to the CUDA driver.
//!
//! It opens a device (checking first that the driver library can be loaded, since cudarc panics
//! when it cannot), uploads weights once, checks every input against the plan's guards, allocates
//! intermediates and launches the compiled kernels in plan order on a stream.
//!
//! **Architecture invariant:** this crate knows nothing of model files, passes or how kernels were
//! generated: it runs a [`mlpc_ir::Plan`] whose kernels come as CUBIN images with a launch
//! description.

pub mod device;
pub mod executable;
pub mod guard;
pub mod tensor_map;

pub use device::{driver_present, Device, DeviceError, DeviceTensor, TensorRef};
pub use executable::{time_runs, Executable, KernelImage, RunOptions, RuntimeError, Timings};
pub use guard::{check_guards, GuardError, TensorMeta};
