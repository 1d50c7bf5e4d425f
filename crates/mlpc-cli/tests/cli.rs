//! End-to-end tests of the `mlpc` binary: every example compiles and its IR text is snapshotted;
//! runs agree with the reference interpreter called directly; malformed models, inputs and
//! arguments each fail with one clear message, exit status 1, and leave no file behind.
//!
//! Each command runs in a fresh temporary directory with relative paths, so the transcripts
//! (snapshots of exit status, stdout and stderr) do not depend on the machine.

use mlpc_ir::{DType, HostTensor};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

type Tensors = BTreeMap<String, HostTensor>;

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// The snapshot text: the command, its exit status and what it printed.
    fn transcript(&self, args: &[&str]) -> String {
        let mut s = format!("$ mlpc {}\nexit: {}\n", args.join(" "), self.code);
        if !self.stdout.is_empty() {
            s.push_str("--- stdout\n");
            s.push_str(&self.stdout);
        }
        if !self.stderr.is_empty() {
            s.push_str("--- stderr\n");
            s.push_str(&self.stderr);
        }
        s
    }
}

fn mlpc(dir: &Path, args: &[&str]) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlpc"));
    cmd.args(args).current_dir(dir).env("NO_COLOR", "1");
    outcome(cmd)
}

/// Runs `cmd` to its end.
fn outcome(mut cmd: Command) -> Outcome {
    let out = cmd.output().unwrap();
    Outcome {
        // A signal (a crash) has no code: make it fail every assertion below.
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Starts mlpc in `dir` in the background, its stderr captured (for commands run side by side).
fn spawn(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mlpc"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases")
}

/// Every file under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Runs a command that must fail: exit status 1, a single `error:` message, no panic, and no
/// file created or removed in the working directory. Returns the transcript.
fn fails(dir: &Path, args: &[&str]) -> String {
    let t = fails_raw(dir, args);
    // An I/O error may name a temporary file (random name, machine's temp dir).
    t.lines()
        .map(|l| match l.find(" at path \"") {
            Some(i) => format!("{} at path \"[temporary file]\"", &l[..i]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn fails_raw(dir: &Path, args: &[&str]) -> String {
    let before = listing(dir);
    let o = mlpc(dir, args);
    assert_eq!(o.code, 1, "{}", o.transcript(args));
    assert!(o.stderr.starts_with("error: "), "{}", o.transcript(args));
    assert!(!o.stderr.contains("panicked"), "{}", o.transcript(args));
    assert!(o.stdout.is_empty(), "{}", o.transcript(args));
    assert_eq!(
        listing(dir),
        before,
        "files changed: {}",
        o.transcript(args)
    );
    o.transcript(args)
}

fn succeeds(dir: &Path, args: &[&str]) -> Outcome {
    let o = mlpc(dir, args);
    assert_eq!(o.code, 0, "{}", o.transcript(args));
    assert!(o.stderr.is_empty(), "{}", o.transcript(args));
    o
}

fn examples() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| repo().join("examples").join(n).join("model.json").is_file())
        .collect();
    names.sort();
    names
}

/// A scratch directory holding `files` copied from the test cases.
fn scratch(files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        let name = Path::new(f).file_name().unwrap();
        fs::copy(cases().join(f), dir.path().join(name)).unwrap();
    }
    dir
}

/// A scratch directory with `residual.json` and inputs for it (`in.safetensors`, T = 2).
fn residual_with_inputs() -> tempfile::TempDir {
    let dir = scratch(&["models/residual.json"]);
    let x = tensors(&[
        ("x", DType::F32, &[2, 8], 0.0),
        ("r", DType::F32, &[2, 8], 1.0),
    ]);
    mlpc_frontend::write_tensors(&dir.path().join("in.safetensors"), &x).unwrap();
    dir
}

fn tensors(entries: &[(&str, DType, &[usize], f64)]) -> Tensors {
    entries
        .iter()
        .map(|&(name, dtype, shape, fill)| {
            let n: usize = shape.iter().product();
            let values: Vec<f64> = (0..n).map(|i| fill + i as f64 / 16.0).collect();
            let t = HostTensor::from_f64(dtype, shape.to_vec(), &values).unwrap();
            (name.to_string(), t)
        })
        .collect()
}

#[test]
fn every_example_compiles_and_its_ir_is_stable() {
    let names = examples();
    assert!(names.len() >= 7, "examples: {names:?}");
    for name in names {
        let dir = tempfile::tempdir().unwrap();
        let model = repo().join("examples").join(&name).join("model.json");
        let model = model.to_str().unwrap();
        let o = succeeds(dir.path(), &["compile", model]);
        // The default output directory is out/<model name>.
        let graph = fs::read_to_string(dir.path().join("out").join(&name).join("graph.txt"))
            .unwrap_or_else(|e| panic!("{name}: no out/{name}/graph.txt: {e}\n{}", o.stdout));
        let out = Path::new("out").join(&name);
        let files = listing(dir.path());
        assert!(
            files
                .iter()
                .all(|p| p == Path::new("out") || p.starts_with(&out)),
            "{name}: stray files: {files:?}"
        );
        for f in ["graph.txt", "optimized.txt", "plan.json", "explain.txt"] {
            assert!(files.contains(&out.join(f)), "{name}: no {f}");
        }
        insta::assert_snapshot!(format!("example-{name}"), format!("{}\n{graph}", o.stdout));
    }
}

#[test]
fn compile_replaces_its_own_output_and_nothing_else() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    succeeds(d, &["compile", "residual.json", "-o", "build/r"]);
    fs::write(
        d.join("build/r/kernels/stale.cu"),
        "from an earlier compile",
    )
    .unwrap();
    fs::write(
        d.join("build/r/weights.safetensors"),
        "from an earlier compile",
    )
    .unwrap();
    succeeds(d, &["compile", "residual.json", "-o", "build/r"]);
    assert!(d.join("build/r/graph.txt").is_file());
    assert!(!d.join("build/r/kernels/stale.cu").exists());
    assert!(!d.join("build/r/weights.safetensors").exists());
    let files = listing(&d.join("build"));
    assert!(files.iter().all(|p| p.starts_with("r")), "{files:?}");
    assert!(files.contains(&PathBuf::from("r/plan.json")), "{files:?}");

    fs::create_dir(d.join("mine")).unwrap();
    fs::write(d.join("mine/notes.txt"), "keep").unwrap();
    fs::write(d.join("a-file"), "keep").unwrap();
    let t1 = fails(d, &["compile", "residual.json", "-o", "mine"]);
    let t2 = fails(d, &["compile", "residual.json", "-o", "a-file"]);
    // A `graph.txt` among a user's files, or a user's file in an output, is no licence to
    // delete them.
    fs::write(d.join("mine/graph.txt"), "mine").unwrap();
    fs::write(d.join("build/r/notes.txt"), "keep").unwrap();
    let t3 = fails(d, &["compile", "residual.json", "-o", "mine"]);
    let t4 = fails(d, &["compile", "residual.json", "-o", "build/r"]);
    insta::assert_snapshot!(
        "compile-into-foreign-directory",
        format!("{t1}\n{t2}\n{t3}\n{t4}")
    );
}

#[test]
fn a_selected_weight_read_dense_is_a_warning() {
    // `gate.weight` is half of a dual GEMM whose `up.weight` is not selected: the dual GEMM stays
    // dense, and the compile says so instead of counting it block-sparse; `spare.weight` feeds
    // no output.
    let dir = scratch(&["models/half-sparse-glu.json"]);
    let args = [
        "compile",
        "half-sparse-glu.json",
        "-o",
        "out",
        "--target",
        "cpu",
    ];
    let o = mlpc(dir.path(), &args);
    assert_eq!(o.code, 0, "{}", o.transcript(&args));
    insta::assert_snapshot!("half-sparse-glu-compile", o.transcript(&args));
    let explain = fs::read_to_string(dir.path().join("out/explain.txt")).unwrap();
    assert!(
        explain.contains("selected for block sparsity but read dense: 1\n  gate.weight: "),
        "{explain}"
    );
}

#[test]
fn f32_kernel_options_with_two_block_shapes_of_one_k_and_n() {
    // Two block-sparse f32 GEMMs of one K and N whose blocks (16 and 32 rows) take tiles of
    // other widths: each keeps its own. They once shared a tuning key, and forcing the FFMA or
    // FP64 kernel put the last one's tile on the first ("the tile 128x32 x1 CTA is not valid").
    let dir = scratch(&["models/f32-sparse-two-blocks.json"]);
    for opt in ["--f32-ffma", "--f32-fp64-tensor-cores"] {
        let args = [
            "compile",
            "f32-sparse-two-blocks.json",
            "-o",
            "out",
            "--target",
            "cuda:sm_90a",
            "--no-cache",
            opt,
        ];
        let o = mlpc(dir.path(), &args);
        assert_eq!(o.code, 0, "{}", o.transcript(&args));
        for k in [
            "bsr_gemm_bias_relu_f32_nt_b16x16",
            "bsr_gemm_bias_f32_nt_b32x32",
        ] {
            let cubin = dir.path().join(format!("out/kernels/{k}.cubin"));
            assert!(cubin.is_file(), "{opt}: no {}", cubin.display());
        }
    }
}

#[test]
fn malformed_models_fail_with_one_message_each() {
    let mut names: Vec<String> = fs::read_dir(cases().join("bad-models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 15, "{names:?}");
    for name in &names {
        let dir = scratch(&[&format!("bad-models/{name}")]);
        for cmd in ["compile", "gen-inputs"] {
            let args: &[&str] = if cmd == "compile" {
                &["compile", name, "-o", "out"]
            } else {
                &["gen-inputs", name, "--bind", "T=2", "-o", "in.safetensors"]
            };
            let t = fails(dir.path(), args);
            if cmd == "compile" {
                let stem = name.trim_end_matches(".json");
                insta::assert_snapshot!(format!("bad-model-{stem}"), t);
            }
        }
    }
}

#[test]
fn missing_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = fails(dir.path(), &["compile", "nowhere/model.json"]);
    insta::assert_snapshot!("missing-model-file", t);
}

/// The residual model (inputs `x` and `r`, both `f32[T,8]`), with the given inputs file.
fn run_residual(inputs: Option<Tensors>, extra: &[&str]) -> String {
    let dir = scratch(&["models/residual.json"]);
    if let Some(inputs) = inputs {
        mlpc_frontend::write_tensors(&dir.path().join("in.safetensors"), &inputs).unwrap();
    }
    let mut args = vec![
        "run",
        "residual.json",
        "--input",
        "in.safetensors",
        "--output",
        "out.safetensors",
    ];
    args.extend_from_slice(extra);
    fails(dir.path(), &args)
}

#[test]
fn bad_inputs_fail_with_one_message_each() {
    use DType::{Bf16, F32};
    let cases: Vec<(&str, Option<Tensors>, &[&str])> = vec![
        ("missing-input-file", None, &[]),
        (
            "wrong-input-name",
            Some(tensors(&[
                ("x", F32, &[2, 8], 0.0),
                ("res", F32, &[2, 8], 0.0),
            ])),
            &[],
        ),
        (
            "missing-input",
            Some(tensors(&[("x", F32, &[2, 8], 0.0)])),
            &[],
        ),
        (
            "wrong-input-dtype",
            Some(tensors(&[
                ("x", Bf16, &[2, 8], 0.0),
                ("r", F32, &[2, 8], 0.0),
            ])),
            &[],
        ),
        (
            "wrong-input-shape",
            Some(tensors(&[
                ("x", F32, &[2, 9], 0.0),
                ("r", F32, &[2, 8], 0.0),
            ])),
            &[],
        ),
        (
            "wrong-input-rank",
            Some(tensors(&[
                ("x", F32, &[2, 2, 8], 0.0),
                ("r", F32, &[2, 8], 0.0),
            ])),
            &[],
        ),
        (
            "conflicting-symbol",
            Some(tensors(&[
                ("x", F32, &[2, 8], 0.0),
                ("r", F32, &[3, 8], 0.0),
            ])),
            &[],
        ),
        (
            "backend-cuda",
            Some(tensors(&[
                ("x", F32, &[2, 8], 0.0),
                ("r", F32, &[2, 8], 0.0),
            ])),
            &["--backend", "cuda"],
        ),
        (
            "unknown-backend",
            Some(tensors(&[
                ("x", F32, &[2, 8], 0.0),
                ("r", F32, &[2, 8], 0.0),
            ])),
            &["--backend", "gpu"],
        ),
    ];
    for (name, inputs, extra) in cases {
        insta::assert_snapshot!(format!("bad-input-{name}"), run_residual(inputs, extra));
    }
}

#[test]
fn unreadable_inputs_file() {
    let dir = scratch(&["models/residual.json"]);
    fs::write(
        dir.path().join("in.safetensors"),
        b"this is not a safetensors file",
    )
    .unwrap();
    let t = fails(
        dir.path(),
        &[
            "run",
            "residual.json",
            "--input",
            "in.safetensors",
            "--output",
            "o.safetensors",
        ],
    );
    insta::assert_snapshot!("bad-input-not-safetensors", t);
}

#[test]
fn unwritable_output() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    succeeds(
        d,
        &[
            "gen-inputs",
            "residual.json",
            "--bind",
            "T=2",
            "-o",
            "in.safetensors",
        ],
    );
    let t = fails(
        d,
        &[
            "run",
            "residual.json",
            "--input",
            "in.safetensors",
            "--output",
            "no/such/dir/o.safetensors",
        ],
    );
    insta::assert_snapshot!("unwritable-output", t);
}

#[test]
fn bad_arguments() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let unbound = fails(d, &["gen-inputs", "residual.json", "-o", "in.safetensors"]);
    let malformed = fails(
        d,
        &[
            "gen-inputs",
            "residual.json",
            "--bind",
            "T",
            "-o",
            "in.safetensors",
        ],
    );
    let no_command = fails(d, &["compile"]);
    // Pass lists: the option with the mistake is named, and an empty name is called one.
    let compile = ["compile", "residual.json", "--target", "cpu"];
    let passes: String = [
        &["--passes", "dce,,cse"][..],
        &["--passes", "fuse"],
        &["--print-after", ""],
        &["--print-after", "fuse"],
    ]
    .iter()
    .map(|extra| fails(d, &[&compile[..], extra].concat()))
    .collect();
    insta::assert_snapshot!(
        "bad-arguments",
        format!("{unbound}\n{malformed}\n{no_command}\n{passes}")
    );
}

#[test]
fn help_and_version_succeed() {
    let d = tempfile::tempdir().unwrap();
    let help = succeeds(d.path(), &["--help"]);
    for cmd in ["compile", "run", "gen-inputs", "cache"] {
        assert!(help.stdout.contains(cmd), "{}", help.stdout);
    }
    let v = succeeds(d.path(), &["--version"]);
    assert_eq!(
        v.stdout.trim(),
        format!("mlpc {}", env!("CARGO_PKG_VERSION"))
    );
}

/// `gen-inputs` then `run` gives what the reference interpreter gives on the same graph and
/// inputs, for the examples small enough to interpret quickly.
#[test]
fn runs_equal_the_interpreter() {
    for (model, t) in [
        (repo().join("examples/tiny-mlp/model.json"), 5),
        (repo().join("examples/gpt2-mlp/model.json"), 2),
        (repo().join("examples/seed-geglu/model.json"), 3),
        (cases().join("models/residual.json"), 7),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = model.to_str().unwrap();
        let bind = format!("T={t}");
        succeeds(
            d,
            &[
                "gen-inputs",
                m,
                "--bind",
                &bind,
                "--seed",
                "11",
                "-o",
                "in.safetensors",
            ],
        );
        let o = succeeds(
            d,
            &[
                "run",
                m,
                "--input",
                "in.safetensors",
                "--output",
                "out.safetensors",
                "--backend",
                "reference",
            ],
        );
        assert!(o.stdout.contains("on reference"), "{}", o.stdout);

        let inputs = mlpc_frontend::read_tensors(&d.join("in.safetensors")).unwrap();
        for t_in in inputs.values() {
            assert_eq!(t_in.shape()[0], t, "{}", model.display());
        }
        let graph = mlpc_frontend::load_model(&model).unwrap().graph;
        let expected = mlpc_ir::interpret(&graph, &inputs).unwrap();
        let actual = mlpc_frontend::read_tensors(&d.join("out.safetensors")).unwrap();
        assert_eq!(actual, expected, "{}", model.display());
        assert!(actual
            .values()
            .all(|t| t.to_f64().iter().any(|&v| v != 0.0)));

        // Without --backend, the best backend of this machine runs, and says which it is.
        let o = succeeds(
            d,
            &[
                "run",
                m,
                "--input",
                "in.safetensors",
                "--output",
                "best.safetensors",
            ],
        );
        assert!(o.stdout.starts_with("ran `"), "{}", o.stdout);
        let best = mlpc_frontend::read_tensors(&d.join("best.safetensors")).unwrap();
        for (name, want) in &expected {
            let err = mlpc_ir::relative_error(&best[name].to_f64(), &want.to_f64());
            let tol = mlpc::tolerance(want.dtype());
            assert!(
                err <= tol,
                "{}: {name}: error {err} > {tol}",
                model.display()
            );
        }
    }
}

#[test]
fn same_seed_same_inputs_other_seed_other_inputs() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    for (seed, file) in [("1", "a"), ("1", "b"), ("2", "c")] {
        succeeds(
            d,
            &[
                "gen-inputs",
                "residual.json",
                "--bind",
                "T=4",
                "--seed",
                seed,
                "-o",
                file,
            ],
        );
    }
    let read = |f: &str| mlpc_frontend::read_tensors(&d.join(f)).unwrap();
    assert_eq!(read("a"), read("b"));
    assert_ne!(read("a"), read("c"));
}

#[test]
fn nan_inputs_are_data() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let mut inputs = tensors(&[
        ("x", DType::F32, &[2, 8], 0.5),
        ("r", DType::F32, &[2, 8], 0.0),
    ]);
    let mut x = inputs["x"].to_f64();
    x[3] = f64::NAN;
    inputs.insert(
        "x".into(),
        HostTensor::from_f64(DType::F32, vec![2, 8], &x).unwrap(),
    );
    mlpc_frontend::write_tensors(&d.join("in.safetensors"), &inputs).unwrap();
    succeeds(
        d,
        &[
            "run",
            "residual.json",
            "--input",
            "in.safetensors",
            "--output",
            "out.safetensors",
        ],
    );
    let y = mlpc_frontend::read_tensors(&d.join("out.safetensors")).unwrap()["y"].to_f64();
    // Row 0 saw the NaN through the matmul; row 1 did not.
    assert!(y[..8].iter().all(|v| v.is_nan()), "{y:?}");
    assert!(y[8..].iter().all(|v| v.is_finite()), "{y:?}");
}

/// `compile --autotune` measures on a GPU at given sizes: without `--bind` for every symbol, or
/// without a CUDA driver, it fails with one message saying what is missing and writes nothing.
#[test]
fn autotune_says_what_it_needs() {
    let dir = scratch(&["models/residual.json"]);
    let cache = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let before = listing(dir.path());
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(args)
            .current_dir(dir.path())
            .env("MLPC_CACHE_DIR", cache.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert_eq!(listing(dir.path()), before);
        String::from_utf8(out.stderr).unwrap()
    };
    let e = run(&["compile", "residual.json", "--autotune"]);
    assert!(e.starts_with("error: autotune: "), "{e}");
    assert!(e.contains("unbound: T; e.g. --bind T=8192"), "{e}");
    let e = run(&["compile", "residual.json", "--autotune", "--target", "cpu"]);
    assert!(e.contains("compiled without CUDA kernels"), "{e}");
    if !Path::new("/dev/nvidiactl").exists() {
        let e = run(&["compile", "residual.json", "--autotune", "--bind", "T=64"]);
        assert_eq!(
            e.trim_end(),
            "error: autotune: needs a CUDA device: the CUDA driver (libcuda.so.1) cannot be \
             loaded on this machine"
        );
    }
    // No tile was cached (the kernel cache may hold the compiled kernels).
    assert!(!cache.path().join("autotune.json").exists());
    // `bench` times the CUDA kernels: without a driver it says the backend is missing, as `run`
    // and `check` do.
    if !Path::new("/dev/nvidiactl").exists() {
        let e = run(&["bench", "residual.json", "--bind", "T=64"]);
        assert!(
            e.starts_with("error: backend `cuda` is not available: the CUDA driver"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn explain_lists_the_entries_each_size_launches() {
    let dir = tempfile::tempdir().unwrap();
    let model = repo().join("examples/gpt2-mlp/model.json");
    let model = model.to_str().unwrap();
    let launches = |extra: &[&str]| {
        let mut args = vec!["compile", model, "--explain", "--target", "cuda:sm_90a"];
        args.extend_from_slice(extra);
        let o = succeeds(dir.path(), &args);
        let at = o
            .stdout
            .find("launches at ")
            .unwrap_or_else(|| panic!("no launches in:\n{}", o.stdout));
        let lines: Vec<String> = o.stdout[at..]
            .lines()
            .take_while(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        lines
    };
    // T = 1000: the up projection's 128 ping-pong tiles, one a CTA, on the cooperative entry;
    // the down projection's 32 tiles of 128 x 192 would split K, so its 128 x 128 entry runs,
    // split in two (48 tiles on 96 CTAs).
    let l = launches(&["--bind", "T=1000"]);
    assert_eq!(
        l[0], "launches at T=1000 on 132 SMs, sm_90a kernels:",
        "{l:?}"
    );
    assert!(
        l[1].contains("_pp_coop, tiles 128x192, grid 128x1x1"),
        "{l:?}"
    );
    assert!(
        l[2].contains("_short_splitk, tiles 128x128, grid 96x1x1, workspace "),
        "{l:?}"
    );
    // T = 8192: every kernel's own entry on a full grid.
    let l = launches(&["--bind", "T=8192"]);
    assert!(
        l[1].ends_with("_wgmma_tma_128x192x64_pp, tiles 128x192, grid 132x1x1"),
        "{l:?}"
    );
    assert!(
        l[2].ends_with("_wgmma_tma_128x192x64, tiles 128x192, grid 132x1x1"),
        "{l:?}"
    );
    // On 114 SMs the grids follow.
    let l = launches(&["--bind", "T=8192", "--sms", "114"]);
    assert_eq!(
        l[0], "launches at T=8192 on 114 SMs, sm_90a kernels:",
        "{l:?}"
    );
    assert!(l[1].ends_with("grid 114x1x1"), "{l:?}");
    // T = 8: the small-M entries.
    let l = launches(&["--bind", "T=8"]);
    assert!(l[1].contains("_gemv_m8, "), "{l:?}");
    // Without bindings: the entries by size of the one symbolic dimension, as ranges.
    let o = succeeds(
        dir.path(),
        &["compile", model, "--explain", "--target", "cuda:sm_90a"],
    );
    let map: Vec<&str> = o.stdout[o
        .stdout
        .find("entries by size, up to 16384, on 132 SMs, sm_90a kernels:")
        .unwrap_or_else(|| panic!("no entry map in:\n{}", o.stdout))..]
        .lines()
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(map.len(), 3, "{map:?}");
    assert!(
        map[1].ends_with(
            "T 1-8 gemv_m8; 9-16 gemv_m16; 17-32 gemv_m32; 33-64 gemv_m64; 65-1024 coop; 1025- own"
        ),
        "{map:?}"
    );
    assert!(
        map[2].contains(": T 1-8 gemv_m8; 9-16 gemv_m16; 17-32 gemv_m32; 33-64 gemv_m64; 65-1408 short_splitk; 1409-2816 short; 2817-4224 own; "),
        "{map:?}"
    );
    // Without a target the artifacts are sm_90's, and the launches listed are those of a run
    // on Hopper, which compiles the sm_90a kernels; a target asked for lists its own.
    let o = succeeds(
        dir.path(),
        &["compile", model, "--explain", "--bind", "T=8192"],
    );
    assert!(
        o.stdout.contains(
            "launches at T=8192 on 132 SMs, sm_90a kernels (a run on Hopper compiles them; the \
             artifacts are sm_90):\n  gemm_bias_gelu_tanh_bf16_nt: \
             mlpc_gemm_bias_gelu_tanh_bf16_nt_wgmma_tma_128x192x64_pp, "
        ),
        "{}",
        o.stdout
    );
    let o = succeeds(
        dir.path(),
        &[
            "compile",
            model,
            "--explain",
            "--bind",
            "T=8192",
            "--target",
            "cuda:sm_80",
        ],
    );
    let at = o
        .stdout
        .find("launches at T=8192 on 132 SMs, sm_80 kernels:\n");
    let lines: Vec<&str> = o.stdout[at.expect(&o.stdout)..].lines().take(3).collect();
    assert!(lines[1..].iter().all(|l| !l.contains("wgmma")), "{lines:?}");
    // Bindings without T: one message naming the kernel and the symbol.
    let batched = repo().join("tests/cases/batched-bf16/model.json");
    let e = fails(
        dir.path(),
        &[
            "compile",
            batched.to_str().unwrap(),
            "--explain",
            "--target",
            "cuda:sm_90a",
            "--bind",
            "B=3",
        ],
    );
    assert!(
        e.contains("error: launches: kernel `gemm_bias_silu_bf16_nt`: the launch needs symbol `T`, which is not bound"),
        "{e}"
    );
}

#[test]
fn sparse_gemv_entries_are_the_default_and_left_out_by_option_or_environment() {
    let dir = scratch(&[]);
    std::fs::write(
        dir.path().join("bsr.json"),
        r#"{"mlpc": 1, "name": "bsr", "dtype": "bf16", "seed": 0,
            "inputs": {"x": {"shape": ["T", 512]}},
            "layers": [{"op": "linear", "name": "fc", "in": 512, "out": 256, "bias": false}],
            "sparsity": {"fc.weight": {"block": [32, 32], "density": 0.25}}}"#,
    )
    .unwrap();
    let args = [
        "compile",
        "bsr.json",
        "--explain",
        "--target",
        "cuda:sm_90a",
        "--bind",
        "T=16",
    ];
    let launch = |env: &[(&str, &str)], extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(args)
            .args(extra)
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .env_remove("MLPC_SPARSE_GEMV")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let at = stdout.find("launches at T=16").expect("launches");
        stdout[at..].lines().nth(1).unwrap().to_string()
    };
    assert!(!launch(&[("MLPC_SPARSE_GEMV", "0")], &[]).contains("_gemv_"));
    assert!(!launch(&[], &["--no-sparse-gemv"]).contains("_gemv_"));
    // One CTA a block row.
    for l in [launch(&[], &[]), launch(&[("MLPC_SPARSE_GEMV", "1")], &[])] {
        assert!(l.ends_with("_gemv_m16, tiles 32x1, grid 8x1x1"), "{l}");
    }
}

/// A reader that stops reading stdout (`mlpc compile --explain | head`) is no error: the
/// command still writes its files and succeeds, with no panic. A write that fails otherwise (a
/// full disk behind a redirect) is one message and status 1.
#[test]
fn stdout_closed_by_its_reader_or_failing() {
    let dir = scratch(&["models/residual.json"]);
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "compile",
        "residual.json",
        "-o",
        "out",
        "--explain",
        "--target",
        "cpu",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlpc"))
        .args(args)
        .current_dir(dir.path())
        .env("MLPC_CACHE_DIR", cache.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the command prints anything: its first write meets EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(dir.path().join("out/explain.txt").is_file());

    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
        .args(args)
        .current_dir(dir.path())
        .env("MLPC_CACHE_DIR", cache.path())
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr
            .matches("error: cannot write to standard output: ")
            .count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// NaN and infinities in the weights are data: `check` passes a backend that reproduces them
/// where the reference has them, and compares the finite rest.
#[test]
fn check_compares_nan_and_inf_weights_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut w: Vec<f64> = (0..32).map(|i| (i as f64 - 15.5) / 16.0).collect();
    w[5] = f64::NAN;
    w[18] = f64::INFINITY;
    let weights: Tensors = [
        (
            "fc.weight".to_string(),
            HostTensor::from_f64(DType::F32, vec![8, 4], &w).unwrap(),
        ),
        (
            "fc.bias".to_string(),
            HostTensor::from_f64(DType::F32, vec![8], &[0.25; 8]).unwrap(),
        ),
    ]
    .into();
    mlpc_frontend::write_tensors(&d.join("w.safetensors"), &weights).unwrap();
    fs::write(
        d.join("m.json"),
        r#"{ "mlpc": 1, "name": "specials", "dtype": "f32", "weights": "w.safetensors",
             "inputs": { "x": { "shape": ["T", 4] } },
             "layers": [ { "op": "linear", "weight": "fc.weight", "bias": "fc.bias" } ] }"#,
    )
    .unwrap();
    let out = succeeds(d, &["check", "m.json", "--bind", "T=3", "--backend", "cpu"]);
    assert!(
        out.stdout.starts_with("ok   specials on cpu"),
        "{}",
        out.stdout
    );
}

/// A `--bind` of a symbol the model does not have (a misspelling) is one error on every command
/// that takes bindings, and writes nothing, even when the real symbols are bound too.
#[test]
fn a_binding_of_an_unknown_symbol_is_an_error() {
    let dir = scratch(&["models/residual.json"]);
    let want = "error: symbol `Q` is bound, but no input of the model has it (its symbols: T)";
    for args in [
        &[
            "check",
            "residual.json",
            "--backend",
            "cpu",
            "--bind",
            "T=3",
            "--bind",
            "Q=5",
        ][..],
        &[
            "gen-inputs",
            "residual.json",
            "-o",
            "in.safetensors",
            "--bind",
            "T=3",
            "--bind",
            "Q=5",
        ],
        &[
            "compile",
            "residual.json",
            "--target",
            "cpu",
            "--bind",
            "T=3",
            "--bind",
            "Q=5",
        ],
        &["compile", "residual.json", "--explain", "--bind", "Q=5"],
    ] {
        let t = fails(dir.path(), args);
        assert!(t.contains(want), "{t}");
    }
}

/// A bf16 output out of tolerance only because the source graph rounds each intermediate that the
/// fused kernel keeps in f32 (here relu(g) * u, then squared twice, which quadruples its relative
/// error) still fails, with a note giving its error against the optimised graph.
#[test]
fn a_check_passes_fused_rounding_as_accurate_as_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("m.json"),
        r#"{ "mlpc": 1, "name": "gated-squares", "dtype": "bf16", "seed": 3,
  "params": { "gate.weight": [32, 16], "up.weight": [32, 16] },
  "inputs": { "x": { "shape": ["T", 16] } },
  "nodes": [
    { "name": "gate.t", "op": "transpose", "inputs": ["gate.weight"] },
    { "name": "up.t", "op": "transpose", "inputs": ["up.weight"] },
    { "name": "g", "op": "matmul", "inputs": ["x", "gate.t"] },
    { "name": "u", "op": "matmul", "inputs": ["x", "up.t"] },
    { "name": "a", "op": "relu", "inputs": ["g"] },
    { "name": "h", "op": "mul", "inputs": ["a", "u"] },
    { "name": "h2", "op": "mul", "inputs": ["h", "h"] },
    { "name": "h4", "op": "mul", "inputs": ["h2", "h2"] }
  ],
  "outputs": ["h4"] }"#,
    )
    .unwrap();
    let args = |seed| {
        [
            "check",
            "m.json",
            "--backend",
            "cpu",
            "--bind",
            "T=16",
            "--seed",
            seed,
        ]
    };
    // Out of tolerance of the source graph, which rounds every product to bf16, and about as
    // near the unrounded math as it: the check passes and says why.
    let o = succeeds(dir.path(), &args("3"));
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[0].starts_with("ok   gated-squares on cpu: output `h4`"),
        "{lines:?}"
    );
    let error: f64 = lines[0]
        .split("relative error ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|e| e.parse().ok())
        .unwrap();
    assert!(error > 1e-2, "{lines:?}");
    assert!(
        lines[1].trim_start().starts_with(
            "(about as near the graph's unrounded math as the reference interpreter, which \
             rounds every intermediate: "
        ),
        "{lines:?}"
    );
    // An output within tolerance gets no note.
    let o = succeeds(dir.path(), &args("2"));
    assert_eq!(o.stdout.lines().count(), 1, "{}", o.stdout);
}

/// Outputs whose roundings move them by about the tolerance (random models' outputs, kept as
/// found): a deep chain of bf16 products whose fused kernels, on these inputs, land further from
/// the unrounded math than twice the source graph's roundings do, and an f32 chain of products
/// over a 5-term sum that cancels, where the CPU kernels' f32 sums and the reference's rounded
/// values trade places between seeds. Both are within twice the distance that random roundings
/// of every stored value and product term take them on average: the check passes each as an
/// ill-conditioned output and says why. Before the random roundings were measured, each failed
/// at these seeds.
#[test]
fn a_check_passes_an_ill_conditioned_output_as_near_as_random_roundings() {
    let dir = scratch(&["models/deep-products.json", "models/cancelling-sum.json"]);
    for (model, output, tokens, seed) in [
        ("deep-products", "mul81", "T=17", "0"),
        ("cancelling-sum", "mul83", "T=5", "9"),
        ("cancelling-sum", "mul83", "T=5", "20"),
    ] {
        let file = format!("{model}.json");
        let args = [
            "check",
            file.as_str(),
            "--backend",
            "cpu",
            "--bind",
            tokens,
            "--seed",
            seed,
        ];
        let mut args = args.to_vec();
        args.extend(["--json", "check.jsonl"]);
        let o = succeeds(dir.path(), &args);
        let lines: Vec<&str> = o.stdout.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("ok   {model} on cpu: output `{output}`")))
            .unwrap_or_else(|| panic!("{lines:?}"));
        let error: f64 = lines[at]
            .split("relative error ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|e| e.parse().ok())
            .unwrap();
        let tolerance = if model == "deep-products" { 1e-2 } else { 1e-5 };
        assert!(error > tolerance, "{lines:?}");
        let note = lines[at + 1].trim_start();
        assert!(
            note.starts_with(
                "(about as near the graph's unrounded math as random roundings take it, an \
                 ill-conditioned output: "
            ),
            "{lines:?}"
        );
        // Further from the math than twice the reference's own roundings.
        let numbers: Vec<f64> = note
            .split(|c: char| !(c.is_ascii_digit() || "e.-".contains(c)))
            .filter_map(|w| w.trim_end_matches('.').parse().ok())
            .collect();
        let (backend, reference) = (numbers[0], numbers[numbers.len() - 1]);
        assert!(backend > 2.0 * reference, "{note}");
    }
    // `--json` appends one line a check, with the distances the notes give.
    let json = fs::read_to_string(dir.path().join("check.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{json}");
    for line in &lines {
        assert_eq!(line["ok"], true, "{line}");
        let ill: Vec<&serde_json::Value> = line["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["ill_conditioned"] == true)
            .collect();
        assert_eq!(ill.len(), 1, "{line}");
        let u = &ill[0]["unrounded"];
        let (b, n) = (u["backend"].as_f64(), u["random_roundings"].as_f64());
        assert!(b.zip(n).is_some_and(|(b, n)| b <= 2.0 * n), "{line}");
        assert!(ill[0]["error"].as_f64().unwrap() > ill[0]["tolerance"].as_f64().unwrap());
    }
    assert_eq!(lines[2]["seed"], 20, "{json}");
}

/// An output no machine holds (2^40 elements from two 4 MiB operands) is an error that names the
/// node or buffer, on the reference interpreter and on the CPU backend, not an abort in the
/// allocator.
#[test]
fn outputs_past_memory_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(
        d.join("outer.json"),
        r#"{"mlpc": 1, "name": "outer", "dtype": "f32", "params": {"w": [1048576, 1]},
            "inputs": {"x": {"shape": ["T", 1]}},
            "nodes": [{"name": "wt", "op": "transpose", "inputs": ["w"]},
                      {"name": "y", "op": "matmul", "inputs": ["x", "wt"]}],
            "outputs": ["y"]}"#,
    )
    .unwrap();
    let x = tensors(&[("x", DType::F32, &[1 << 20, 1], 0.0)]);
    mlpc_frontend::write_tensors(&d.join("in.safetensors"), &x).unwrap();
    for (backend, what) in [("reference", "node `y`"), ("cpu", "buffer `y`")] {
        let args = [
            "run",
            "outer.json",
            "--input",
            "in.safetensors",
            "--output",
            "out.safetensors",
            "--backend",
            backend,
        ];
        let t = fails(d, &args);
        assert!(
            t.contains(what) && t.contains("1099511627776 elements do not fit in memory"),
            "{t}"
        );
    }
}

/// An on / off switch in the environment with a value that is none of its spellings stops every
/// command with one message naming it (before, `MLPC_F32_FP64_TENSOR_CORES=false` forced the
/// FP64 tensor cores and `MLPC_BSR_WALK=true` was ignored); `false` is off.
#[test]
fn misspelt_switches_in_the_environment_are_errors() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let with = |name: &str, value: &str, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(args)
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env(name, value)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let gen = [
        "gen-inputs",
        "residual.json",
        "--bind",
        "T=2",
        "-o",
        "in.safetensors",
    ];
    for name in [
        "MLPC_F32_FP64_TENSOR_CORES",
        "MLPC_SPARSE_GEMV",
        "MLPC_BSR_WALK",
        "MLPC_NO_GRAPHS",
        "MLPC_NO_EARLY_LAUNCH",
        "MLPC_CPU_BF16_DOT",
    ] {
        let (code, stdout, stderr) = with(name, "maybe", &gen);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        assert!(stdout.is_empty(), "{name}: {stdout}");
        assert_eq!(
            stderr,
            format!(
                "error: environment variable {name}=\"maybe\": expected 1 or 0 (or true / \
                 false, on / off, yes / no; empty is the same as unset)\n"
            )
        );
        assert!(!d.join("in.safetensors").exists());
        let (code, _, stderr) = with(name, "false", &gen);
        assert_eq!(code, Some(0), "{name}: {stderr}");
        fs::remove_file(d.join("in.safetensors")).unwrap();
    }
}

/// A tensor the model does not take is an unexpected input, whatever its dtype (an integer one
/// was refused for its dtype, as if the model could have read it).
#[test]
fn an_extra_integer_tensor_is_an_unexpected_input() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let header = r#"{"extra":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"r":{"dtype":"F32","shape":[2,8],"data_offsets":[16,80]},"x":{"dtype":"F32","shape":[2,8],"data_offsets":[80,144]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 144]);
    fs::write(d.join("in.safetensors"), bytes).unwrap();
    let t = fails(
        d,
        &[
            "run",
            "residual.json",
            "-i",
            "in.safetensors",
            "-o",
            "out.safetensors",
            "--backend",
            "reference",
        ],
    );
    assert!(
        t.contains("error: unexpected input `extra`: the model's inputs are `x`, `r`"),
        "{t}"
    );
    // A compiled directory reads only the tensors its guards check, and refuses the others
    // (it read every tensor of the file, and refused this one for its dtype).
    succeeds(
        d,
        &["compile", "residual.json", "-o", "build", "--emit-weights"],
    );
    let t = fails(
        d,
        &[
            "run",
            "build",
            "-i",
            "in.safetensors",
            "-o",
            "out.safetensors",
        ],
    );
    assert!(
        t.contains("error: unexpected input `extra`: the compiled model's inputs are `x`, `r`"),
        "{t}"
    );
}

/// A generated weight whose bytes cannot be allocated is an error naming it, not an abort
/// (the process is limited to 700 MB of address space; the weight takes 1 GiB).
#[test]
fn a_weight_past_memory_is_an_error() {
    let dir = scratch(&[]);
    let d = dir.path();
    fs::write(
        d.join("big.json"),
        r#"{ "mlpc": 1, "name": "big", "dtype": "f32", "seed": 1,
  "inputs": { "x": { "shape": ["T", 16384] } },
  "params": { "w": [16384, 16384] },
  "nodes": [ { "name": "wt", "op": "transpose", "inputs": ["w"] },
             { "name": "y", "op": "matmul", "inputs": ["x", "wt"] } ],
  "outputs": ["y"] }"#,
    )
    .unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v 700000 && exec '{}' compile big.json --target cpu -o out",
            env!("CARGO_BIN_EXE_mlpc")
        ))
        .current_dir(d)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "error: big.json:4:60: at `nodes[0].inputs[0]`: the generated tensor `w` [16384, 16384]: \
         its 1073741824 bytes do not fit in memory (the weights generated before it hold 0 \
         bytes)\n"
    );
    assert!(!d.join("out").exists());
}

/// A backend named on the command line that this machine cannot run is refused before the model
/// is read (a large model's weights took half a minute to generate before the refusal). The CUDA
/// driver is made unusable on any machine by a library of its name that is not it.
#[test]
fn an_unavailable_backend_is_refused_before_the_model_is_read() {
    let dir = scratch(&[]);
    let d = dir.path();
    let path = impostor_library(d, "libcuda.so");
    for args in [
        &["check", "absent.json", "--bind", "T=2"][..],
        &[
            "run",
            "absent.json",
            "-i",
            "in.safetensors",
            "-o",
            "out.safetensors",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(args)
            .args(["--backend", "cuda"])
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env("LD_LIBRARY_PATH", &path)
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.starts_with("error: backend `cuda` is not available: ")
                && !stderr.contains("absent.json"),
            "{args:?}: {stderr}"
        );
    }
}

/// `MLPC_CACHE_DIR` naming a file, or a path under one, is an error that says a file is where
/// a directory was expected (the OS says only "File exists" / "Not a directory").
#[test]
fn a_cache_dir_that_is_a_file_is_named() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    fs::write(d.join("cache"), b"").unwrap();
    for value in ["cache", "cache/kernels"] {
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(["compile", "residual.json", "-o", "out"])
            .args(["--target", "cuda:sm_90a"])
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env("MLPC_CACHE_DIR", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{value}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: kernel cache `{value}`: `cache` is a file, not a directory (set \
                 MLPC_CACHE_DIR to a writable directory, or compile without the cache)\n"
            )
        );
        assert!(!d.join("out").exists(), "{value}");
    }
}

/// `MLPC_NVRTC_LIB` naming a library that is not NVRTC (the C library) is an error naming it on
/// every compile, the default one that compiles CUDA only where NVRTC is found included (it used
/// to pass with an explicit target and read as "NVRTC was not found" without one); empty is unset.
#[test]
fn an_nvrtc_library_that_is_not_nvrtc_is_an_error() {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .expect("the C library in this process's maps")
        .to_string();
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let compile = |value: &str, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(["compile", "residual.json", "-o", "out", "--no-cache"])
            .args(extra)
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env("MLPC_NVRTC_LIB", value)
            .output()
            .unwrap()
    };
    for extra in [&[][..], &["--target", "cuda:sm_90a"][..]] {
        let out = compile(&libc, extra);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: MLPC_NVRTC_LIB names `{libc}`, which could not be loaded: it has no \
                 nvrtcVersion: not an NVRTC library\n"
            ),
            "{extra:?}"
        );
        assert!(!d.join("out").exists());
    }
    let out = compile("", &["--target", "cuda:sm_90a"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An f16 layer that overflows feeding a block-sparse one: the reference (the pruned weights
/// multiplied densely) has NaN where an infinity meets a dropped block's zeros, the CPU
/// backend skips dropped blocks (as the optimised graph does). The check fails, and its note says why instead of blaming
/// the rounding of fused intermediates (what it said before).
#[test]
fn a_check_failing_on_nan_says_it_is_not_rounding() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(
        d.join("model.json"),
        r#"{"mlpc": 1, "dtype": "f16", "inputs": {"x": {"shape": ["T", 4]}},
            "layers": [{"op": "linear", "weight": "w1"}, {"op": "linear", "weight": "w2"}],
            "sparsity": {"w2": {"block": [16, 16]}},
            "weights": "w.safetensors"}"#,
    )
    .unwrap();
    // w1's first row overflows f16 for most inputs; the rest are small.
    let w1: Vec<f64> = (0..64 * 4)
        .map(|i| {
            if i < 4 {
                60000.0
            } else {
                ((i * 37 % 17) as f64 - 8.0) / 20.0
            }
        })
        .collect();
    // Blocks of 16 x 16, kept (the rest zero): (0, 0), (1, 0), (2, 1), (3, 2). The overflowing
    // column 0 of the hidden layer meets block column 0: kept in block rows 0 and 1 only, so the
    // kernels give NaN in outputs 0-31 (the CPU's panels pair block rows 0-1 and 2-3) and the
    // reference in all 64.
    let kept = [(0, 0), (1, 0), (2, 1), (3, 2)];
    let w2: Vec<f64> = (0..64 * 64)
        .map(|i| {
            if kept.contains(&(i / 64 / 16, i % 64 / 16)) {
                ((i * 53 % 29) as f64 - 14.0) / 150.0
            } else {
                0.0
            }
        })
        .collect();
    let w: Tensors = [
        (
            "w1",
            HostTensor::from_f64(DType::F16, vec![64, 4], &w1).unwrap(),
        ),
        (
            "w2",
            HostTensor::from_f64(DType::F16, vec![64, 64], &w2).unwrap(),
        ),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect();
    mlpc_frontend::write_tensors(&d.join("w.safetensors"), &w).unwrap();
    let out = mlpc(
        d,
        &[
            "check",
            "model.json",
            "--backend",
            "cpu",
            "--bind",
            "T=64",
            "--json",
            "check.jsonl",
        ],
    );
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    // The JSON line is written for a failed check too; its NaN error is null.
    let line: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(d.join("check.jsonl")).unwrap()).unwrap();
    assert_eq!(line["ok"], false, "{line}");
    assert_eq!(line["bindings"], serde_json::json!(["T=64"]), "{line}");
    let failed = line["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["ok"] == false)
        .unwrap_or_else(|| panic!("{line}"));
    assert!(failed["error"].is_null(), "{line}");
    assert!(failed["optimized_graph"].is_number(), "{line}");
    assert!(
        out.stdout.contains("relative error NaN")
            && out
                .stdout
                .contains("the reference has a NaN or an infinity where the optimised")
            && out
                .stdout
                .contains("block-sparse kernels skip dropped blocks")
            && !out.stdout.contains("rounding of intermediates"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains(
            "its output differs from the reference interpreter's by more than the \
                       tolerance, but is within it of the optimised graph"
        ),
        "{}",
        out.stderr
    );
}

/// Mistakes about paths, bindings and file encodings name the thing and what was expected
/// (before: "No such device (os error 19)" for a directory given as a tensors file, the name
/// of a temporary file for a missing output directory, "cannot read `ex/plan.json`" for a
/// directory that is not a compiled one, `compile --bind T=0` and conflicting bindings
/// accepted, "expected value" for a byte-order mark).
#[test]
fn path_binding_and_encoding_mistakes_say_what_was_expected() {
    let dir = residual_with_inputs();
    let d = dir.path();
    fs::create_dir(d.join("adir")).unwrap();
    fs::create_dir(d.join("notcompiled")).unwrap();
    fs::copy(d.join("residual.json"), d.join("notcompiled/model.json")).unwrap();
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend(fs::read(d.join("residual.json")).unwrap());
    fs::write(d.join("bom.json"), bom).unwrap();
    fs::write(d.join("empty.json"), "").unwrap();
    let compile = |model: &str, binds: &[&str]| {
        let mut args = vec!["compile", model, "--target", "cpu"];
        for b in binds {
            args.extend(["--bind", b]);
        }
        fails(d, &args)
    };
    let run = |input: &str, output: &str, model: &str| {
        fails(
            d,
            &["run", model, "-i", input, "-o", output, "--backend", "cpu"],
        )
    };
    for (t, want) in [
        (
            run("adir", "y.safetensors", "residual.json"),
            "error: adir: cannot read: it is a directory, expected a safetensors file",
        ),
        (
            run("in.safetensors", "nodir/y.safetensors", "residual.json"),
            "error: nodir/y.safetensors: cannot write: the directory `nodir` does not exist",
        ),
        (
            fails(
                d,
                &[
                    "run",
                    "notcompiled",
                    "-i",
                    "in.safetensors",
                    "-o",
                    "y.safetensors",
                ],
            ),
            "error: compiled directory `notcompiled`: it holds no plan.json",
        ),
        (
            compile("residual.json", &["T=0"]),
            "error: symbol `T` is bound to 0; dimensions are at least 1",
        ),
        (
            compile("residual.json", &["T=5", "T=6"]),
            "error: symbol `T` is bound twice, to 5 and 6",
        ),
        (
            compile("bom.json", &[]),
            "error: bom.json:1:1: invalid JSON: the file starts with a UTF-8 byte-order mark",
        ),
        (
            compile("empty.json", &[]),
            "error: empty.json:1:0: invalid JSON: the file is empty",
        ),
    ] {
        assert!(t.contains(want), "{want}\n{t}");
    }
}

/// A copy of the C++ runtime's unwinder under `name` in a directory put first on the loader's
/// path: a library named like NVRTC or the CUDA driver that is neither. Returns the directory
/// (kept alive by the caller's scratch directory) and the `LD_LIBRARY_PATH` value.
fn impostor_library(d: &Path, name: &str) -> String {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    let unwinder = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libgcc_s.so.1"))
        .expect("the unwinder in this process's maps")
        .to_string();
    let libs = d.join("libs");
    fs::create_dir_all(&libs).unwrap();
    fs::copy(&unwinder, libs.join(name)).unwrap();
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", libs.display()),
        _ => libs.display().to_string(),
    }
}

/// A library named like NVRTC on the loader's path that is not NVRTC (`libnvrtc.so`, the first
/// name cudarc opens) is an error naming it, on the default compile too (before, cudarc
/// panicked looking up `nvrtcVersion` in it: exit 101).
#[test]
fn a_library_named_nvrtc_on_the_loader_path_that_is_not_nvrtc_is_an_error() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let path = impostor_library(d, "libnvrtc.so");
    for extra in [&[][..], &["--target", "cuda:sm_90a"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args(["compile", "residual.json", "-o", "out", "--no-cache"])
            .args(extra)
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env("LD_LIBRARY_PATH", &path)
            .env_remove("MLPC_NVRTC_LIB")
            .output()
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: `libnvrtc.so`, the NVRTC library the dynamic loader finds by name \
                 (LD_LIBRARY_PATH, the ld cache), cannot be used: it has no nvrtcVersion: not \
                 an NVRTC library"
            ),
            "{extra:?}: {stderr}"
        );
        assert!(!d.join("out").exists());
    }
}

/// The same for the CUDA driver (`libcuda.so`): `--backend cuda` is an error naming the
/// library, and a run left to pick its backend takes the CPU (before, cudarc panicked in
/// `cuInit`'s lookup: exit 101).
#[test]
fn a_library_named_like_the_driver_that_is_not_one_is_an_error() {
    let dir = residual_with_inputs();
    let d = dir.path();
    let path = impostor_library(d, "libcuda.so");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mlpc"))
            .args([
                "run",
                "residual.json",
                "-i",
                "in.safetensors",
                "-o",
                "y.safetensors",
            ])
            .args(extra)
            .current_dir(d)
            .env("NO_COLOR", "1")
            .env("LD_LIBRARY_PATH", &path)
            .output()
            .unwrap()
    };
    let out = run(&["--backend", "cuda"]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "`libcuda.so`, the CUDA driver library the dynamic loader finds by name \
             (LD_LIBRARY_PATH, the ld cache), cannot be used: it has no cuInit: not the CUDA \
             driver"
        ),
        "{stderr}"
    );
    let out = run(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles of two models into one output directory at once each replace it whole: none fails
/// on another's half-done swap (before: about one in four of four concurrent compiles failed
/// with "Directory not empty" or "No such file"), and the directory ends as one compilation.
#[test]
fn concurrent_compiles_into_one_directory_all_succeed() {
    let dir = scratch(&["models/residual.json", "models/half-sparse-glu.json"]);
    let d = dir.path();
    // Without CUDA kernels the compiles are short, so their swaps overlap.
    for _ in 0..12 {
        let children: Vec<_> = ["residual.json", "half-sparse-glu.json"]
            .iter()
            .cycle()
            .take(4)
            .map(|m| spawn(d, &["compile", m, "-o", "out", "--target", "cpu"]))
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // One compilation's files: the graph printed is the plan's model.
        let plan: serde_json::Value =
            serde_json::from_slice(&fs::read(d.join("out/plan.json")).unwrap()).unwrap();
        let graph = fs::read_to_string(d.join("out/graph.txt")).unwrap();
        let name = plan["name"].as_str().unwrap();
        assert!(
            graph.starts_with(&format!("graph \"{name}\"")),
            "{name}: {graph}"
        );
    }
    // No staging directories left beside it.
    let left: Vec<_> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `mlpc run DIR` decides between a compiled directory and a model file under the lock a
/// compile swaps `DIR` in under: while other compiles replace `DIR`, every run reads it as the
/// directory it is (before, a run during a swap found no `DIR` and reported a missing model
/// file). A directory compiled for the CPU holds no CUDA kernels, and the error says so.
#[test]
fn runs_of_a_directory_being_replaced_see_the_directory() {
    let dir = residual_with_inputs();
    let d = dir.path();
    let compile = || {
        spawn(
            d,
            &["compile", "residual.json", "-o", "out", "--target", "cpu"],
        )
    };
    let compiled = |c: std::process::Child| {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    compiled(compile());
    let run = ["run", "out", "-i", "in.safetensors", "-o", "y.safetensors"];
    let t = fails(d, &run);
    assert!(
        t.contains("holds no kernels/") && t.contains("--backend cpu"),
        "{t}"
    );
    for _ in 0..16 {
        let compiles: Vec<_> = (0..3).map(|_| compile()).collect();
        let runs: Vec<_> = (0..3).map(|_| spawn(d, &run)).collect();
        for r in runs {
            let out = r.wait_with_output().unwrap();
            let t = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.code() == Some(1) && t.contains("holds no kernels/"),
                "{t}"
            );
        }
        for c in compiles {
            compiled(c);
        }
    }
}

/// mlpc in `dir` with its caches in `dir/cache` (`MLPC_CACHE_DIR=cache`, no size cap), and `env`
/// set over that.
fn mlpc_in_cache(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlpc"));
    cmd.args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("MLPC_CACHE_DIR", "cache")
        .env_remove("MLPC_CACHE_MAX_SIZE")
        .envs(env.iter().copied());
    outcome(cmd)
}

/// The transcript of `mlpc_in_cache(dir, args, env)`, with the variables before the command.
fn cache_transcript(o: &Outcome, args: &[&str], env: &[(&str, &str)]) -> String {
    let vars: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    o.transcript(args)
        .replacen("$ mlpc", &format!("$ {vars}mlpc"), 1)
}

/// `kind` kernels of the cache in `cache` (a key of 64 `kind`s), 1000 bytes each, the first
/// used longest ago.
fn fake_kernels(cache: &Path, kinds: &[char]) -> Vec<String> {
    let now = std::time::SystemTime::now();
    kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let key = kind.to_string().repeat(64);
            for (ext, n) in [("cubin", 800), ("ptx", 150), ("log", 50)] {
                fs::write(cache.join(format!("{key}.{ext}")), vec![b'x'; n]).unwrap();
            }
            let age = std::time::Duration::from_secs(600 * (kinds.len() - i) as u64);
            fs::File::options()
                .write(true)
                .open(cache.join(format!("{key}.cubin")))
                .unwrap()
                .set_modified(now - age)
                .unwrap();
            key
        })
        .collect()
}

/// `mlpc cache` shows the kernels and the autotune cache in MLPC_CACHE_DIR with their sizes;
/// `trim` removes the least recently used kernels, `clear` every kernel and the autotune cache,
/// and neither anything else; a directory not made yet is empty and stays so.
#[test]
fn cache_shows_clears_and_trims_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut transcript = String::new();
    let mut run = |args: &[&str]| {
        let o = mlpc_in_cache(d, args, &[]);
        assert_eq!(o.code, 0, "{}", o.transcript(args));
        assert!(o.stderr.is_empty(), "{}", o.transcript(args));
        transcript += &o.transcript(args);
        transcript.push('\n');
    };
    run(&["cache"]);
    run(&["cache", "clear"]);
    run(&["cache", "trim", "--max-size", "1K"]);
    assert!(!d.join("cache").exists());

    let cache = d.join("cache");
    fs::create_dir(&cache).unwrap();
    let keys = fake_kernels(&cache, &['a', 'b', 'c']);
    fs::write(cache.join(format!("{}.Xy12Zw.tmp", keys[0])), b"half").unwrap();
    fs::write(cache.join("notes.txt"), b"mine").unwrap();
    let tile = |n: u64| mlpc::TileCacheEntry {
        key: mlpc::TileKey {
            dtype: DType::Bf16,
            dual: false,
            k: 768,
            n,
            sparse: false,
            block: [0, 0],
        },
        arch: mlpc::Arch::Sm90a,
        device: "NVIDIA H200 (sm_90)".to_string(),
        m_bucket: 8192,
        choice: mlpc::TileChoice::new(128, 1),
        median_ms: 0.25,
    };
    mlpc::TileCache {
        entries: vec![tile(768), tile(3072)],
    }
    .save(&cache.join("autotune.json"))
    .unwrap();

    run(&["cache"]);
    // 3000 bytes of kernels, at most 2048 kept: the oldest goes, with the temporary file.
    run(&["cache", "trim", "--max-size", "2K"]);
    let names = |keys: &[&String]| {
        let mut n: Vec<PathBuf> = keys
            .iter()
            .flat_map(|k| ["cubin", "log", "ptx"].map(|e| PathBuf::from(format!("{k}.{e}"))))
            .chain(["autotune.json", "notes.txt"].map(PathBuf::from))
            .collect();
        n.sort();
        n
    };
    assert_eq!(listing(&cache), names(&[&keys[1], &keys[2]]));
    run(&["cache", "info"]);
    run(&["cache", "trim", "--max-size", "2000"]);
    run(&["cache", "clear"]);
    assert_eq!(listing(&cache), [PathBuf::from("notes.txt")]);
    run(&["cache"]);
    insta::assert_snapshot!("cache-commands", transcript);
}

/// A size that is none, a cache directory that is a file or under one, and a cap in the
/// environment that is no size: one message each, naming the option or variable and the value,
/// or the path; exit status 1, nothing changed.
#[test]
fn cache_mistakes_name_the_option_or_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("file"), b"").unwrap();
    let mut transcript = String::new();
    let mut fails = |args: &[&str], env: &[(&str, &str)]| {
        let before = listing(d);
        let o = mlpc_in_cache(d, args, env);
        let t = cache_transcript(&o, args, env);
        assert_eq!(o.code, 1, "{t}");
        assert!(o.stderr.starts_with("error: "), "{t}");
        assert!(!o.stderr.contains("panicked"), "{t}");
        assert!(o.stdout.is_empty(), "{t}");
        assert_eq!(listing(d), before, "{t}");
        transcript += &t;
        transcript.push('\n');
    };
    for size in ["12X", "1.5.2G", "-1", "", "2 G B", "1e9"] {
        fails(&["cache", "trim", "--max-size", size], &[]);
    }
    fails(&["cache", "trim"], &[]);
    for cache in ["file", "file/kernels"] {
        let env = [("MLPC_CACHE_DIR", cache)];
        fails(&["cache"], &env);
        fails(&["cache", "clear"], &env);
        fails(&["cache", "trim", "--max-size", "0"], &env);
    }
    let env = [("MLPC_CACHE_MAX_SIZE", "lots")];
    fails(&["cache"], &env);
    insta::assert_snapshot!("cache-mistakes", transcript);
}

/// `MLPC_CACHE_MAX_SIZE` trims the kernel cache after a compile that stored kernels, and a value
/// that is no size stops every compile (a CPU one too) before anything is written.
#[test]
fn a_cache_size_cap_trims_after_compiling() {
    let dir = scratch(&["models/residual.json"]);
    let d = dir.path();
    let compile = |target: &str, env: &[(&str, &str)]| {
        let args = ["compile", "residual.json", "-o", "out", "--target", target];
        let o = mlpc_in_cache(d, &args, env);
        assert_eq!(o.code, 0, "{}", cache_transcript(&o, &args, env));
        assert!(d.join("out/kernels").is_dir());
    };
    let kernel_files = || {
        listing(&d.join("cache"))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "cubin"))
            .count()
    };
    // Capped at 0: compiled, and nothing kept.
    compile("cuda:sm_90a", &[("MLPC_CACHE_MAX_SIZE", "0")]);
    assert_eq!(kernel_files(), 0);
    // Uncapped: kept; capped again, with nothing stored (every kernel a hit): kept too.
    compile("cuda:sm_90a", &[]);
    let stored = kernel_files();
    assert!(stored > 0);
    compile("cuda:sm_90a", &[("MLPC_CACHE_MAX_SIZE", "0")]);
    assert_eq!(kernel_files(), stored);
    // A compile that stores kernels for another target trims the cache to the cap.
    compile("cuda:sm_80", &[("MLPC_CACHE_MAX_SIZE", "1")]);
    assert_eq!(kernel_files(), 0);
    // The cap is no size: an error naming it, on a compile that compiles no CUDA too.
    fs::remove_dir_all(d.join("out")).unwrap();
    for target in ["cuda:sm_90a", "cpu"] {
        let args = ["compile", "residual.json", "-o", "out", "--target", target];
        let o = mlpc_in_cache(d, &args, &[("MLPC_CACHE_MAX_SIZE", "1.5 gigs")]);
        assert_eq!(o.code, 1);
        assert!(
            o.stderr.starts_with(
                "error: MLPC_CACHE_MAX_SIZE: `1.5 gigs` is not a size (expected a number of bytes"
            ),
            "{}",
            o.stderr
        );
        assert!(!d.join("out").exists());
    }
}

/// `bench -b cpu` times the CPU backend: one line with the median and GFLOP/s, and, with
/// `--json`, a line naming the backend and the runs asked for. Options that only mean something
/// on the GPU are errors before anything is compiled, and so is timing the reference.
#[test]
fn bench_times_the_cpu_backend_when_asked() {
    let dir = scratch(&["models/f32-sparse-two-blocks.json"]);
    let d = dir.path();
    let args = [
        "bench",
        "f32-sparse-two-blocks.json",
        "-b",
        "cpu",
        "--bind",
        "T=24",
        "--heat-ms",
        "0",
        "--iters",
        "3",
        "--json",
        "b.jsonl",
    ];
    let o = succeeds(d, &args);
    assert!(
        o.stdout.starts_with("f32-sparse-two-blocks [T=24] ")
            && o.stdout.contains(" on the CPU: median ")
            && o.stdout.contains(", 3 runs), ")
            && o.stdout.contains(" GFLOP/s; after 0 ms of heat"),
        "{}",
        o.stdout
    );
    let line: serde_json::Value =
        serde_json::from_str(fs::read_to_string(d.join("b.jsonl")).unwrap().trim()).unwrap();
    assert_eq!(line["backend"], "cpu");
    assert_eq!(line["iters"], 3);
    assert_eq!(line["weight_sets"], 1);
    let (median, min) = (
        line["median_ms"].as_f64().unwrap(),
        line["min_ms"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= median, "{line}");
    assert!(line["flops"].as_f64().unwrap() > 0.0, "{line}");
    fs::remove_file(d.join("b.jsonl")).unwrap();

    for (extra, message) in [
        (
            &["-b", "cpu", "--flush-l2"][..],
            "error: benchmark: --flush-l2 is for the cuda backend, not `cpu`",
        ),
        (
            &["-b", "cpu", "--no-graphs"][..],
            "error: benchmark: --no-graphs is for the cuda backend, not `cpu`",
        ),
        (
            &["-b", "reference"][..],
            "error: benchmark: `bench` times the `cuda` or the `cpu` backend, not the reference \
             interpreter",
        ),
    ] {
        let mut args = vec!["bench", "f32-sparse-two-blocks.json", "--bind", "T=24"];
        args.extend_from_slice(extra);
        let t = fails(d, &args);
        assert!(t.ends_with(&format!("--- stderr\n{message}\n")), "{t}");
    }
}
