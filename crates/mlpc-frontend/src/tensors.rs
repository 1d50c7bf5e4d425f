//! Reading and writing safetensors files.
//!
//! The format: 8 bytes holding the header length `N` (little-endian u64), `N` bytes of JSON mapping
//! each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the
//! data that follows the header; an optional `"__metadata__"` maps strings to strings), then the
//! data. The reader is our own so that every problem names the tensor it concerns (a truncated file
//! says which tensor lies past its end). The writer is our own too, so that a file too large for
//! memory is an error rather than an abort; the tests check that the `safetensors` crate (the
//! reference implementation) reads what it writes, and that it reads what that crate writes.

use crate::error::{FrontendError, TensorFileError};
use crate::json;
use mlpc_ir::{DType, HostTensor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Headers larger than this are refused (as the reference implementation does).
const MAX_HEADER: u64 = 100 * 1024 * 1024;

/// Reads every tensor of a safetensors file. Tensors must be F32, F16 or BF16.
pub fn read_tensors(path: &Path) -> Result<BTreeMap<String, HostTensor>, FrontendError> {
    let file = TensorFile::open(path)?;
    file.names()
        .filter_map(|name| Some((name.clone(), file.get(name)?)))
        .map(|(name, t)| Ok((name, t?)))
        .collect()
}

/// Reads the tensors of a safetensors file whose names are in `wanted` (F32, F16 or BF16), and
/// names the file's other tensors, which are not read (nor their dtypes checked): for a caller
/// that refuses them in words of its own, e.g. as unexpected inputs.
pub fn read_tensors_named(
    path: &Path,
    wanted: &[&str],
) -> Result<(BTreeMap<String, HostTensor>, Vec<String>), FrontendError> {
    let file = TensorFile::open(path)?;
    let mut read = BTreeMap::new();
    let mut others = Vec::new();
    for name in file.names() {
        if !wanted.contains(&name.as_str()) {
            others.push(name.clone());
        } else if let Some(t) = file.get(name) {
            read.insert(name.clone(), t?);
        }
    }
    Ok((read, others))
}

/// Parses the bytes of a safetensors file; `path` only names the file in errors. Every tensor
/// must be F32, F16 or BF16.
pub fn parse_tensors(
    bytes: &[u8],
    path: &Path,
) -> Result<BTreeMap<String, HostTensor>, FrontendError> {
    let fail = |error| FrontendError::Tensors {
        path: path.to_path_buf(),
        error,
    };
    let index = index(bytes).map_err(fail)?;
    index
        .iter()
        .map(|(name, e)| {
            Ok((
                name.clone(),
                e.tensor(name, bytes, None, |_| {}).map_err(fail)?,
            ))
        })
        .collect()
}

/// A safetensors file opened for loading some of its tensors: the header is checked whole (every
/// entry's offsets and size), but data is copied, and dtypes are required to be F32, F16 or BF16,
/// only for the tensors taken. So a PyTorch state_dict holding integer buffers beside the weights
/// loads, and unused tensors cost no memory.
pub(crate) struct TensorFile {
    path: std::path::PathBuf,
    /// `None` for an empty file, which cannot be mapped on every platform.
    map: Option<memmap2::Mmap>,
    index: BTreeMap<String, Entry>,
}

impl TensorFile {
    /// Maps the file without checking its header.
    fn map(path: &Path) -> Result<TensorFile, FrontendError> {
        let read_err = |source| FrontendError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if meta.is_dir() {
            // Mapping a directory fails with "No such device".
            return Err(read_err(std::io::Error::other(
                "it is a directory, expected a safetensors file",
            )));
        }
        let len = meta.len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only and tensors are copied out of it. If another process
            // truncates the file meanwhile, reads could fault, as with any mapped file; model files
            // are not expected to change while they are being loaded.
            Some(unsafe { memmap2::Mmap::map(&file) }.map_err(read_err)?)
        };
        Ok(TensorFile {
            path: path.to_path_buf(),
            map,
            index: BTreeMap::new(),
        })
    }

    /// Maps the file and checks its header.
    pub(crate) fn open(path: &Path) -> Result<TensorFile, FrontendError> {
        let mut f = TensorFile::map(path)?;
        f.index = index(f.bytes()).map_err(|error| FrontendError::Tensors {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(f)
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The names of all tensors in the file.
    pub(crate) fn names(&self) -> impl Iterator<Item = &String> {
        self.index.keys()
    }

    /// The shape of the tensor `name`, checked as [`TensorFile::get`] checks it but without
    /// reading its data; `None` if the file has no such tensor.
    pub(crate) fn shape(&self, name: &str) -> Option<Result<Vec<usize>, FrontendError>> {
        let e = self.index.get(name)?;
        Some(
            e.dtype(name)
                .map(|_| e.shape.clone())
                .map_err(|error| FrontendError::Tensors {
                    path: self.path.clone(),
                    error,
                }),
        )
    }

    /// Copies out the tensor `name`; `None` if the file has no such tensor.
    pub(crate) fn get(&self, name: &str) -> Option<Result<HostTensor, FrontendError>> {
        self.get_as(name, None)
    }

    /// Copies out the tensor `name` converted to `to` where given (rounding to nearest even);
    /// `None` if the file has no such tensor.
    pub(crate) fn get_as(
        &self,
        name: &str,
        to: Option<DType>,
    ) -> Option<Result<HostTensor, FrontendError>> {
        let e = self.index.get(name)?;
        Some(
            e.tensor(name, self.bytes(), to, |r| self.release(r))
                .map_err(|error| FrontendError::Tensors {
                    path: self.path.clone(),
                    error,
                }),
        )
    }

    /// Drops this process's pages of `range` of the file (whole pages, those it shares with a
    /// neighbour included): the values there were copied out, and the mapped pages would
    /// otherwise count in the resident memory beside the copy until the file is closed. A
    /// later read of them faults them in again from the file, unchanged. Only a hint: a
    /// failure changes nothing.
    fn release(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Some(map) = &self.map {
            // SAFETY: the map is a shared, read-only mapping of the file (`Mmap::map`), so
            // dropping its pages loses nothing: every later access, through any slice of it,
            // reads the file's bytes again. No slice of the map outlives the copy made above.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}

fn info_err(tensor: &str, message: impl Into<String>) -> TensorFileError {
    TensorFileError::TensorInfo {
        tensor: tensor.to_string(),
        message: message.into(),
    }
}

/// One tensor of the header, checked against the file's size.
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: std::ops::Range<usize>,
}

impl Entry {
    /// The entry's dtype, if it is one a weight may have.
    fn dtype(&self, name: &str) -> Result<DType, TensorFileError> {
        match self.dtype.as_str() {
            "F32" => Ok(DType::F32),
            "F16" => Ok(DType::F16),
            "BF16" => Ok(DType::Bf16),
            other => Err(TensorFileError::DType {
                tensor: name.to_string(),
                dtype: other.to_string(),
            }),
        }
    }

    /// The tensor, converted to `to` where given (straight from the file's bytes).
    /// `read` is called with each range of the file (absolute) once its values are copied out.
    fn tensor(
        &self,
        name: &str,
        bytes: &[u8],
        to: Option<DType>,
        mut read: impl FnMut(std::ops::Range<usize>),
    ) -> Result<HostTensor, TensorFileError> {
        /// Elements copied out between two calls of `read`: 4-8 MiB.
        const CHUNK_ELEMENTS: usize = 1 << 21;
        let dtype = self.dtype(name)?;
        let data = bytes
            .get(self.range.clone())
            .ok_or_else(|| info_err(name, "data lies outside the file"))?;
        let at = self.range.start;
        HostTensor::from_le_bytes_as_by_chunks(
            dtype,
            self.shape.clone(),
            data,
            to.unwrap_or(dtype),
            CHUNK_ELEMENTS,
            |r| read(at + r.start..at + r.end),
        )
        .map_err(|e| info_err(name, e.to_string()))
    }
}

/// Bits per element of every dtype the format defines (the sub-byte ones pack their elements);
/// `None` for a dtype this reader does not know, whose size is then not checked.
fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// Reads and checks the header: every entry well-formed, its size matching dtype and shape (where
/// the dtype is one the format defined when this reader was written: a tensor of a newer dtype is
/// listed, and an error only when taken), and the entries' data covering the data that follows
/// the header exactly, without overlaps or gaps, as the format requires.
fn index(bytes: &[u8]) -> Result<BTreeMap<String, Entry>, TensorFileError> {
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(TensorFileError::TooShort { len: bytes.len() });
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(len_bytes);
    let header_len = u64::from_le_bytes(n);
    let available = bytes.len() - 8;
    if header_len > MAX_HEADER || header_len > available as u64 {
        return Err(TensorFileError::HeaderLength {
            header: header_len,
            available,
        });
    }
    let header_end = 8 + header_len as usize;
    let header =
        std::str::from_utf8(&bytes[8..header_end]).map_err(|e| TensorFileError::Header {
            message: format!("not UTF-8: {e}"),
        })?;
    let header = json::parse_strict(header).map_err(|e| TensorFileError::Header {
        message: format!("not valid JSON: {e}"),
    })?;
    let Value::Object(entries) = header else {
        return Err(TensorFileError::Header {
            message: format!("expected an object, found {}", json::describe(&header)),
        });
    };
    let data_len = bytes.len() - header_end;
    let mut out = BTreeMap::new();
    for (name, info) in &entries {
        if name == "__metadata__" {
            match info {
                Value::Object(m) if m.values().all(Value::is_string) => continue,
                _ => {
                    return Err(TensorFileError::Header {
                        message: "`__metadata__`: expected an object of strings".into(),
                    })
                }
            }
        }
        let Value::Object(info) = info else {
            return Err(info_err(
                name,
                format!("expected an object, found {}", json::describe(info)),
            ));
        };
        for k in info.keys() {
            if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
                return Err(info_err(name, format!("unknown key `{k}`")));
            }
        }
        let dtype = match info.get("dtype") {
            Some(Value::String(s)) => s.as_str(),
            Some(v) => {
                return Err(info_err(
                    name,
                    format!("dtype: expected a string, found {}", json::describe(v)),
                ))
            }
            None => return Err(info_err(name, "missing `dtype`")),
        };
        let shape: Vec<usize> = match info.get("shape") {
            Some(Value::Array(dims)) => dims
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| info_err(name, "shape: expected non-negative integers"))?,
            _ => return Err(info_err(name, "missing or invalid `shape`")),
        };
        let (begin, end) = match info.get("data_offsets") {
            Some(Value::Array(o)) if o.len() == 2 => match (o[0].as_u64(), o[1].as_u64()) {
                (Some(b), Some(e)) if b <= e => (b, e),
                _ => {
                    return Err(info_err(
                        name,
                        "data_offsets: expected [begin, end], begin <= end",
                    ))
                }
            },
            _ => return Err(info_err(name, "missing or invalid `data_offsets`")),
        };
        if let Some(bits) = dtype_bits(dtype) {
            let overflow =
                || info_err(name, format!("the byte size of {dtype}{shape:?} overflows"));
            let total_bits = shape
                .iter()
                .try_fold(bits, |a, &d| a.checked_mul(d as u64))
                .ok_or_else(overflow)?;
            if total_bits % 8 != 0 {
                return Err(info_err(
                    name,
                    format!("{dtype}{shape:?} is not a whole number of bytes"),
                ));
            }
            let expected = total_bits / 8;
            if end - begin != expected {
                return Err(TensorFileError::Size {
                    tensor: name.clone(),
                    dtype: dtype.to_string(),
                    shape,
                    expected,
                    actual: end - begin,
                });
            }
        }
        if end > data_len as u64 {
            return Err(TensorFileError::Truncated {
                tensor: name.clone(),
                begin,
                end,
                len: data_len,
            });
        }
        let range = header_end + begin as usize..header_end + end as usize;
        out.insert(
            name.clone(),
            Entry {
                dtype: dtype.to_string(),
                shape,
                range,
            },
        );
    }
    check_layout(&out, header_end, data_len)?;
    Ok(out)
}

/// The format's layout rule: the tensors' byte ranges, in order of their offsets, tile the data
/// from its first byte to the file's end. Two tensors sharing bytes, bytes no tensor owns, or
/// bytes after the last tensor mean a damaged or hand-made file whose tensors cannot be trusted.
fn check_layout(
    entries: &BTreeMap<String, Entry>,
    header_end: usize,
    data_len: usize,
) -> Result<(), TensorFileError> {
    let mut ranges: Vec<(&String, std::ops::Range<usize>)> = entries
        .iter()
        .map(|(name, e)| (name, e.range.start - header_end..e.range.end - header_end))
        .collect();
    ranges.sort_by_key(|(name, r)| (r.start, r.end, name.as_str()));
    let mut at = 0usize;
    let mut last: Option<&String> = None;
    for (name, r) in &ranges {
        if r.start < at {
            let other = last.map_or(String::new(), |l| format!("tensor `{l}`'s"));
            return Err(TensorFileError::Layout {
                message: format!(
                    "tensor `{name}` (data bytes {}..{}) overlaps {other} bytes before {at}",
                    r.start, r.end
                ),
            });
        }
        if r.start > at {
            return Err(TensorFileError::Layout {
                message: format!(
                    "data bytes {at}..{} belong to no tensor (the next is `{name}`)",
                    r.start
                ),
            });
        }
        at = r.end;
        last = Some(name);
    }
    if at != data_len {
        return Err(TensorFileError::Layout {
            message: format!(
                "the last {} byte(s) of the data ({at}..{data_len}) belong to no tensor",
                data_len - at
            ),
        });
    }
    Ok(())
}

/// A safetensors file about to be written: its header, made and checked at once, and the
/// tensors whose bytes follow it, borrowed. [`SafetensorsFile::write_to`] streams the file, so
/// that writing it needs no second copy of the tensors in memory.
pub struct SafetensorsFile<'a> {
    /// The header's length (8 bytes, little-endian) and the header, padded with spaces to a
    /// multiple of 8 bytes, as the reference writer aligns the data.
    header: Vec<u8>,
    /// In name order, the order of their data.
    tensors: Vec<&'a HostTensor>,
    len: u64,
}

impl<'a> SafetensorsFile<'a> {
    /// The file holding `tensors` (in name order; a name given twice is written once, with its
    /// last tensor). A tensor named `__metadata__` is an error: the format reserves the name.
    pub fn new(
        tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>,
    ) -> Result<SafetensorsFile<'a>, TensorFileError> {
        let tensors: BTreeMap<&str, &HostTensor> = tensors.into_iter().collect();
        if tensors.contains_key("__metadata__") {
            // The file written would be unreadable.
            return Err(TensorFileError::Serialize {
                message: "a tensor named `__metadata__`: the safetensors format reserves the \
                          name for its header's metadata"
                    .into(),
            });
        }
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        for (name, t) in &tensors {
            let end = offset + t.bytes().len();
            let dtype = match t.dtype() {
                DType::F32 => "F32",
                DType::F16 => "F16",
                DType::Bf16 => "BF16",
            };
            header.insert(
                name.to_string(),
                serde_json::json!({ "dtype": dtype, "shape": t.shape(), "data_offsets": [offset, end] }),
            );
            offset = end;
        }
        let text = serde_json::Value::Object(header).to_string().into_bytes();
        let padded = text.len().next_multiple_of(8);
        let mut header = Vec::with_capacity(8 + padded);
        header.extend_from_slice(&(padded as u64).to_le_bytes());
        header.extend_from_slice(&text);
        header.resize(8 + padded, b' ');
        let len = (header.len() + offset) as u64;
        Ok(SafetensorsFile {
            header,
            tensors: tensors.into_values().collect(),
            len,
        })
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty: never (its header is at least 8 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes the file to `out`, the header and then each tensor's bytes, as they are.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        out.write_all(&self.header)?;
        for t in &self.tensors {
            out.write_all(t.bytes())?;
        }
        Ok(())
    }

    /// The file's bytes, allocated at once: where they do not fit in memory, an error rather
    /// than an abort.
    pub fn to_bytes(&self) -> Result<Vec<u8>, TensorFileError> {
        let total = self.len;
        let mut out = Vec::new();
        usize::try_from(total)
            .ok()
            .and_then(|n| out.try_reserve_exact(n).ok())
            .ok_or_else(|| TensorFileError::Serialize {
                message: format!("the file's {total} bytes do not fit in memory"),
            })?;
        self.write_to(&mut out)
            .map_err(|e| TensorFileError::Serialize {
                message: e.to_string(),
            })?;
        Ok(out)
    }
}

/// The bytes of a safetensors file holding `tensors` ([`SafetensorsFile`]'s rules). The whole
/// file is allocated at once: where it does not fit in memory, an error rather than an abort.
pub fn serialize_tensors<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>,
) -> Result<Vec<u8>, TensorFileError> {
    SafetensorsFile::new(tensors)?.to_bytes()
}

/// Writes `tensors` as a safetensors file. The file appears complete or not at all: the bytes go
/// to a temporary file in the same directory, which is then renamed over `path`. The tensors are
/// streamed into it, not copied into memory first.
pub fn write_tensors(
    path: &Path,
    tensors: &BTreeMap<String, HostTensor>,
) -> Result<(), FrontendError> {
    let file =
        SafetensorsFile::new(tensors.iter().map(|(k, t)| (k.as_str(), t))).map_err(|error| {
            FrontendError::Tensors {
                path: path.to_path_buf(),
                error,
            }
        })?;
    let write_err = |source| FrontendError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        // Otherwise the error would name the temporary file that could not be created.
        return Err(write_err(std::io::Error::other(format!(
            "the directory `{}` does not exist",
            dir.display()
        ))));
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".mlpc-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(write_err)?;
    file.write_to(tmp.as_file_mut()).map_err(write_err)?;
    tmp.as_file().sync_all().map_err(write_err)?;
    tmp.persist(path).map_err(|e| write_err(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor as the reference writer takes it.
    struct View<'a>(&'a HostTensor);

    impl safetensors::View for View<'_> {
        fn dtype(&self) -> safetensors::Dtype {
            match self.0.dtype() {
                DType::F32 => safetensors::Dtype::F32,
                DType::F16 => safetensors::Dtype::F16,
                DType::Bf16 => safetensors::Dtype::BF16,
            }
        }

        fn shape(&self) -> &[usize] {
            self.0.shape()
        }

        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Borrowed(self.0.bytes())
        }

        fn data_len(&self) -> usize {
            self.0.bytes().len()
        }
    }

    #[test]
    fn reads_what_the_reference_writer_writes() {
        let t =
            HostTensor::from_f64(DType::F16, vec![2, 3], &[1.0, 2.0, 3.0, -1.0, 0.5, 8.0]).unwrap();
        let bytes = safetensors::serialize([("w", View(&t))], &None).unwrap();
        let back = parse_tensors(&bytes, Path::new("w")).unwrap();
        assert_eq!(back["w"], t);
    }

    /// The file streamed to a path, its bytes in memory and its announced length agree, and the
    /// reference reader reads every tensor back from it.
    #[test]
    fn the_streamed_file_is_the_serialised_one_and_the_reference_reads_it() {
        let a = HostTensor::from_f64(DType::Bf16, vec![3], &[1.0, -2.0, 0.5]).unwrap();
        let b = HostTensor::from_f64(DType::F32, vec![2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let tensors = BTreeMap::from([("b".to_string(), b), ("a".to_string(), a)]);
        let file = SafetensorsFile::new(tensors.iter().map(|(k, t)| (k.as_str(), t))).unwrap();
        let bytes = file.to_bytes().unwrap();
        assert_eq!(bytes.len() as u64, file.len());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write_tensors(&path, &tensors).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, t) in &tensors {
            let view = reference.tensor(name).unwrap();
            assert_eq!(
                (view.shape(), view.data()),
                (t.shape(), t.bytes()),
                "{name}"
            );
        }
        let named = [("__metadata__", &tensors["a"])];
        let e = SafetensorsFile::new(named).err().unwrap().to_string();
        assert!(e.contains("reserves the name"), "{e}");
    }

    #[test]
    fn header_problems_are_named() {
        assert!(matches!(
            index(&[1, 2]),
            Err(TensorFileError::TooShort { len: 2 })
        ));
        let mut b = 1000u64.to_le_bytes().to_vec();
        b.extend_from_slice(b"{}");
        assert!(matches!(
            index(&b),
            Err(TensorFileError::HeaderLength { header: 1000, .. })
        ));
    }

    /// A file of `header` (JSON) and `data` bytes.
    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend((0..data).map(|i| i as u8));
        b
    }

    #[test]
    fn tensors_of_dtypes_newer_than_the_reader_are_listed_and_refused_only_when_taken() {
        // An fp8 checkpoint's block scales (F8_E8M0), packed 4-bit values (F4), complex
        // buffers (C64) and a dtype no reader knows yet, beside an F32 weight.
        let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
            "s":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[8,12]},
            "q":{"dtype":"F4","shape":[2,3],"data_offsets":[12,15]},
            "c":{"dtype":"C64","shape":[1],"data_offsets":[15,23]},
            "z":{"dtype":"F3_FUTURE","shape":[5],"data_offsets":[23,25]}}"#;
        let bytes = file(header, 25);
        let entries = index(&bytes).unwrap();
        assert_eq!(entries.len(), 5);
        assert!(entries["w"].tensor("w", &bytes, None, |_| {}).is_ok());
        assert!(matches!(
            entries["z"].tensor("z", &bytes, None, |_| {}),
            Err(TensorFileError::DType { .. })
        ));
        // Known dtypes' sizes are still checked, the sub-byte ones' too.
        let header = r#"{"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
        let e = index(&file(header, 2)).err().unwrap().to_string();
        assert_eq!(e, "tensor `q`: F4[3] is not a whole number of bytes");
        let header = r#"{"s":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[0,2]}}"#;
        assert!(matches!(
            index(&file(header, 2)),
            Err(TensorFileError::Size {
                expected: 4,
                actual: 2,
                ..
            })
        ));
    }

    #[test]
    fn tensors_must_tile_the_data_exactly() {
        let t = |name: &str, a: usize, b: usize| {
            format!(
                r#""{name}":{{"dtype":"U8","shape":[{}],"data_offsets":[{a},{b}]}}"#,
                b - a
            )
        };
        let err = |entries: &[String], data: usize| {
            let header = format!("{{{}}}", entries.join(","));
            index(&file(&header, data)).err().map(|e| e.to_string())
        };
        // Well-formed: in any header order, empty tensors included.
        assert_eq!(err(&[t("b", 4, 8), t("e", 4, 4), t("a", 0, 4)], 8), None);
        assert_eq!(err(&[], 0), None);
        // A second tensor over the first one's bytes: reading it would read the first's values.
        assert_eq!(
            err(&[t("a", 0, 8), t("b", 0, 8)], 8).unwrap(),
            "invalid layout: tensor `b` (data bytes 0..8) overlaps tensor `a`'s bytes before 8"
        );
        assert_eq!(
            err(&[t("a", 0, 8), t("b", 4, 12)], 12).unwrap(),
            "invalid layout: tensor `b` (data bytes 4..12) overlaps tensor `a`'s bytes before 8"
        );
        assert_eq!(
            err(&[t("a", 0, 4), t("b", 8, 12)], 12).unwrap(),
            "invalid layout: data bytes 4..8 belong to no tensor (the next is `b`)"
        );
        assert_eq!(
            err(&[t("a", 2, 4)], 4).unwrap(),
            "invalid layout: data bytes 0..2 belong to no tensor (the next is `a`)"
        );
        assert_eq!(
            err(&[t("a", 0, 4)], 20).unwrap(),
            "invalid layout: the last 16 byte(s) of the data (4..20) belong to no tensor"
        );
        assert_eq!(
            err(&[], 3).unwrap(),
            "invalid layout: the last 3 byte(s) of the data (0..3) belong to no tensor"
        );
    }

    #[test]
    fn metadata_maps_strings_to_strings() {
        let ok = r#"{"__metadata__":{"format":"pt","note":""}}"#;
        assert!(index(&file(ok, 0)).is_ok());
        for bad in [
            r#"{"__metadata__":5}"#,
            r#"{"__metadata__":{"step":3}}"#,
            r#"{"__metadata__":null}"#,
        ] {
            assert_eq!(
                index(&file(bad, 0)).err().unwrap().to_string(),
                "invalid header: `__metadata__`: expected an object of strings",
                "{bad}"
            );
        }
    }
}
