//! A structural check of a CUBIN before anything hands it to the driver.
//!
//! `cuModuleLoadData` takes a pointer and no length: an empty or truncated image (a damaged
//! cache entry, a compiled directory copied in part) would be read past its end. A CUBIN is a
//! 64-bit little-endian ELF file for the CUDA machine; this checks its header and that every
//! program header, section header and section it describes lies within the bytes at hand.

/// `EM_CUDA`, the ELF machine of NVIDIA GPU code.
const EM_CUDA: u16 = 190;
/// `SHT_NOBITS`: a section that occupies no bytes of the file.
const SHT_NOBITS: u32 = 8;
const HEADER_BYTES: usize = 64;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// `Ok` when `image` is a whole CUBIN as far as its ELF headers tell; otherwise what is wrong.
pub fn check_cubin(image: &[u8]) -> Result<(), String> {
    let len = image.len() as u64;
    if image.len() < HEADER_BYTES {
        return Err(format!(
            "{len} bytes, too short for an ELF header ({HEADER_BYTES} bytes)"
        ));
    }
    if image[..4] != [0x7f, b'E', b'L', b'F'] {
        return Err("not an ELF file".into());
    }
    if image[4] != 2 || image[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let machine = u16_at(image, 18);
    if machine != EM_CUDA {
        return Err(format!("ELF machine {machine}, not CUDA ({EM_CUDA})"));
    }
    // A table of `count` entries of `size` bytes at `offset` must lie within the file.
    let table = |what: &str, offset: u64, size: u16, count: u16| -> Result<(), String> {
        let end = u64::from(size)
            .checked_mul(u64::from(count))
            .and_then(|n| n.checked_add(offset));
        match end {
            Some(end) if end <= len => Ok(()),
            _ => Err(format!(
                "truncated: its {what} ({count} of {size} bytes at {offset}) end past its {len} bytes"
            )),
        }
    };
    let (phoff, phentsize, phnum) = (
        u64_at(image, 0x20),
        u16_at(image, 0x36),
        u16_at(image, 0x38),
    );
    let (shoff, shentsize, shnum) = (
        u64_at(image, 0x28),
        u16_at(image, 0x3a),
        u16_at(image, 0x3c),
    );
    table("program headers", phoff, phentsize, phnum)?;
    table("section headers", shoff, shentsize, shnum)?;
    if shnum > 0 && shentsize < 64 {
        return Err(format!("section headers of {shentsize} bytes, not 64"));
    }
    for i in 0..u64::from(shnum) {
        // In bounds: the table check above covers every header.
        let h = (shoff + i * u64::from(shentsize)) as usize;
        if u32_at(image, h + 4) == SHT_NOBITS {
            continue;
        }
        let (offset, size) = (u64_at(image, h + 0x18), u64_at(image, h + 0x20));
        if offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(format!(
                "truncated: section {i} ({size} bytes at {offset}) ends past its {len} bytes"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal image: the ELF header and one section of 16 bytes after it, described by a
    /// section header table at the end.
    fn image() -> Vec<u8> {
        let mut b = vec![0u8; 64 + 16 + 2 * 64];
        b[..4].copy_from_slice(&[0x7f, b'E', b'L', b'F']);
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        b[0x28..0x30].copy_from_slice(&80u64.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        // Section 1: PROGBITS, 16 bytes at 64.
        let h = 80 + 64;
        b[h + 4..h + 8].copy_from_slice(&1u32.to_le_bytes());
        b[h + 0x18..h + 0x20].copy_from_slice(&64u64.to_le_bytes());
        b[h + 0x20..h + 0x28].copy_from_slice(&16u64.to_le_bytes());
        b
    }

    #[test]
    fn whole_images_pass_and_damaged_ones_say_why() {
        let good = image();
        assert_eq!(check_cubin(&good), Ok(()));
        for cut in [0, 10, 63, 64, 100, good.len() - 1] {
            let e = check_cubin(&good[..cut]).unwrap_err();
            assert!(
                e.contains("too short") || e.contains("truncated"),
                "{cut}: {e}"
            );
        }
        let mut other = good.clone();
        other[18] = 62; // x86-64
        assert!(check_cubin(&other).unwrap_err().contains("not CUDA"));
        let mut text = good.clone();
        text[0] = b'{';
        assert_eq!(check_cubin(&text).unwrap_err(), "not an ELF file");
        // A section whose data lies past the end, with the headers intact.
        let mut past = good.clone();
        let h = 80 + 64;
        past[h + 0x20..h + 0x28].copy_from_slice(&1000u64.to_le_bytes());
        assert!(check_cubin(&past).unwrap_err().contains("section 1"));
        // NOBITS sections take no bytes of the file.
        past[h + 4..h + 8].copy_from_slice(&SHT_NOBITS.to_le_bytes());
        assert_eq!(check_cubin(&past), Ok(()));
    }
}
