//! The [`Pass`] trait, the registry of known passes and the error type passes share.

use crate::provenance::Provenance;
use crate::{Cse, Dce, FoldTranspose, FuseEpilogue};
use mlpc_ir::{Graph, VerifyErrors};

/// A named, one-way graph rewrite.
///
/// A pass receives a verified graph and must leave a verified graph computing the same outputs
/// (up to the rounding that fusion removes). It records in the [`Provenance`] the fate of every
/// node it removes or absorbs.
pub trait Pass: Send + Sync {
    /// The CLI name, e.g. `fold-transpose`; the same words as the file and the type.
    fn name(&self) -> &'static str;
    /// One line saying what the pass rewrites.
    fn description(&self) -> &'static str;
    /// Rewrites `g` in place; returns whether anything changed.
    fn run(&self, g: &mut Graph, prov: &mut Provenance) -> Result<bool, PassError>;
}

/// Every pass, in the order of the default pipeline.
pub fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Dce),
        Box::new(FoldTranspose),
        Box::new(Cse),
        Box::new(FuseEpilogue),
    ]
}

/// The pass called `name`, if there is one.
pub fn pass_by_name(name: &str) -> Option<Box<dyn Pass>> {
    all_passes().into_iter().find(|p| p.name() == name)
}

/// Passes that need a configuration (the model's `sparsity` section) and so are not in
/// [`all_passes`]; [`crate::Pipeline::with_sparsity`] inserts them.
pub const CONFIGURED_PASSES: [&str; 2] = ["prune-block-sparse", "lower-block-sparse"];

/// The names of all passes, comma-separated, for error messages and help texts.
pub fn known_pass_names() -> String {
    all_passes()
        .iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PassError {
    /// A name in a pass list (`option`: `--passes`) or in `--print-after` that is no pass.
    #[error("{option} names {}, which is not a pass; the passes are: {known}", quoted_pass(.name))]
    UnknownPass {
        option: &'static str,
        name: String,
        known: String,
    },
    #[error(
        "pass `{name}` cannot be listed: the compiler inserts it when the model's `sparsity` \
         section selects weights (`prune-block-sparse` after a leading `dce`, \
         `lower-block-sparse` last); a pass list names only: {known}"
    )]
    ConfiguredPass { name: String, known: String },
    #[error("--print-after names `{name}`, which is not in the pipeline ({pipeline})")]
    PrintAfterNotInPipeline { name: String, pipeline: String },
    #[error("the graph given to the pass pipeline is invalid: {0}")]
    InvalidInput(VerifyErrors),
    #[error("pass `{pass}` left an invalid graph (a bug in mlpc): {errors}")]
    Verify {
        pass: &'static str,
        errors: VerifyErrors,
    },
    #[error("block sparsity of weight `{weight}`: {message}")]
    Sparsity { weight: String, message: String },
    #[error("pass `{pass}` found a cycle through {nodes} (a bug in mlpc)")]
    Cycle { pass: &'static str, nodes: String },
}

/// What `--print-after` may name: every pass, the configured ones, or `all`.
pub(crate) fn print_after_names() -> String {
    format!(
        "{}, {} (with a sparsity section), or all",
        known_pass_names(),
        CONFIGURED_PASSES.join(", ")
    )
}

/// `name` in backquotes, or what an empty name is.
fn quoted_pass(name: &str) -> String {
    if name.is_empty() {
        "an empty pass name (a comma too many, or no name at all)".to_string()
    } else {
        format!("`{name}`")
    }
}

/// The topological order of `g`, or a [`PassError::Cycle`] naming the nodes on a cycle.
pub(crate) fn topo(g: &Graph, pass: &'static str) -> Result<Vec<mlpc_ir::NodeId>, PassError> {
    g.topo_order().map_err(|cycle| cycle_error(g, pass, &cycle))
}

/// The [`PassError::Cycle`] of `pass` naming the nodes `cycle` of `g`.
pub(crate) fn cycle_error(g: &Graph, pass: &'static str, cycle: &[mlpc_ir::NodeId]) -> PassError {
    PassError::Cycle {
        pass,
        nodes: cycle
            .iter()
            .map(|&n| format!("`{}`", g.node(n).name))
            .collect::<Vec<_>>()
            .join(", "),
    }
}
