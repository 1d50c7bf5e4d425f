//! The `mlpc` command line. This crate parses arguments, prints progress and summaries and
//! renders errors; every other step is a call into the `mlpc` library.
//!
//! **Architecture invariant:** no compiler logic lives here. A framework that embeds the `mlpc`
//! library can do everything this binary does.
//!
//! Every failure prints one message (the error and its causes) to stderr and exits with status 1;
//! nothing is left half-written, because the library writes files and directories atomically.

mod render;

use clap::{Parser, Subcommand, ValueEnum};
use mlpc::{Backend, Compiler};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "mlpc",
    version,
    about = "A graph compiler for MLP blocks",
    long_about = "A graph compiler for MLP blocks: reads model.json, verifies it, and runs it.\n\
                  Errors name the offending node or tensor; the exit status is 1 on any error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Load and verify a model, write its artifacts (DIR/graph.txt) and print a summary.
    Compile {
        /// The model file (model.json).
        model: PathBuf,
        /// Output directory [default: out/<model name>]. Replaced as a whole; an existing
        /// directory must be empty or an earlier mlpc output.
        #[arg(short, long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run a model on inputs read from a safetensors file; write the outputs to another.
    Run {
        /// The model file (model.json).
        model: PathBuf,
        /// Inputs by name (safetensors).
        #[arg(short, long, value_name = "IN.safetensors")]
        input: PathBuf,
        /// Where to write the outputs by name (safetensors); written only on success.
        #[arg(short, long, value_name = "OUT.safetensors")]
        output: PathBuf,
        /// Where to run.
        #[arg(short, long, value_enum, default_value_t = BackendArg::Reference)]
        backend: BackendArg,
    },
    /// Write deterministic random inputs for a model (for `mlpc run --input`).
    GenInputs {
        /// The model file (model.json).
        model: PathBuf,
        /// The safetensors file to write.
        #[arg(short, long, value_name = "IN.safetensors")]
        output: PathBuf,
        /// A value for a symbolic dimension, e.g. `--bind T=8`; repeat for several.
        #[arg(long = "bind", value_name = "SYM=N", value_parser = parse_binding)]
        bindings: Vec<(String, u64)>,
        /// Seed of the random generator: the same seed gives the same inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

/// `--backend` values; the names are [`Backend::name`]'s.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum BackendArg {
    /// The reference interpreter (exact, slow).
    Reference,
    /// Native code for this CPU, through LLVM.
    Cpu,
    /// CUDA kernels on the GPU.
    Cuda,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Backend {
        match b {
            BackendArg::Reference => Backend::Reference,
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Cuda => Backend::Cuda,
        }
    }
}

fn parse_binding(s: &str) -> Result<(String, u64), String> {
    let (sym, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected SYM=N (e.g. T=8), got `{s}`"))?;
    let value = value
        .trim()
        .parse::<u64>()
        .map_err(|e| format!("`{value}` is not a dimension size: {e}"))?;
    Ok((sym.trim().to_string(), value))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout and succeed; usage errors fail like any other error.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", render::error_chain(&e));
            if let Some(hint) = render::hint(&e) {
                eprintln!("{hint}");
            }
            ExitCode::FAILURE
        }
    }
}

fn execute(command: Command) -> Result<(), mlpc::Error> {
    match command {
        Command::Compile { model, out } => {
            let compiled = Compiler::new().compile_file(&model)?;
            let dir = out.unwrap_or_else(|| default_out_dir(compiled.name(), &model));
            let written = compiled.write_to(&dir)?;
            print!(
                "{}",
                render::compile_summary(&compiled.summary(), &dir, &written)
            );
        }
        Command::Run {
            model,
            input,
            output,
            backend,
        } => {
            let backend = Backend::from(backend);
            let compiled = Compiler::new().compile_file(&model)?;
            let inputs = mlpc::read_tensors(&input)?;
            let outputs = compiled.run(backend, &inputs)?;
            mlpc::write_tensors(&output, &outputs)?;
            print!(
                "{}",
                render::run_summary(compiled.name(), backend, &outputs, &output)
            );
        }
        Command::GenInputs {
            model,
            output,
            bindings,
            seed,
        } => {
            let compiled = Compiler::new().compile_file(&model)?;
            let bindings: Vec<(&str, u64)> =
                bindings.iter().map(|(s, v)| (s.as_str(), *v)).collect();
            let inputs = compiled.random_inputs(&bindings, seed)?;
            mlpc::write_tensors(&output, &inputs)?;
            print!("{}", render::tensors_written(&inputs, &output));
        }
    }
    Ok(())
}

/// `out/<name>` in the working directory, where `<name>` is the model's name when it is a plain
/// file name, else the model file's stem.
fn default_out_dir(model_name: &str, model_path: &Path) -> PathBuf {
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let stem = model_path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| plain(s))
        .unwrap_or("model");
    let name = if plain(model_name) { model_name } else { stem };
    Path::new("out").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_parse() {
        assert_eq!(parse_binding("T=8"), Ok(("T".to_string(), 8)));
        assert!(parse_binding("T").unwrap_err().contains("expected SYM=N"));
        assert!(parse_binding("T=-1").is_err());
    }

    #[test]
    fn default_out_dir_uses_a_plain_model_name() {
        let p = Path::new("examples/tiny/model.json");
        assert_eq!(default_out_dir("tiny-mlp", p), Path::new("out/tiny-mlp"));
        assert_eq!(default_out_dir("../etc", p), Path::new("out/model"));
        assert_eq!(
            default_out_dir("", Path::new("a/ffn.json")),
            Path::new("out/ffn")
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
