//! Resource usage of a compiled entry, read from the ptxas lines of the NVRTC log (compiled with
//! `--ptxas-options=-v`):
//!
//! ```text
//! ptxas info    : Compiling entry function 'k' for 'sm_90'
//! ptxas info    : Function properties for k
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 128 registers, used 1 barriers, 392 bytes cmem[0]
//! ```

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub registers: u32,
    /// Per-thread stack frame (local memory) in bytes.
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory in bytes (dynamic shared memory is in the launch description).
    pub static_smem_bytes: u32,
    pub barriers: u32,
}

impl Resources {
    /// Whether the entry uses local memory at all (a stack frame or spills).
    pub fn uses_local_memory(&self) -> bool {
        self.stack_frame_bytes > 0 || self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// The resources of `entry` in `log`, or `None` when the log has no `Used ... registers` line for
/// it.
pub fn parse(log: &str, entry: &str) -> Option<Resources> {
    let mut current: Option<&str> = None;
    let mut res = Resources::default();
    let mut found = false;
    for line in log.lines() {
        let Some((_, rest)) = line.split_once("ptxas") else {
            continue;
        };
        if let Some(name) = between(rest, "Compiling entry function '", "'") {
            current = Some(name);
            continue;
        }
        if let Some(name) = rest.split("Function properties for ").nth(1) {
            current = Some(name.trim());
            continue;
        }
        if current != Some(entry) {
            continue;
        }
        for item in rest
            .trim_start_matches([' ', 'i', 'n', 'f', 'o', ':', '.'])
            .split(',')
        {
            let item = item.trim();
            let (value, what) = leading_number(item.trim_start_matches("Used "));
            let Some(value) = value else { continue };
            if what.starts_with("registers") {
                res.registers = value;
                found = true;
            } else if what.starts_with("bytes stack frame") {
                res.stack_frame_bytes = value;
            } else if what.starts_with("bytes spill stores") {
                res.spill_store_bytes = value;
            } else if what.starts_with("bytes spill loads") {
                res.spill_load_bytes = value;
            } else if what.starts_with("bytes smem") {
                res.static_smem_bytes = value;
            } else if what.starts_with("barriers") {
                res.barriers = value;
            }
        }
    }
    found.then_some(res)
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &s[s.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

/// `"128 registers"` -> `(Some(128), "registers")`; `"used 1 barriers"` -> `(Some(1), "barriers")`.
fn leading_number(item: &str) -> (Option<u32>, &str) {
    let item = item.trim_start_matches("used ").trim();
    let end = item
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(item.len());
    (item[..end].parse().ok(), item[end..].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 204 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 392 bytes cmem[0]
ptxas info    : Compile time = 148.694 ms
ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers
";

    #[test]
    fn reads_each_entry_separately() {
        let k1 = parse(LOG, "k1").unwrap();
        assert_eq!(
            k1,
            Resources {
                registers: 128,
                barriers: 1,
                ..Resources::default()
            }
        );
        assert!(!k1.uses_local_memory());
        let k2 = parse(LOG, "k2").unwrap();
        assert_eq!(
            k2,
            Resources {
                registers: 255,
                stack_frame_bytes: 16,
                spill_store_bytes: 8,
                spill_load_bytes: 12,
                static_smem_bytes: 1024,
                barriers: 1,
            }
        );
        assert!(k2.uses_local_memory());
        assert_eq!(parse(LOG, "k3"), None);
    }
}
