//! Compiling a model and running the result. The pipeline is one short function,
//! [`Compiler::compile_model`]: every stage is a call into the crate that owns it.

use crate::artifacts::Artifacts;
use crate::backend::Backend;
use crate::error::Error;
use crate::Tensors;
use mlpc_frontend::Model;
use mlpc_ir::{DType, Graph, TensorType};
use std::path::{Path, PathBuf};

/// Compiles models. Options (the pass list, the target, which backends to prepare kernels for)
/// become builder methods here as the pipeline grows; today a compilation loads and verifies.
#[derive(Clone, Debug, Default)]
pub struct Compiler {}

impl Compiler {
    pub fn new() -> Compiler {
        Compiler::default()
    }

    /// Reads `model.json` (and the weights it names) and compiles it.
    pub fn compile_file(&self, path: &Path) -> Result<Compiled, Error> {
        let model = mlpc_frontend::load_model(path)?;
        self.compile_model(model)
    }

    /// Compiles a model that is already in memory, e.g. one a framework built from its own
    /// module tree.
    pub fn compile_model(&self, model: Model) -> Result<Compiled, Error> {
        mlpc_ir::verify(&model.graph)?;
        Ok(Compiled { model })
    }
}

/// A compiled model: ready to run on a backend, and to write its artifacts.
#[derive(Debug)]
pub struct Compiled {
    model: Model,
}

impl Compiled {
    /// The model as loaded: the source graph, its sparsity specs and options.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The graph the backends execute. Today the verified source graph.
    pub fn graph(&self) -> &Graph {
        &self.model.graph
    }

    pub fn name(&self) -> &str {
        &self.model.graph.name
    }

    /// What the compilation produced, at a glance.
    pub fn summary(&self) -> Summary {
        let g = self.graph();
        let nodes: Vec<_> = g.node_ids().map(|id| g.node(id)).collect();
        let mut dtypes: Vec<DType> = nodes.iter().map(|n| n.ty.dtype).collect();
        dtypes.sort();
        dtypes.dedup();
        Summary {
            name: g.name.clone(),
            dtypes,
            inputs: g
                .inputs()
                .into_iter()
                .map(|id| (g.node(id).name.clone(), g.node(id).ty.clone()))
                .collect(),
            outputs: g
                .outputs()
                .iter()
                .map(|o| (o.name.clone(), g.node(o.node).ty.clone()))
                .collect(),
            nodes: nodes.len(),
            ops: nodes.iter().filter(|n| !n.op.is_leaf()).count(),
            weights: g.weights().len(),
            weight_bytes: g.weights().values().map(|w| w.bytes().len() as u64).sum(),
            sparse_weights: self.model.sparsity.len(),
        }
    }

    /// The files of the compilation: `graph.txt`, the IR text form of [`Compiled::graph`].
    pub fn artifacts(&self) -> Artifacts {
        let mut a = Artifacts::new();
        a.add(Artifacts::MARKER, self.graph().to_string());
        a
    }

    /// Writes [`Compiled::artifacts`] into `dir`, all at once (see [`Artifacts::write_to`]).
    pub fn write_to(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        self.artifacts().write_to(dir)
    }

    /// Deterministic random inputs for the model, with the symbolic dims bound as given
    /// (e.g. `[("T", 8)]`).
    pub fn random_inputs(&self, bindings: &[(&str, u64)], seed: u64) -> Result<Tensors, Error> {
        Ok(mlpc_frontend::random_inputs(self.graph(), bindings, seed)?)
    }

    /// Runs the model on `backend`. Inputs are matched by name and checked (dtype, shape, the
    /// binding of symbolic dims) before anything runs; outputs come back by name.
    pub fn run(&self, backend: Backend, inputs: &Tensors) -> Result<Tensors, Error> {
        match backend {
            Backend::Reference => Ok(mlpc_ir::interpret(self.graph(), inputs)?),
            Backend::Cpu | Backend::Cuda => Err(unavailable(backend)),
        }
    }
}

fn unavailable(backend: Backend) -> Error {
    let available: Vec<&str> = Backend::available().iter().map(|b| b.name()).collect();
    Error::BackendUnavailable {
        backend,
        reason: backend
            .unavailable_reason()
            .unwrap_or("it cannot run here")
            .to_string(),
        available: available.join(", "),
    }
}

/// What a compilation produced, for a one-screen report.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub name: String,
    /// The distinct element types in the graph (one for every model today).
    pub dtypes: Vec<DType>,
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// All nodes, including inputs and weights.
    pub nodes: usize,
    /// Nodes that compute (neither inputs nor weights).
    pub ops: usize,
    pub weights: usize,
    pub weight_bytes: u64,
    /// Weights that the `sparsity` section selects for block-sparse kernels.
    pub sparse_weights: usize,
}
