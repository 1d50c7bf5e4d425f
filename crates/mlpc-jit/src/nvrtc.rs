//! One NVRTC compilation: source and in-memory headers in, CUBIN, PTX and log out.

use crate::JitError;
use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};
use std::ffi::{c_char, c_int, CString};

/// The products of a successful compilation.
pub struct Output {
    pub cubin: Vec<u8>,
    pub ptx: String,
    pub log: String,
}

/// Destroys the program when dropped, on every path.
struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn check(kernel: &str, call: &'static str, rc: nvrtcResult) -> Result<(), JitError> {
    if rc == nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(JitError::Nvrtc {
            kernel: kernel.to_string(),
            call,
            code: format!("{rc:?}"),
        })
    }
}

fn cstring(kernel: &str, what: &str, s: &str) -> Result<CString, JitError> {
    CString::new(s).map_err(|_| JitError::NulByte {
        kernel: kernel.to_string(),
        what: what.to_string(),
    })
}

/// Compiles `source` (named `file` in diagnostics) with `headers` and `options`. NVRTC must be
/// loaded ([`crate::ensure_nvrtc`]).
pub fn compile(
    kernel: &str,
    file: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Output, JitError> {
    let src = cstring(kernel, "source", source)?;
    let name = cstring(kernel, "file name", file)?;
    let header_names = headers
        .iter()
        .map(|(n, _)| cstring(kernel, &format!("header name `{n}`"), n))
        .collect::<Result<Vec<_>, _>>()?;
    let header_texts = headers
        .iter()
        .map(|(n, t)| cstring(kernel, &format!("header `{n}`"), t))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = options
        .iter()
        .map(|o| cstring(kernel, &format!("option `{o}`"), o))
        .collect::<Result<Vec<_>, _>>()?;
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();

    let mut raw: nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a live NUL-terminated string for the duration of the call;
    // the arrays have `headers.len()` entries.
    let rc = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    };
    check(kernel, "nvrtcCreateProgram", rc)?;
    let prog = Program(raw);

    // SAFETY: a valid program and `opt_ptrs.len()` live option strings.
    let rc =
        unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = program_log(kernel, &prog)?;
    if rc == nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Err(JitError::Compile {
            kernel: kernel.to_string(),
            log,
        });
    }
    check(kernel, "nvrtcCompileProgram", rc)?;

    let mut size = 0usize;
    // SAFETY: a compiled program; the buffer has the size NVRTC reported.
    let cubin = unsafe {
        check(
            kernel,
            "nvrtcGetCUBINSize",
            sys::nvrtcGetCUBINSize(prog.0, &mut size),
        )?;
        let mut buf = vec![0u8; size];
        check(
            kernel,
            "nvrtcGetCUBIN",
            sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char),
        )?;
        buf
    };
    // SAFETY: as above.
    let ptx = unsafe {
        check(
            kernel,
            "nvrtcGetPTXSize",
            sys::nvrtcGetPTXSize(prog.0, &mut size),
        )?;
        let mut buf = vec![0u8; size];
        check(
            kernel,
            "nvrtcGetPTX",
            sys::nvrtcGetPTX(prog.0, buf.as_mut_ptr() as *mut c_char),
        )?;
        c_text(buf)
    };
    Ok(Output { cubin, ptx, log })
}

fn program_log(kernel: &str, prog: &Program) -> Result<String, JitError> {
    let mut size = 0usize;
    // SAFETY: a valid program; the buffer has the size NVRTC reported.
    unsafe {
        check(
            kernel,
            "nvrtcGetProgramLogSize",
            sys::nvrtcGetProgramLogSize(prog.0, &mut size),
        )?;
        let mut buf = vec![0u8; size];
        check(
            kernel,
            "nvrtcGetProgramLog",
            sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char),
        )?;
        Ok(c_text(buf))
    }
}

/// A NUL-terminated buffer as text.
fn c_text(mut buf: Vec<u8>) -> String {
    if let Some(end) = buf.iter().position(|&b| b == 0) {
        buf.truncate(end);
    }
    String::from_utf8_lossy(&buf).into_owned()
}
