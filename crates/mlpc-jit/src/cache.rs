//! The disk cache of compiled kernels: `<dir>/<key>.{cubin,ptx,log}`, where the key is the
//! SHA-256 of everything that determines the output (source, headers, options, architecture,
//! NVRTC version). Entries are written to a temporary name and renamed into place, so a reader
//! sees a whole entry or none.
//!
//! The cache is trimmed only when asked: [`clear`] removes every entry, [`trim`] the least
//! recently used ones until the entries fit a size (after each compilation that stored a kernel
//! too, where **`MLPC_CACHE_MAX_SIZE`** sets one: [`max_size_from_env`]; that trim,
//! [`trim_after_store`], is best effort and never fails the compilation). A hit ([`lookup`])
//! marks its entry as used by setting its `.cubin`'s modification time, so a store or the last
//! hit is an entry's last use. Both remove only what the cache writes (files named
//! `<key>.cubin`, `.ptx` and `.log` for a 64-digit lowercase hex key, and the temporary
//! `<key>.<random>.tmp` files of [`store`]); other files in the directory stay.
//!
//! Other processes may use the directory at the same time. A store holds a shared advisory lock
//! (`flock`) of the directory, [`clear`] and [`trim`] an exclusive one, so a removal never takes
//! a file a store is writing nor leaves half of an entry it is storing; a lookup takes no lock,
//! and one that races with a removal finds an entry missing a file: a miss, never an error. The
//! locks are best effort, like those of the rest of mlpc: where the directory cannot be opened
//! or the file system has no locks, nothing is held.

use crate::JitError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// What one compilation leaves: the CUBIN, the PTX and NVRTC's log.
pub struct Entry {
    pub cubin: Vec<u8>,
    pub ptx: String,
    pub log: String,
}

/// The extensions of an entry's files, in the order [`store`] renames them into place.
const EXTENSIONS: [&str; 3] = ["cubin", "ptx", "log"];

/// The cache key of one compilation.
pub fn key(
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
    arch: &str,
    version: (i32, i32),
) -> String {
    let mut h = Sha256::new();
    // Every field is length-prefixed so that no two inputs hash the same bytes.
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"mlpc-jit kernel cache v1");
    field(source.as_bytes());
    for (name, text) in headers {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    for o in options {
        field(o.as_bytes());
    }
    field(arch.as_bytes());
    field(format!("{}.{}", version.0, version.1).as_bytes());
    hex::encode(h.finalize())
}

/// The cache directory: `MLPC_CACHE_DIR`, else `<user cache dir>/mlpc/kernels`.
pub fn default_dir() -> Result<PathBuf, JitError> {
    // An empty value means the default (not the working directory).
    if let Some(d) = std::env::var_os("MLPC_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir()
        .map(|d| d.join("mlpc").join("kernels"))
        .ok_or(JitError::NoCacheDir)
}

fn paths(dir: &Path, key: &str) -> [PathBuf; 3] {
    EXTENSIONS.map(|ext| dir.join(format!("{key}.{ext}")))
}

/// The entry for `key`, if a complete one exists. Unreadable entries, ones whose CUBIN is not
/// whole ([`crate::check_cubin`]), and ones whose PTX has no `.entry` or whose log no ptxas
/// report (truncated or emptied files: every compile writes both) count as misses, and the next
/// store replaces them. So does an entry that [`clear`] or [`trim`] removes while this reads it:
/// a file gone is a miss, and files read before are whole (removal unlinks, it never truncates).
/// A hit sets the `.cubin`'s modification time to now, its last use for [`trim`]; where that
/// fails (a cache on a read-only file system, or of another user) the hit is a hit all the same.
pub fn lookup(dir: &Path, key: &str) -> Option<Entry> {
    let [cubin, ptx, log] = paths(dir, key);
    let mut cubin_file = File::open(cubin).ok()?;
    let mut cubin = Vec::new();
    cubin_file.read_to_end(&mut cubin).ok()?;
    let entry = Entry {
        cubin: Some(cubin).filter(|c| crate::check_cubin(c).is_ok())?,
        ptx: fs::read_to_string(ptx)
            .ok()
            .filter(|p| p.contains(".entry "))?,
        log: fs::read_to_string(log)
            .ok()
            .filter(|l| l.contains("ptxas"))?,
    };
    let _ = cubin_file.set_modified(SystemTime::now());
    Some(entry)
}

/// `e`, a failure to create `dir`, in words that name the file in its way if there is one
/// (the OS says only "File exists" or "Not a directory").
fn file_in_the_way(dir: &Path, e: std::io::Error) -> std::io::Error {
    match dir.ancestors().find(|a| a.exists() && !a.is_dir()) {
        Some(file) => std::io::Error::new(
            e.kind(),
            format!("`{}` is a file, not a directory", file.display()),
        ),
        None => e,
    }
}

/// Stores `entry` under `key`. The `.log` file is renamed into place last, and [`lookup`] needs
/// all three, so a concurrent reader never sees half an entry. Under the directory's shared lock:
/// [`clear`] and [`trim`] wait for the whole entry.
pub fn store(dir: &Path, key: &str, entry: &Entry) -> Result<(), JitError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JitError::Cache { path, source }
    };
    fs::create_dir_all(dir).map_err(|e| JitError::Cache {
        path: dir.to_path_buf(),
        source: file_in_the_way(dir, e),
    })?;
    let _lock = DirLock::shared(dir);
    let [cubin, ptx, log] = paths(dir, key);
    let contents: [(&PathBuf, &[u8]); 3] = [
        (&cubin, &entry.cubin),
        (&ptx, entry.ptx.as_bytes()),
        (&log, entry.log.as_bytes()),
    ];
    for (path, bytes) in contents {
        // A temporary file created exclusively in the same directory, then renamed into place:
        // two threads, or two processes (also in other PID namespaces, sharing the directory),
        // storing the same kernel never write the same file.
        // Named `<key>.<random>.tmp`: [`temporary_name`] recognises it.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!("{key}."))
            .suffix(TEMPORARY_SUFFIX)
            .tempfile_in(dir)
            .map_err(err(dir))?;
        tmp.write_all(bytes).map_err(err(tmp.path()))?;
        tmp.persist(path).map_err(|e| JitError::Cache {
            path: path.clone(),
            source: e.error,
        })?;
    }
    Ok(())
}

/// The suffix of [`store`]'s temporary files.
const TEMPORARY_SUFFIX: &str = ".tmp";

/// Whether `s` is a cache key: 64 lowercase hex digits, as [`key`] writes them.
fn is_key(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A file name the cache writes.
#[derive(Debug, PartialEq, Eq)]
enum CacheFile<'a> {
    /// `<key>.cubin`, `<key>.ptx` or `<key>.log`.
    Entry { key: &'a str, ext: &'a str },
    /// `<key>.<random>.tmp`: a file [`store`] is writing, or left behind when its process died.
    Temporary,
}

/// What `name` is to the cache, if it is a name the cache writes.
fn cache_file(name: &str) -> Option<CacheFile<'_>> {
    let (key, rest) = name.split_at_checked(64)?;
    let rest = rest.strip_prefix('.').filter(|_| is_key(key))?;
    if let Some(ext) = EXTENSIONS.into_iter().find(|&e| e == rest) {
        return Some(CacheFile::Entry { key, ext });
    }
    // tempfile's random part: a few ASCII letters and digits.
    let random = rest.strip_suffix(TEMPORARY_SUFFIX)?;
    let plausible =
        (1..=32).contains(&random.len()) && random.bytes().all(|b| b.is_ascii_alphanumeric());
    plausible.then_some(CacheFile::Temporary)
}

/// An advisory lock (`flock`) of the cache directory, released when dropped: shared while a
/// [`store`] writes, exclusive while [`clear`] or [`trim`] removes. Best effort: where the
/// directory cannot be opened or the file system has no locks, nothing is held.
struct DirLock {
    _file: Option<File>,
}

impl DirLock {
    fn shared(dir: &Path) -> DirLock {
        DirLock {
            _file: DirLock::open(dir).filter(|f| f.lock_shared().is_ok()),
        }
    }

    fn exclusive(dir: &Path) -> DirLock {
        DirLock {
            _file: DirLock::open(dir).filter(|f| f.lock().is_ok()),
        }
    }

    /// `dir`, opened if it is a directory (a file in its place is the user's, not to be locked).
    fn open(dir: &Path) -> Option<File> {
        File::open(dir)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_dir()))
    }
}

/// An entry of the cache, as [`list`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    /// Its key ([`key`]): the stem of its file names.
    pub key: String,
    /// The bytes of its files.
    pub bytes: u64,
    /// When it was stored or last hit ([`lookup`]): the modification time of its `.cubin`, or
    /// without one, the newest of its files'.
    pub last_used: SystemTime,
    /// Whether all three of its files are there. An incomplete entry is a miss until it is
    /// stored again: a store in progress, or what is left of one whose process died, or of a
    /// removal that failed half-way.
    pub complete: bool,
}

/// What a cache directory holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Incomplete entries first, then the least recently used first.
    pub entries: Vec<CacheEntry>,
    /// The temporary files of stores: being written, or left by a process that died storing.
    pub temporary_files: usize,
    /// The bytes of those temporary files.
    pub temporary_bytes: u64,
}

impl Listing {
    /// The bytes of the entries' files.
    pub fn entry_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The bytes of every file of the cache, temporary files included.
    pub fn total_bytes(&self) -> u64 {
        self.entry_bytes() + self.temporary_bytes
    }
}

/// What [`clear`] or [`trim`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Entries removed (with all their files).
    pub entries: usize,
    /// Files removed, temporary files included.
    pub files: usize,
    /// Of those, temporary files that stores left behind.
    pub temporary_files: usize,
    /// The bytes of the files removed.
    pub bytes: u64,
    /// The bytes of the entries left.
    pub kept_bytes: u64,
    /// Entries a best-effort trim ([`trim_after_store`]) would have removed but could not remove
    /// whole (a file another user owns, say); they are left, and counted in `kept_bytes` with
    /// the files that could not be removed. Always 0 for [`clear`] and [`trim`], which fail
    /// instead.
    pub left: usize,
}

/// `source`, an I/O error on `path`, as the error of `action` in the kernel cache.
fn dir_error(action: &'static str, path: &Path, source: std::io::Error) -> JitError {
    JitError::CacheDir {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The cache's files in a directory, with their sizes.
struct Scan {
    listing: Listing,
    /// Each entry's files, by key.
    files: BTreeMap<String, Vec<(PathBuf, u64)>>,
    temporaries: Vec<(PathBuf, u64)>,
}

/// The cache's files in `dir`; `None` when `dir` does not exist. A file that disappears while
/// this reads the directory (another process removing it, or renaming a temporary file into
/// place) is left out.
fn scan(dir: &Path) -> Result<Option<Scan>, JitError> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(dir_error("read", dir, file_in_the_way(dir, e))),
    };
    struct Files {
        paths: Vec<(PathBuf, u64)>,
        bytes: u64,
        cubin: Option<SystemTime>,
        newest: SystemTime,
    }
    let mut by_key: BTreeMap<String, Files> = BTreeMap::new();
    let mut temporaries = Vec::new();
    for item in read {
        let item = item.map_err(|e| dir_error("read", dir, e))?;
        let name = item.file_name();
        let Some(kind) = name.to_str().and_then(cache_file) else {
            continue;
        };
        let path = item.path();
        // Not followed: a link or a directory by a cache file's name is no file of the cache.
        let meta = match item.metadata() {
            Ok(m) if m.is_file() => m,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(dir_error("inspect", &path, e)),
        };
        let modified = meta.modified().unwrap_or(UNIX_EPOCH);
        match kind {
            CacheFile::Temporary => temporaries.push((path, meta.len())),
            CacheFile::Entry { key, ext } => {
                let f = by_key.entry(key.to_string()).or_insert(Files {
                    paths: Vec::new(),
                    bytes: 0,
                    cubin: None,
                    newest: UNIX_EPOCH,
                });
                f.paths.push((path, meta.len()));
                f.bytes += meta.len();
                f.newest = f.newest.max(modified);
                if ext == "cubin" {
                    f.cubin = Some(modified);
                }
            }
        }
    }
    let mut entries: Vec<CacheEntry> = by_key
        .iter()
        .map(|(key, f)| CacheEntry {
            key: key.clone(),
            bytes: f.bytes,
            last_used: f.cubin.unwrap_or(f.newest),
            complete: f.paths.len() == EXTENSIONS.len(),
        })
        .collect();
    entries
        .sort_by(|a, b| (a.complete, a.last_used, &a.key).cmp(&(b.complete, b.last_used, &b.key)));
    let listing = Listing {
        entries,
        temporary_files: temporaries.len(),
        temporary_bytes: temporaries.iter().map(|(_, b)| b).sum(),
    };
    let files = by_key.into_iter().map(|(k, f)| (k, f.paths)).collect();
    Ok(Some(Scan {
        listing,
        files,
        temporaries,
    }))
}

/// What the cache in `dir` holds: every entry with its size and last use, and the temporary
/// files of stores. A directory that does not exist holds nothing. Files of other names are no
/// part of the cache and are not listed.
pub fn list(dir: &Path) -> Result<Listing, JitError> {
    Ok(scan(dir)?.map(|s| s.listing).unwrap_or_default())
}

/// Removes every entry of the cache in `dir`, and the temporary files that stores left behind;
/// nothing else (see the module documentation). A directory that does not exist is left so.
pub fn clear(dir: &Path) -> Result<Removed, JitError> {
    remove_until(dir, None, Failure::Stop, &|p| fs::remove_file(p))
}

/// Removes the temporary files that stores left behind in `dir`, then entries, incomplete ones
/// first and then the least recently used ([`CacheEntry::last_used`]), until the entries' files
/// take at most `max_bytes`.
pub fn trim(dir: &Path, max_bytes: u64) -> Result<Removed, JitError> {
    remove_until(dir, Some(max_bytes), Failure::Stop, &|p| fs::remove_file(p))
}

/// [`trim`] as a compilation runs it after storing kernels, where `MLPC_CACHE_MAX_SIZE` caps
/// the cache: best effort, since the kernels are compiled and whole whatever it does. A file
/// it cannot remove (in a directory shared with other users, one of theirs) leaves its entry
/// ([`Removed::left`]) and the trim goes on with the next, the file's bytes no longer counted
/// against `max_bytes`; a directory it cannot read is left as it is. `mlpc cache trim`
/// ([`trim`]) reports either as an error.
pub fn trim_after_store(dir: &Path, max_bytes: u64) -> Removed {
    remove_until(dir, Some(max_bytes), Failure::Skip, &|p| fs::remove_file(p)).unwrap_or_default()
}

/// What [`remove_until`] does with a file it cannot remove.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Fail with the error.
    Stop,
    /// Leave the file, and its entry ([`Removed::left`]); go on with the next.
    Skip,
}

/// What became of a file [`remove_until`] removes.
#[derive(PartialEq, Eq)]
enum Gone {
    Removed,
    /// Gone before: another process removed it.
    Already,
    /// Not removable, and left ([`Failure::Skip`]).
    Left,
}

/// [`clear`] (`max_bytes` `None`), [`trim`] and [`trim_after_store`], removing files with
/// `remove_file` (a parameter so that tests can make it fail).
fn remove_until(
    dir: &Path,
    max_bytes: Option<u64>,
    failure: Failure,
    remove_file: &dyn Fn(&Path) -> std::io::Result<()>,
) -> Result<Removed, JitError> {
    let _lock = DirLock::exclusive(dir);
    let Some(Scan {
        listing,
        files,
        temporaries,
    }) = scan(dir)?
    else {
        return Ok(Removed::default());
    };
    let mut removed = Removed::default();
    let remove = |path: &Path| match remove_file(path) {
        Ok(()) => Ok(Gone::Removed),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Gone::Already),
        Err(_) if failure == Failure::Skip => Ok(Gone::Left),
        Err(e) => Err(dir_error("remove", path, e)),
    };
    // Under the exclusive lock no store is writing: every temporary file is left over.
    let mut temporary_files = 0;
    for (path, bytes) in &temporaries {
        if remove(path)? == Gone::Removed {
            removed.files += 1;
            removed.bytes += bytes;
            temporary_files += 1;
        }
    }
    let mut total = listing.entry_bytes();
    // The bytes of files left: not the trim's to manage, so they do not count against the size.
    let mut stuck = 0;
    let (mut entries, mut left) = (0, 0);
    for entry in &listing.entries {
        if max_bytes.is_some_and(|max| total - stuck <= max) {
            break;
        }
        let mut whole = true;
        for (path, bytes) in files.get(&entry.key).into_iter().flatten() {
            match remove(path)? {
                Gone::Removed => {
                    removed.files += 1;
                    removed.bytes += bytes;
                    total -= bytes;
                }
                Gone::Already => total -= bytes,
                Gone::Left => {
                    stuck += bytes;
                    whole = false;
                }
            }
        }
        if whole {
            entries += 1;
        } else {
            left += 1;
        }
    }
    removed.entries = entries;
    removed.temporary_files = temporary_files;
    removed.kept_bytes = total;
    removed.left = left;
    Ok(removed)
}

/// The environment variable that caps the cache's size.
pub const MAX_SIZE_VAR: &str = "MLPC_CACHE_MAX_SIZE";

/// `MLPC_CACHE_MAX_SIZE`, in bytes ([`parse_size`]'s forms), when set and not empty: every
/// compilation that stores kernels then [`trim`]s the cache to it. A value that is no size is an
/// error naming the variable.
pub fn max_size_from_env() -> Result<Option<u64>, JitError> {
    let Some(value) = std::env::var_os(MAX_SIZE_VAR).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    parse_size(&text)
        .map(Some)
        .map_err(|reason| JitError::CacheMaxSize {
            value: text.into_owned(),
            reason,
        })
}

/// A size in bytes: a number, whole or with a fraction, and an optional unit, case aside: none
/// or `B` (bytes), `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), `KB`,
/// `MB`, `GB`, `TB` (powers of 1000); e.g. `500M`, `2G`, `1024`, `1.5GiB`. A fraction of a byte
/// is dropped. The error says what is accepted.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "`{text}` is not a size (expected a number of bytes, or one with a unit: K, M, G, \
             T or KiB, MiB, GiB, TiB for powers of 1024, KB, MB, GB, TB for powers of 1000; \
             e.g. 500M, 2G, 1.5GiB)"
        )
    };
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 18 {
        return Err(bad());
    }
    let scale: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    let too_large = || format!("`{text}` is too large a size (at most {} bytes)", u64::MAX);
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    // The fraction, exactly: `fraction` / 10^digits of the unit.
    let part = if fraction.is_empty() {
        0
    } else {
        let f: u128 = fraction.parse().map_err(|_| bad())?;
        f * scale / 10u128.pow(fraction.len() as u32)
    };
    whole
        .checked_mul(scale)
        .and_then(|b| b.checked_add(part))
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    /// A CUBIN as far as [`crate::check_cubin`] looks (a CUDA ELF header, no tables), then `tag`.
    fn cubin(tag: &str) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&190u16.to_le_bytes());
        b.extend_from_slice(tag.as_bytes());
        b
    }

    fn entry(tag: &str) -> Entry {
        Entry {
            cubin: cubin(tag),
            ptx: format!(".entry {tag}() {{}}\n"),
            log: format!("ptxas info    : compiled {tag}\n"),
        }
    }

    fn key_of(tag: &str) -> String {
        key(tag, &[], &[], "sm_90", (13, 0))
    }

    fn bytes_of(tag: &str) -> u64 {
        let e = entry(tag);
        (e.cubin.len() + e.ptx.len() + e.log.len()) as u64
    }

    /// Stores `tag`'s entry in `dir` as last used `age` seconds ago; returns its key.
    fn stored(dir: &Path, tag: &str, age: u64) -> String {
        let k = key_of(tag);
        store(dir, &k, &entry(tag)).unwrap();
        set_age(&dir.join(format!("{k}.cubin")), age);
        k
    }

    fn set_age(path: &Path, age: u64) {
        let f = File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age))
            .unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    fn keys(dir: &Path) -> Vec<String> {
        list(dir)
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.key)
            .collect()
    }

    fn same(a: &Entry, b: &Entry) -> bool {
        (&a.cubin, &a.ptx, &a.log) == (&b.cubin, &b.ptx, &b.log)
    }

    #[test]
    fn trim_removes_the_least_recently_used_and_a_hit_is_a_use() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = stored(d, "aaaa", 300);
        let b = stored(d, "bbbb", 200);
        let c = stored(d, "cccc", 100);
        assert_eq!(keys(d), [a.as_str(), b.as_str(), c.as_str()]);
        // A hit makes `a` the most recently used.
        assert!(same(&lookup(d, &a).unwrap(), &entry("aaaa")));
        assert_eq!(keys(d), [b.as_str(), c.as_str(), a.as_str()]);
        // Room for two: the least recently used goes, whole.
        let two = bytes_of("aaaa") + bytes_of("cccc");
        let removed = trim(d, two).unwrap();
        assert_eq!(
            removed,
            Removed {
                entries: 1,
                files: 3,
                temporary_files: 0,
                bytes: bytes_of("bbbb"),
                kept_bytes: two,
                left: 0,
            }
        );
        assert_eq!(keys(d), [c.as_str(), a.as_str()]);
        assert!(lookup(d, &b).is_none());
        assert!(!names(d).iter().any(|n| n.starts_with(&b)));
        // Already within the size: nothing to do.
        assert_eq!(trim(d, two).unwrap().files, 0);
        // One byte short of the two: the older goes.
        assert_eq!(trim(d, two - 1).unwrap().entries, 1);
        assert_eq!(keys(d), [a.as_str()]);
        // To zero: nothing of the cache is left.
        assert_eq!(trim(d, 0).unwrap().entries, 1);
        assert_eq!(names(d), Vec::<String>::new());
        assert_eq!(list(d).unwrap(), Listing::default());
    }

    /// The trim after a store leaves an entry it cannot remove whole and goes on with the next;
    /// `mlpc cache trim` fails on it, naming the file.
    #[test]
    fn the_trim_after_a_store_leaves_what_it_cannot_remove() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = stored(d, "aaaa", 300);
        let b = stored(d, "bbbb", 200);
        let c = stored(d, "cccc", 100);
        // `a`'s `.ptx` cannot be removed (another user's file, say).
        let stuck = d.join(format!("{a}.ptx"));
        let remove = |p: &Path| match p == stuck {
            true => Err(std::io::Error::from(ErrorKind::PermissionDenied)),
            false => fs::remove_file(p),
        };
        let one = bytes_of("cccc");
        let e = remove_until(d, Some(one), Failure::Stop, &remove).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("cannot remove") && msg.contains(&format!("{a}.ptx")),
            "{msg}"
        );
        // The failure stopped the trim at `a` (some of whose files may be gone).
        assert_eq!(keys(d), [a.as_str(), b.as_str(), c.as_str()]);

        let removed = remove_until(d, Some(one), Failure::Skip, &remove).unwrap();
        let a_ptx = fs::metadata(&stuck).unwrap().len();
        assert_eq!(removed.left, 1);
        assert_eq!(removed.entries, 1, "{removed:?}");
        assert_eq!(removed.kept_bytes, one + a_ptx);
        // `b` went in `a`'s place; `c`, the most recently used, stays; of `a` only its `.ptx`.
        assert_eq!(names(d).len(), 4, "{:?}", names(d));
        assert!(lookup(d, &a).is_none() && lookup(d, &b).is_none());
        assert!(same(&lookup(d, &c).unwrap(), &entry("cccc")));
        // The public form, with files that can be removed: what is left of `a`, and `c`.
        assert_eq!(trim_after_store(d, 0).entries, 2);
        assert_eq!(names(d), Vec::<String>::new());
        // A directory that cannot be read (a file in its place): no error, nothing removed.
        let file = d.join("not-a-directory");
        fs::write(&file, b"x").unwrap();
        assert!(trim(&file, 0).is_err());
        assert_eq!(trim_after_store(&file, 0), Removed::default());
        assert!(file.exists());
    }

    #[test]
    fn sizes_and_last_uses_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = stored(d, "a", 50);
        let b = stored(d, "bb-longer", 10);
        // A temporary file a store left behind, and an entry missing its log.
        fs::write(d.join(format!("{a}.x7Yz01.tmp")), b"12345").unwrap();
        let c = stored(d, "ccc", 5);
        fs::remove_file(d.join(format!("{c}.log"))).unwrap();
        let l = list(d).unwrap();
        let by_key = |k: &str| l.entries.iter().find(|e| e.key == k).unwrap().clone();
        assert_eq!(by_key(&a).bytes, bytes_of("a"));
        assert_eq!(by_key(&b).bytes, bytes_of("bb-longer"));
        let e = entry("ccc");
        assert_eq!(by_key(&c).bytes, (e.cubin.len() + e.ptx.len()) as u64);
        assert!(by_key(&a).complete && by_key(&b).complete && !by_key(&c).complete);
        // The incomplete entry first, then by last use.
        assert_eq!(keys(d), [c.as_str(), a.as_str(), b.as_str()]);
        let age = SystemTime::now()
            .duration_since(by_key(&a).last_used)
            .unwrap();
        assert!((49..=60).contains(&age.as_secs()), "{age:?}");
        assert_eq!((l.temporary_files, l.temporary_bytes), (1, 5));
        assert_eq!(
            l.entry_bytes(),
            by_key(&a).bytes + by_key(&b).bytes + by_key(&c).bytes
        );
        assert_eq!(l.total_bytes(), l.entry_bytes() + 5);
        // Trimming goes for the leftovers first: the temporary file and the incomplete entry.
        let removed = trim(d, l.entry_bytes()).unwrap();
        assert_eq!(
            (removed.entries, removed.files, removed.temporary_files),
            (0, 1, 1)
        );
        let removed = trim(d, l.entry_bytes() - 1).unwrap();
        assert_eq!((removed.entries, removed.files), (1, 2));
        assert_eq!(removed.kept_bytes, by_key(&a).bytes + by_key(&b).bytes);
        assert_eq!(keys(d), [a.as_str(), b.as_str()]);
    }

    #[test]
    fn clear_removes_the_cache_s_files_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = stored(d, "a", 0);
        let b = stored(d, "b", 0);
        fs::write(d.join(format!("{a}.Ab12Cd.tmp")), b"partial").unwrap();
        let c = key_of("c");
        let others = [
            "notes.txt".to_string(),
            "autotune.json".to_string(),
            format!("{}.cubin", c.to_uppercase()),
            format!("{c}.cubin.bak"),
            format!("{}.cubin", &c[1..]),
            format!("x{c}.ptx"),
            format!("{c}.o"),
            format!("{c}.tmp"),
            format!("{c}..tmp"),
            format!("{c}.a-b.tmp"),
        ];
        for name in &others {
            fs::write(d.join(name), b"mine").unwrap();
        }
        // A directory by an entry's name, and a link by another's, to a file of the user's.
        fs::create_dir(d.join(format!("{c}.log"))).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("kept.ptx");
        fs::write(&target, b"user").unwrap();
        std::os::unix::fs::symlink(&target, d.join(format!("{c}.ptx"))).unwrap();
        let mut kept: Vec<String> = others.to_vec();
        kept.extend([format!("{c}.log"), format!("{c}.ptx")]);
        kept.sort();

        assert_eq!(keys(d).len(), 2, "{:?}", list(d));
        let removed = clear(d).unwrap();
        assert_eq!(removed.entries, 2);
        assert_eq!((removed.files, removed.temporary_files), (7, 1));
        assert_eq!(removed.kept_bytes, 0);
        assert_eq!(removed.bytes, bytes_of("a") + bytes_of("b") + 7);
        assert_eq!(names(d), kept);
        assert_eq!(fs::read(&target).unwrap(), b"user");
        assert!(lookup(d, &a).is_none() && lookup(d, &b).is_none());
        assert_eq!(clear(d).unwrap(), Removed::default());
    }

    #[test]
    fn a_missing_directory_is_empty_and_stays_missing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("not/yet");
        assert_eq!(list(&d).unwrap(), Listing::default());
        assert_eq!(clear(&d).unwrap(), Removed::default());
        assert_eq!(trim(&d, 0).unwrap(), Removed::default());
        assert!(!dir.path().join("not").exists());
    }

    #[test]
    fn a_file_in_the_way_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache");
        fs::write(&file, b"").unwrap();
        for d in [file.clone(), file.join("kernels")] {
            for e in [list(&d).unwrap_err(), clear(&d).unwrap_err()] {
                let msg = e.to_string();
                assert!(
                    msg.starts_with(&format!("kernel cache: cannot read `{}`: ", d.display()))
                        && msg
                            .ends_with(&format!("`{}` is a file, not a directory", file.display())),
                    "{msg}"
                );
            }
        }
    }

    /// A removal while a lookup reads an entry makes the lookup a miss: a file gone, never a
    /// mix of entries; and a store is never disturbed, because removals wait for it.
    #[test]
    fn a_removal_racing_with_lookups_and_stores_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Each file of an entry gone, as a removal half done leaves it: a miss; stored again: a hit.
        let k = key_of("x");
        for ext in EXTENSIONS {
            store(d, &k, &entry("x")).unwrap();
            assert!(lookup(d, &k).is_some());
            fs::remove_file(d.join(format!("{k}.{ext}"))).unwrap();
            assert!(lookup(d, &k).is_none(), "{ext}");
        }
        // Stores and lookups in two threads, clear and trim in a third, all the time.
        let stop = AtomicBool::new(false);
        let (hits, misses, removals) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let work = |w: usize| {
            for i in 0..400 {
                let tag = format!("k{}", (i + w) % 5);
                let k = key_of(&tag);
                store(d, &k, &entry(&tag)).unwrap_or_else(|e| panic!("{e}"));
                match lookup(d, &k) {
                    Some(e) => {
                        assert!(same(&e, &entry(&tag)), "{tag}");
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        misses.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        };
        let work = &work;
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let r = clear(d).unwrap();
                    let t = trim(d, 2 * bytes_of("k0")).unwrap();
                    removals.fetch_add(r.entries + t.entries, Ordering::Relaxed);
                }
            });
            let workers: Vec<_> = (0..2).map(|w| s.spawn(move || work(w))).collect();
            // Stops the remover also when a worker fails (else the scope would wait for it).
            struct StopOnDrop<'a>(&'a AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = StopOnDrop(&stop);
            for w in workers {
                w.join().unwrap();
            }
        });
        let (hits, misses) = (hits.into_inner(), misses.into_inner());
        assert_eq!(hits + misses, 800);
        assert!(removals.into_inner() > 0);
        // What is left is whole entries, each a hit.
        for e in list(d).unwrap().entries {
            assert!(e.complete && lookup(d, &e.key).is_some(), "{e:?}");
        }
        assert_eq!(list(d).unwrap().temporary_files, 0);
    }

    #[test]
    fn sizes_parse_with_units_and_others_are_refused() {
        for (text, bytes) in [
            ("1024", 1024),
            ("0", 0),
            ("7B", 7),
            ("500M", 500 << 20),
            ("2G", 2 << 30),
            ("2g", 2 << 30),
            ("1.5GiB", 3 << 29),
            ("10 KiB", 10 << 10),
            ("3k", 3 << 10),
            ("1T", 1 << 40),
            ("2GB", 2_000_000_000),
            ("1.5MB", 1_500_000),
            ("0.5", 0),
            ("1.", 1),
            (" 12M ", 12 << 20),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for text in [
            "", "abc", "12X", "-1", "1e9", "1.2.3", "M", ".5", "1 G B", "5 MiBs", "١٢",
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(
                e.starts_with(&format!("`{text}` is not a size (")),
                "{text}: {e}"
            );
        }
        for text in [
            "18446744073709551616",
            "16777216T",
            "99999999999999999999999999999999999999999",
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains("too large"), "{text}: {e}");
        }
    }
}
