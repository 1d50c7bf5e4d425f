//! The CUDA runtime: the only crate that talks to the CUDA driver.
//!
//! It opens a device (checking first that the driver library can be loaded, since cudarc panics
//! when it cannot), uploads weights once, checks every input against the plan's guards, allocates
//! intermediates and launches the compiled kernels in plan order on a stream: one by one, or,
//! when the bindings of the symbolic dims repeat, as one CUDA graph of the whole plan.
//!
//! **Architecture invariant:** this crate knows nothing of model files, passes or how kernels were
//! generated: it runs a [`mlpc_ir::Plan`] whose kernels come as CUBIN images with a launch
//! description.

pub mod device;
pub mod env;
pub mod executable;
pub mod graph;
pub mod guard;
pub mod launch;
pub mod tensor_map;

pub use device::{check_driver, driver_present, Device, DeviceError, DeviceTensor, TensorRef};
pub use env::{switch, switch_setting, SwitchError, RUNTIME_SWITCHES};
pub use executable::{
    early_launch_by_default, graphs_by_default, time_runs, Executable, KernelImage, PlannedLaunch,
    RunOptions, Runs, RuntimeError, TimingOptions, Timings,
};
pub use graph::GraphStats;
pub use guard::{check_guards, check_input_names, GuardError, TensorMeta};
pub use launch::KernelArg;
