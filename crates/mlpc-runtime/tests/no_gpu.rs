//! On a machine without a usable GPU, opening a device is an error with a clear message, never a
//! panic (cudarc panics when libcuda is missing, so the runtime must check first).

use mlpc_runtime::{driver_present, Device, DeviceError};

#[test]
fn opening_a_device_without_a_gpu_is_a_clear_error() {
    match Device::open(0) {
        Ok(d) => assert!(driver_present(), "opened {} without a driver", d.describe()),
        Err(DeviceError::NoDriver) => {
            assert!(!driver_present());
            let msg = DeviceError::NoDriver.to_string();
            assert!(
                msg.contains("libcuda.so.1") && msg.ends_with("has no NVIDIA driver"),
                "{msg}"
            );
        }
        Err(e @ (DeviceError::NoDevice(_) | DeviceError::BadOrdinal { .. })) => {
            assert!(driver_present(), "{e}")
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}
