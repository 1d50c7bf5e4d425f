//! Tensor maps for kernels fed by the copy engine (TMA): mlpc-codegen's `Param::TensorMap`,
//! encoded with `cuTensorMapEncodeTiled` from a buffer's address and the bound symbols.
//!
//! The checks the driver would make are made here first, so that a tensor the copy engine cannot
//! read (a base address or row stride that is not a multiple of 16 bytes) is refused with the
//! tensor's name and the rule it breaks instead of a bare `CUDA_ERROR_INVALID_VALUE`.

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::DeviceRepr;
use mlpc_ir::DType;

/// A `CUtensorMap` as a kernel argument: 128 bytes, 128-byte aligned (CUDA 13), passed by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct TensorMapArg(pub CUtensorMap);

// SAFETY: a `CUtensorMap` is plain bytes that the kernel takes by value (`const
// __grid_constant__ mlpc::TensorMap`, the same size and alignment).
unsafe impl DeviceRepr for TensorMapArg {}

/// What a tensor map describes: a row-major matrix in device memory and the box the kernel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MapRequest {
    pub address: u64,
    pub dtype: DType,
    pub rows: u64,
    pub cols: u64,
    /// Elements from one row to the next.
    pub row_stride: u64,
    pub box_rows: u32,
    pub box_cols: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorMapError {
    #[error("its address {0:#x} is not a multiple of 16 bytes, which the copy engine (TMA) needs")]
    Address(u64),
    #[error(
        "its row stride of {stride} elements ({bytes} bytes) is not a multiple of 16 bytes, which \
         the copy engine (TMA) needs"
    )]
    Stride { stride: u64, bytes: u64 },
    #[error("its {what} ({value}) exceeds what a tensor map can describe ({limit})")]
    TooLarge {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error(
        "the kernel's box of {rows} x {cols} elements is not one a swizzled tensor map can read \
         (rows of 32, 64 or 128 bytes, at most 256 of them)"
    )]
    Box { rows: u32, cols: u32 },
    #[error("cuTensorMapEncodeTiled failed: {}", crate::device::describe_driver_error(&cudarc::driver::DriverError(*.0)))]
    Driver(sys::CUresult),
}

impl MapRequest {
    /// Checks the request against the copy engine's rules (CUDA driver API,
    /// `cuTensorMapEncodeTiled`): 16-byte aligned address, row stride a multiple of 16 bytes and
    /// below 2^40, box dims 1..=256 with rows of 32, 64 or 128 bytes (the swizzle modes);
    /// and dims below 2^31, which the kernels' signed 32-bit box coordinates can reach.
    /// The row stride in bytes the map is encoded with: the request's, which `check` keeps a
    /// multiple of 16 below 2^40 wherever there are two rows or more. A single row's stride is
    /// unused, and any multiple of 16 below 2^40 satisfies the driver.
    fn encoded_stride(&self) -> u64 {
        let bytes = self
            .row_stride
            .saturating_mul(self.dtype.size_bytes() as u64);
        if self.rows > 1 {
            bytes
        } else {
            bytes.clamp(16, (1 << 40) - 16).next_multiple_of(16)
        }
    }

    pub fn check(&self) -> Result<(), TensorMapError> {
        let elem = self.dtype.size_bytes() as u64;
        if !self.address.is_multiple_of(16) {
            return Err(TensorMapError::Address(self.address));
        }
        let bytes = self.row_stride.saturating_mul(elem);
        // One row needs no stride; every other matrix needs a 16-byte multiple.
        if self.rows > 1 && !bytes.is_multiple_of(16) {
            return Err(TensorMapError::Stride {
                stride: self.row_stride,
                bytes,
            });
        }
        if bytes >= 1 << 40 {
            return Err(TensorMapError::TooLarge {
                what: "row stride in bytes",
                value: bytes,
                limit: 1 << 40,
            });
        }
        // The driver takes dims up to 2^32, but the kernels address boxes with signed 32-bit
        // coordinates (`cp.async.bulk.tensor`'s operands).
        for (what, value) in [("row count", self.rows), ("column count", self.cols)] {
            if value > i32::MAX as u64 {
                return Err(TensorMapError::TooLarge {
                    what,
                    value,
                    limit: i32::MAX as u64,
                });
            }
        }
        let ok_box = |d: u32| (1..=256).contains(&d);
        if !ok_box(self.box_rows) || self.swizzle().is_none() {
            return Err(TensorMapError::Box {
                rows: self.box_rows,
                cols: self.box_cols,
            });
        }
        Ok(())
    }

    /// The swizzle of the box's rows: the mode whose span is exactly one box row (32, 64 or 128
    /// bytes), so that the copy engine writes the K-major swizzled layout the kernels' wgmma
    /// descriptors name.
    fn swizzle(&self) -> Option<CUtensorMapSwizzle> {
        match u64::from(self.box_cols) * self.dtype.size_bytes() as u64 {
            32 => Some(CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B),
            64 => Some(CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B),
            128 => Some(CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B),
            _ => None,
        }
    }

    /// Encodes the map: 2-D, dims (cols, rows) innermost first, the swizzle of the box's rows
    /// (`swizzle`), zero fill
    /// outside the matrix, L2 promotion of 256 bytes. An empty dimension is encoded as 1: a
    /// kernel with nothing to read along it issues no copy.
    pub fn encode(&self) -> Result<TensorMapArg, TensorMapError> {
        self.check()?;
        let swizzle = self.swizzle().ok_or(TensorMapError::Box {
            rows: self.box_rows,
            cols: self.box_cols,
        })?;
        let dtype = match self.dtype {
            DType::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        };
        let dims = [self.cols.max(1), self.rows.max(1)];
        let strides = [self.encoded_stride()];
        let boxes = [self.box_cols, self.box_rows];
        let element_strides = [1u32, 1];
        let mut map = CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer addresses a live local array of the length the rank (2) asks
        // for; the driver only reads them and writes `map`. The address is a device address the
        // copy engine reads at launch time, not now.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                2,
                self.address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(TensorMapError::Driver(r));
        }
        Ok(TensorMapArg(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> MapRequest {
        MapRequest {
            address: 0x7f00_0000_0000,
            dtype: DType::Bf16,
            rows: 8192,
            cols: 768,
            row_stride: 768,
            box_rows: 128,
            box_cols: 64,
        }
    }

    #[test]
    fn every_encoded_stride_is_a_multiple_of_16_below_2_40() {
        // A single row of 2^40 - 2 bytes' stride passes `check` (the stride is unused) and was
        // encoded as 2^40, which the driver refuses.
        assert_eq!(req().encoded_stride(), 1536);
        for (rows, row_stride) in [(1, 3), (1, 0), (0, 5), (1, (1 << 39) - 1), (1, u64::MAX)] {
            let r = MapRequest {
                rows,
                row_stride,
                ..req()
            };
            let s = r.encoded_stride();
            assert!(
                s.is_multiple_of(16) && (16..1 << 40).contains(&s),
                "{rows} x {row_stride}: {s}"
            );
        }
    }

    #[test]
    fn the_copy_engines_rules_are_checked_before_the_driver() {
        assert_eq!(req().check(), Ok(()));
        let misaligned = MapRequest {
            address: 0x7f00_0000_0008,
            ..req()
        };
        assert_eq!(
            misaligned.check(),
            Err(TensorMapError::Address(0x7f00_0000_0008))
        );
        let odd = MapRequest {
            row_stride: 769,
            ..req()
        };
        assert_eq!(
            odd.check(),
            Err(TensorMapError::Stride {
                stride: 769,
                bytes: 1538
            })
        );
        // A single row has no stride to check.
        let one = MapRequest {
            rows: 1,
            row_stride: 13,
            ..req()
        };
        assert_eq!(one.check(), Ok(()));
        let wide_box = MapRequest {
            box_cols: 128,
            ..req()
        };
        assert!(matches!(wide_box.check(), Err(TensorMapError::Box { .. })));
        let tall_box = MapRequest {
            box_rows: 512,
            ..req()
        };
        assert!(matches!(tall_box.check(), Err(TensorMapError::Box { .. })));
        let f32_box = MapRequest {
            dtype: DType::F32,
            ..req()
        };
        assert!(matches!(f32_box.check(), Err(TensorMapError::Box { .. })));
        // Rows of 64 and 32 bytes take the 64- and 32-byte swizzles; 48 bytes has no mode.
        for (cols, swizzle) in [
            (32, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B),
            (16, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B),
            (64, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B),
        ] {
            let r = MapRequest {
                box_cols: cols,
                ..req()
            };
            assert_eq!((r.check(), r.swizzle()), (Ok(()), Some(swizzle)));
        }
        let odd_box = MapRequest {
            box_cols: 24,
            ..req()
        };
        assert!(matches!(odd_box.check(), Err(TensorMapError::Box { .. })));
        let huge = MapRequest {
            rows: 1 << 31,
            ..req()
        };
        assert!(matches!(
            huge.check(),
            Err(TensorMapError::TooLarge {
                what: "row count",
                ..
            })
        ));
    }

    #[test]
    fn the_argument_has_the_kernels_size_and_alignment() {
        assert_eq!(std::mem::size_of::<TensorMapArg>(), 128);
        assert_eq!(std::mem::align_of::<TensorMapArg>(), 128);
    }
}
