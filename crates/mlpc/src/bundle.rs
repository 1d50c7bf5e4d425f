//! Running a compiled directory without the model: `plan.json`, the kernels' CUBINs and launch
//! descriptions (`kernels/<name>.json`, `.cu`, `.cubin`) and the weights the plan reads
//! (`weights.safetensors`, written by [`crate::Compiler::emit_weights`]). This is what a
//! deployment ships: no model file, no NVRTC, only the CUDA driver.

use crate::artifacts::{sha256_hex, slashed, Checksums};
use crate::error::Error;
use crate::Tensors;
use mlpc_codegen::CudaKernel;
use mlpc_ir::{BufferKind, HostTensor, Plan};
use mlpc_runtime::{Device, Executable, KernelImage, RunOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A compiled directory, loaded.
pub struct Bundle {
    dir: PathBuf,
    plan: Plan,
    images: Vec<KernelImage>,
    weights: BTreeMap<String, Arc<HostTensor>>,
    exe: Mutex<Option<Arc<Executable>>>,
}

fn bad(dir: &Path, what: String) -> Error {
    Error::Bundle {
        dir: dir.to_path_buf(),
        what,
    }
}

impl Bundle {
    /// Whether `path` is a directory (a compiled output, for [`Bundle::load`]) rather than a
    /// model file. Decided under the lock that [`crate::Compiled::write_to`] replaces outputs
    /// under, so that a compile swapping `path` in at this moment is waited for: mid-swap the
    /// directory is briefly absent, and a plain `is_dir` would then take it for a model file.
    pub fn is_dir(path: &Path) -> bool {
        let _lock =
            crate::artifacts::ParentLock::shared(&crate::artifacts::ParentLock::parent_of(path));
        path.is_dir()
    }

    /// `dir`'s [`Checksums`], written by this version of mlpc.
    fn checksums(dir: &Path) -> Result<Checksums, Error> {
        let path = dir.join(Checksums::FILE);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir.is_dir() => {
                return Err(bad(
                    dir,
                    format!(
                        "it holds no {}: every compiled directory has one (this one was written \
                         by an older mlpc, or copied in part); compile the model again",
                        Checksums::FILE
                    ),
                ))
            }
            Err(e) => return Err(Error::io("read", path)(e)),
        };
        let sums: Checksums = serde_json::from_slice(&text).map_err(|e| {
            bad(
                dir,
                format!("{} is not a list of checksums: {e}", Checksums::FILE),
            )
        })?;
        let ours = env!("CARGO_PKG_VERSION");
        if sums.mlpc != ours {
            return Err(bad(
                dir,
                format!(
                    "it was compiled by mlpc {}, and this is mlpc {ours}, whose plans and kernels \
                     may differ; compile the model again",
                    sums.mlpc
                ),
            ));
        }
        Ok(sums)
    }

    /// Reads `dir`: the plan, every kernel it names, and the weights it reads, each file read as
    /// bytes checked against [`Checksums`] first.
    pub fn load(dir: &Path) -> Result<Bundle, Error> {
        // Every file from one compilation: a compile replacing `dir` now waits, or is waited for.
        let _lock =
            crate::artifacts::ParentLock::shared(&crate::artifacts::ParentLock::parent_of(dir));
        let read_raw = |name: &Path| -> Result<Vec<u8>, Error> {
            let p = dir.join(name);
            std::fs::read(&p).map_err(Error::io("read", p))
        };
        if !dir.join("plan.json").exists() && dir.is_dir() {
            return Err(bad(
                dir,
                "it holds no plan.json: a directory to run is one `mlpc compile` wrote (or give \
                 the model file)"
                    .into(),
            ));
        }
        let sums = Bundle::checksums(dir)?;
        // Every file read as bytes is the one compiled.
        let read = |name: &Path| -> Result<Vec<u8>, Error> {
            let bytes = read_raw(name)?;
            let key = slashed(name);
            match sums.sha256.get(&key) {
                None => Err(bad(dir, format!("{} lists no `{key}`", Checksums::FILE))),
                Some(sum) if *sum != sha256_hex(&bytes) => Err(bad(
                    dir,
                    format!(
                        "{key} has changed since it was compiled (its SHA-256 is not the one \
                         {} records); compile the model again",
                        Checksums::FILE
                    ),
                )),
                Some(_) => Ok(bytes),
            }
        };
        let plan: Plan = serde_json::from_slice(&read(Path::new("plan.json"))?)
            .map_err(|e| bad(dir, format!("plan.json is not a plan: {e}")))?;
        plan.check()
            .map_err(|e| bad(dir, format!("plan.json is inconsistent: {}", e.join("; "))))?;
        if !plan.kernels.is_empty() && !dir.join("kernels").is_dir() {
            // What `--target cpu` writes: the plan and its reports, no CUDA kernels.
            return Err(bad(
                dir,
                "it holds no kernels/ (compiled with `--target cpu`?): a compiled directory runs \
                 its CUDA kernels; run the model file with `--backend cpu` instead"
                    .into(),
            ));
        }
        let mut images = Vec::with_capacity(plan.kernels.len());
        for k in &plan.kernels {
            let file = |ext: &str| Path::new("kernels").join(format!("{}.{ext}", k.name));
            // The launch description is the serialised `CudaKernel`, plus arch and resources.
            let kernel: CudaKernel =
                serde_json::from_slice(&read(&file("json"))?).map_err(|e| {
                    bad(
                        dir,
                        format!("kernels/{}.json is not a launch description: {e}", k.name),
                    )
                })?;
            if kernel.name != k.name {
                return Err(bad(
                    dir,
                    format!("kernels/{}.json describes kernel `{}`", k.name, kernel.name),
                ));
            }
            let cubin = read(&file("cubin"))?;
            mlpc_jit::check_cubin(&cubin).map_err(|why| {
                bad(
                    dir,
                    format!("kernels/{}.cubin is not a whole CUBIN: {why}", k.name),
                )
            })?;
            images.push(KernelImage { kernel, cubin });
        }
        let needs_weights = plan.buffers.iter().any(|b| b.kind == BufferKind::Weight);
        let weights = if needs_weights {
            let path = dir.join("weights.safetensors");
            if !path.exists() {
                return Err(bad(
                    dir,
                    "it has no weights.safetensors (compile with --emit-weights to ship the weights)".into(),
                ));
            }
            mlpc_frontend::read_tensors(&path)?
                .into_iter()
                .map(|(k, v)| (k, Arc::new(v)))
                .collect()
        } else {
            BTreeMap::new()
        };
        for b in plan.buffers.iter().filter(|b| b.kind == BufferKind::Weight) {
            let w = weights
                .get(&b.name)
                .ok_or_else(|| bad(dir, format!("weights.safetensors has no `{}`", b.name)))?;
            let want = b.ty.concrete_shape(&mlpc_ir::Bindings::new());
            if w.dtype() != b.ty.dtype || want.as_deref() != Some(w.shape()) {
                return Err(bad(
                    dir,
                    format!(
                        "weight `{}` is {}{:?} in weights.safetensors, the plan needs {}",
                        b.name,
                        w.dtype(),
                        w.shape(),
                        b.ty
                    ),
                ));
            }
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            plan,
            images,
            weights,
            exe: Mutex::new(None),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The loaded executable on device 0, opened on first use.
    pub fn executable(&self) -> Result<Arc<Executable>, Error> {
        let mut slot = self.exe.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        crate::Backend::Cuda.require()?;
        let device = Device::open(0)?;
        let lookup = |name: &str| self.weights.get(name).cloned();
        let exe = Arc::new(Executable::load(
            &device,
            &self.plan,
            &self.images,
            &lookup,
        )?);
        *slot = Some(exe.clone());
        Ok(exe)
    }

    /// Reads the compiled model's inputs from a safetensors file, by name: only the tensors its
    /// guards check are read; any other tensor is an unexpected input, refused before its dtype
    /// or data is looked at (as [`crate::Compiled::read_inputs`] does for a model).
    pub fn read_inputs(&self, path: &Path) -> Result<Tensors, Error> {
        let names: Vec<&str> = self.plan.guards.iter().map(|g| g.tensor.as_str()).collect();
        let (inputs, others) = mlpc_frontend::read_tensors_named(path, &names)?;
        mlpc_runtime::check_input_names(&self.plan, others.iter().map(String::as_str))
            .map_err(mlpc_runtime::RuntimeError::from)?;
        Ok(inputs)
    }

    /// Uploads `inputs`, runs the plan, downloads the outputs.
    pub fn run(&self, inputs: &Tensors) -> Result<Tensors, Error> {
        self.run_with(inputs, RunOptions::default())
    }

    /// [`Bundle::run`] with explicit options (poisoning, CUDA graphs).
    pub fn run_with(&self, inputs: &Tensors, opts: RunOptions) -> Result<Tensors, Error> {
        Ok(self.executable()?.run_host(inputs, opts)?)
    }
}
