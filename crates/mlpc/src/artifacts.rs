//! The files a compilation produces, and writing them into a directory all at once: they are
//! written into a fresh temporary directory beside the target, which then takes the target's
//! place by a rename. A failed compilation leaves the previous directory untouched.

use crate::error::Error;
use mlpc_ir::HostTensor;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The files of one compilation, by path relative to the output directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Artifacts {
    files: Vec<(PathBuf, FileContents)>,
}

/// What one file of [`Artifacts`] holds.
#[derive(Clone, Debug, PartialEq)]
pub enum FileContents {
    Bytes(Vec<u8>),
    /// A safetensors file of these tensors (shared with the compiled model, not copied), made
    /// as it is written: the weights would otherwise be held twice, once as tensors and once
    /// as the file's bytes.
    Tensors(BTreeMap<String, Arc<HostTensor>>),
}

impl FileContents {
    /// The bytes of a [`FileContents::Bytes`] file.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            FileContents::Bytes(b) => Some(b),
            FileContents::Tensors(_) => None,
        }
    }

    /// The safetensors file of a [`FileContents::Tensors`] file at `path` (checked when it was
    /// added); an error names `path`.
    fn safetensors_file<'t>(
        tensors: &'t BTreeMap<String, Arc<HostTensor>>,
        path: &Path,
    ) -> Result<mlpc_frontend::SafetensorsFile<'t>, Error> {
        mlpc_frontend::SafetensorsFile::new(tensors.iter().map(|(k, v)| (k.as_str(), &**v)))
            .map_err(|e| Error::Bundle {
                dir: path.to_path_buf(),
                what: e.to_string(),
            })
    }

    /// Writes the file at `path` (`shown` in errors).
    fn write(&self, path: &Path, shown: &Path) -> Result<(), Error> {
        match self {
            FileContents::Bytes(b) => fs::write(path, b).map_err(Error::io("write", shown)),
            FileContents::Tensors(t) => {
                let file = FileContents::safetensors_file(t, shown)?;
                let mut out = fs::File::create(path).map_err(Error::io("write", shown))?;
                file.write_to(&mut out).map_err(Error::io("write", shown))
            }
        }
    }
}

impl Artifacts {
    /// Every output directory holds this file; a directory with it (and nothing but what an
    /// output holds, [`Artifacts::OUTPUT_NAMES`]) is one mlpc may replace.
    pub const MARKER: &'static str = "graph.txt";

    /// What the top level of an output directory may hold.
    pub const OUTPUT_NAMES: [&'static str; 7] = [
        "graph.txt",
        "optimized.txt",
        "plan.json",
        "explain.txt",
        "weights.safetensors",
        "kernels",
        Checksums::FILE,
    ];

    pub fn new() -> Artifacts {
        Artifacts::default()
    }

    /// Adds (or replaces) the file at `path`, relative to the output directory: one of
    /// [`Artifacts::OUTPUT_NAMES`] or a path under one ([`Artifacts::write_to`] refuses others).
    pub fn add(&mut self, path: impl Into<PathBuf>, contents: impl Into<Vec<u8>>) {
        self.put(path.into(), FileContents::Bytes(contents.into()));
    }

    /// Adds (or replaces) a safetensors file of `tensors` at `path`, as [`Artifacts::add`] does:
    /// written from the tensors, which are not copied. Errors where no such file can be made
    /// (a tensor named `__metadata__`, which the format reserves).
    pub fn add_tensors(
        &mut self,
        path: impl Into<PathBuf>,
        tensors: BTreeMap<String, Arc<HostTensor>>,
    ) -> Result<(), Error> {
        let path = path.into();
        FileContents::safetensors_file(&tensors, &path)?;
        self.put(path, FileContents::Tensors(tensors));
        Ok(())
    }

    fn put(&mut self, path: PathBuf, contents: FileContents) {
        match self.files.iter_mut().find(|(p, _)| *p == path) {
            Some(f) => f.1 = contents,
            None => self.files.push((path, contents)),
        }
    }

    /// Adds (or replaces) [`Checksums::FILE`]: the SHA-256 of every file added so far as bytes
    /// (not the weights file, whose tensors [`crate::Bundle::load`] checks by name, dtype and
    /// shape), so that a compiled directory whose plan or kernels changed since is refused.
    pub fn add_checksums(&mut self) -> Result<(), Error> {
        let sha256 = self
            .files
            .iter()
            .filter(|(p, _)| p != Path::new(Checksums::FILE))
            .filter_map(|(p, c)| Some((slashed(p), sha256_hex(c.bytes()?))))
            .collect();
        let sums = Checksums {
            mlpc: env!("CARGO_PKG_VERSION").to_string(),
            sha256,
        };
        let text = serde_json::to_string_pretty(&sums).map_err(Error::Serialize)?;
        self.add(Checksums::FILE, text + "\n");
        Ok(())
    }

    /// The files in the order they were added.
    pub fn files(&self) -> impl Iterator<Item = (&Path, &FileContents)> {
        self.files.iter().map(|(p, c)| (p.as_path(), c))
    }

    pub fn get(&self, path: &str) -> Option<&FileContents> {
        self.files
            .iter()
            .find(|(p, _)| p == Path::new(path))
            .map(|(_, c)| c)
    }

    /// The bytes of the file at `path`, where it is held as bytes ([`FileContents::bytes`]).
    pub fn bytes(&self, path: &str) -> Option<&[u8]> {
        self.get(path).and_then(FileContents::bytes)
    }

    /// Writes every file under `dir`, replacing a previous output directory there. Returns the
    /// paths written. `dir` may not exist yet; if it exists it must be empty or hold
    /// [`Artifacts::MARKER`], so that a mistyped `-o` never deletes a user's files.
    pub fn write_to(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        let bad = |reason: &str| Error::OutputDir {
            path: dir.to_path_buf(),
            reason: reason.to_string(),
        };
        let name = dir
            .file_name()
            .ok_or_else(|| bad("it does not end in a directory name"))?;
        // Every file inside the directory, under one of the names an output may hold (the next
        // write would refuse to replace anything else).
        for (rel, _) in &self.files {
            let inside = rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            let top = rel.components().next().map(|c| c.as_os_str());
            if !inside
                || !Artifacts::OUTPUT_NAMES
                    .iter()
                    .any(|o| top == Some(o.as_ref()))
            {
                return Err(bad(&format!(
                    "the file `{}` is not a path under one of the names an output holds ({})",
                    rel.display(),
                    Artifacts::OUTPUT_NAMES.join(", ")
                )));
            }
        }
        let parent = ParentLock::parent_of(dir);
        // Whether `dir` exists, and an error where it is not an mlpc output to replace.
        let inspect = || -> Result<bool, Error> {
            match fs::symlink_metadata(dir) {
                Ok(m) if m.is_dir() => {
                    match foreign_entry(dir).map_err(Error::io("read directory", dir))? {
                        None => Ok(true),
                        Some(Foreign::NoMarker) => Err(bad(
                            "it exists, is not empty and holds no graph.txt (it is not an mlpc output)",
                        )),
                        Some(Foreign::Entry(entry)) => Err(bad(&format!(
                            "it holds `{entry}`, which no mlpc output has (only {})",
                            Artifacts::OUTPUT_NAMES.join(", ")
                        ))),
                    }
                }
                Ok(_) => Err(bad("it exists and is not a directory")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(Error::io("inspect", dir)(e)),
            }
        };
        // Before writing anything, so that a refusal costs nothing; again under the exclusive
        // lock below. Under the shared one here: mid-swap, another compile's `dir` is briefly
        // absent, or listed before the swap and its marker looked for after it.
        {
            let _lock = ParentLock::shared(&parent);
            inspect()?;
        }
        fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
        let prefix = format!(".{}.", name.to_string_lossy());
        let staging = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".new")
            .tempdir_in(&parent)
            .map_err(Error::io("create a directory in", &parent))?;
        let mut written = Vec::with_capacity(self.files.len());
        for (rel, contents) in &self.files {
            let path = staging.path().join(rel);
            if let Some(p) = path.parent() {
                fs::create_dir_all(p).map_err(Error::io("create directory", dir.join(rel)))?;
            }
            contents.write(&path, &dir.join(rel))?;
            written.push(dir.join(rel));
        }
        set_public(staging.path()).map_err(Error::io("set permissions of", dir))?;

        // Another process may be replacing or reading `dir` now: the swap below happens under
        // the parent's exclusive lock, and what it replaces is inspected under it.
        let _lock = ParentLock::exclusive(&parent);
        let exists = inspect()?;
        // Move the previous directory aside (into an empty temporary directory, which takes it
        // away when dropped), then move the new one in; put the old one back if that fails.
        let old = if exists {
            let old = tempfile::Builder::new()
                .prefix(&prefix)
                .suffix(".old")
                .tempdir_in(&parent)
                .map_err(Error::io("create a directory in", &parent))?;
            fs::rename(dir, old.path()).map_err(Error::io("replace", dir))?;
            Some(old)
        } else {
            None
        };
        let staged = staging.keep();
        if let Err(e) = fs::rename(&staged, dir) {
            if let Some(old) = &old {
                // Best effort: the error below is what the user needs to see.
                let _ = fs::rename(old.path(), dir);
            }
            let _ = fs::remove_dir_all(&staged);
            return Err(Error::io("write", dir)(e));
        }
        drop(old);
        Ok(written)
    }
}

/// `checksums.json` of a compiled directory: which mlpc wrote it, and the SHA-256 of each file
/// it wrote as bytes, by its path in the directory (`/`-separated). It tells a file changed or
/// swapped since the compilation (a copy cut short, a kernel of another compilation) from the
/// one compiled, and a directory of another mlpc version (whose plan and launch descriptions
/// this one may read differently) from one of its own; it is not a signature: whoever can edit
/// the files can edit it too.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checksums {
    /// The version of the mlpc that compiled the directory.
    pub mlpc: String,
    /// Lowercase hex SHA-256 of each file, by path.
    pub sha256: BTreeMap<String, String>,
}

impl Checksums {
    /// The file's name in an output directory.
    pub const FILE: &'static str = "checksums.json";
}

/// Lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A relative path with `/` between its components, whatever the platform's separator.
pub(crate) fn slashed(path: &Path) -> String {
    path.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// An advisory lock (`flock`) on the directory that holds output directories: [`Artifacts::write_to`]
/// swaps an output in under the exclusive lock and [`crate::Bundle::load`] reads one under the
/// shared lock, so that concurrent compiles into one directory each replace it whole (none
/// fails on another's half-done swap) and a reader never mixes the files of two compilations.
/// Best effort: where the directory cannot be opened or the file system has no locks, nothing
/// is held. Released when dropped.
pub(crate) struct ParentLock(#[allow(dead_code)] Option<fs::File>);

impl ParentLock {
    pub(crate) fn exclusive(parent: &Path) -> ParentLock {
        ParentLock(fs::File::open(parent).ok().filter(|f| f.lock().is_ok()))
    }

    pub(crate) fn shared(parent: &Path) -> ParentLock {
        ParentLock(
            fs::File::open(parent)
                .ok()
                .filter(|f| f.lock_shared().is_ok()),
        )
    }

    /// The lock's directory for an output directory `dir`: its parent, `.` for a bare name.
    pub(crate) fn parent_of(dir: &Path) -> PathBuf {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// Why an existing directory is not one mlpc may replace.
enum Foreign {
    /// Not empty, and without [`Artifacts::MARKER`].
    NoMarker,
    /// An entry that is none of [`Artifacts::OUTPUT_NAMES`].
    Entry(String),
}

/// `None` when `dir` is empty, or holds [`Artifacts::MARKER`] and nothing but
/// [`Artifacts::OUTPUT_NAMES`] (a directory that happens to have a `graph.txt` among a user's
/// files is not replaced).
fn foreign_entry(dir: &Path) -> io::Result<Option<Foreign>> {
    let names: Vec<std::ffi::OsString> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    if names.is_empty() {
        return Ok(None);
    }
    if !dir.join(Artifacts::MARKER).is_file() {
        return Ok(Some(Foreign::NoMarker));
    }
    Ok(names
        .iter()
        .find(|n| !Artifacts::OUTPUT_NAMES.iter().any(|o| n.as_os_str() == *o))
        .map(|n| Foreign::Entry(n.to_string_lossy().into_owned())))
}

/// Temporary directories are private (0700); an output directory is as readable as any other.
#[cfg(unix)]
fn set_public(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
fn set_public(_dir: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Artifacts {
        let mut a = Artifacts::new();
        a.add("graph.txt", "graph\n");
        a.add("kernels/k0.cu", "// k0\n");
        a
    }

    #[test]
    fn writes_a_new_directory_and_its_subdirectories() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out/model");
        let written = sample().write_to(&dir).unwrap();
        assert_eq!(
            written,
            vec![dir.join("graph.txt"), dir.join("kernels/k0.cu")]
        );
        assert_eq!(
            fs::read_to_string(dir.join("kernels/k0.cu")).unwrap(),
            "// k0\n"
        );
        // Nothing is left beside it.
        let siblings: Vec<_> = fs::read_dir(tmp.path().join("out")).unwrap().collect();
        assert_eq!(siblings.len(), 1);
    }

    #[test]
    fn replaces_a_previous_output_entirely() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("graph.txt"), "old").unwrap();
        fs::write(dir.join("weights.safetensors"), "old").unwrap();
        fs::create_dir(dir.join("kernels")).unwrap();
        fs::write(dir.join("kernels/stale.ptx"), "old").unwrap();
        let mut a = Artifacts::new();
        a.add("graph.txt", "new");
        a.write_to(&dir).unwrap();
        assert_eq!(fs::read_to_string(dir.join("graph.txt")).unwrap(), "new");
        assert!(!dir.join("kernels").exists());
        assert!(!dir.join("weights.safetensors").exists());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn refuses_to_replace_foreign_directories_and_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("home");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("notes.txt"), "keep me").unwrap();
        let err = sample().write_to(&dir).unwrap_err();
        assert!(matches!(err, Error::OutputDir { .. }), "{err}");
        assert_eq!(
            fs::read_to_string(dir.join("notes.txt")).unwrap(),
            "keep me"
        );

        // A graph.txt among a user's files does not make the directory an output.
        fs::write(dir.join("graph.txt"), "mine").unwrap();
        let err = sample().write_to(&dir).unwrap_err();
        assert!(
            err.to_string()
                .contains("it holds `notes.txt`, which no mlpc output has"),
            "{err}"
        );
        assert_eq!(fs::read_to_string(dir.join("graph.txt")).unwrap(), "mine");

        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        let err = sample().write_to(&file).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        // No staging directories were left behind.
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 2);
    }

    /// A file outside the directory (`..`, an absolute path) would be written outside the swap;
    /// one under another name would make the next write refuse the directory.
    #[test]
    fn refuses_files_outside_the_names_an_output_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let escape = tmp.path().join("escaped.txt");
        for bad in [
            PathBuf::from("../escaped.txt"),
            escape.clone(),
            PathBuf::from("kernels/../../escaped.txt"),
            PathBuf::from("notes.md"),
            PathBuf::from("./graph.txt"),
        ] {
            let mut a = sample();
            a.add(bad.clone(), "x");
            let err = a.write_to(&dir).unwrap_err();
            assert!(
                err.to_string().contains(&format!(
                    "the file `{}` is not a path under one of the names an output holds",
                    bad.display()
                )),
                "{err}"
            );
            assert!(!escape.exists() && !dir.exists(), "{}", bad.display());
            assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        }
    }

    #[test]
    fn later_files_replace_earlier_ones_of_the_same_path() {
        let mut a = sample();
        a.add("graph.txt", "again");
        assert_eq!(a.bytes("graph.txt"), Some(&b"again"[..]));
        assert_eq!(a.files().count(), 2);
    }
}
