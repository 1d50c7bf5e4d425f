//! mlpc's optimisation passes, the pass pipeline, the lowering of an optimised graph to a
//! backend-neutral kernel plan, and `--explain`.
//!
//! ```text
//! Graph ──Pipeline::run──▶ Graph' + Provenance ──lower_plan──▶ Plan ──explain──▶ text
//! ```
//!
//! Passes (one file each, the file, type and CLI name are the same words):
//! [`Dce`] (`dce`), [`FoldTranspose`] (`fold-transpose`), [`Cse`] (`cse`) and
//! [`FuseEpilogue`] (`fuse-epilogue`); configured by the model's `sparsity` section,
//! [`PruneBlockSparse`] (`prune-block-sparse`) and [`LowerBlockSparse`] (`lower-block-sparse`),
//! which [`Pipeline::with_sparsity`] inserts. Each records in a [`Provenance`] what became of the nodes
//! it removed, which the plan's `covers` lists and [`explain`] report.
//!
//! **Architecture invariant:** this crate knows nothing of files, JSON, CUDA or LLVM. Its input is
//! an [`mlpc_ir::Graph`]; its output is a rewritten graph and an [`mlpc_ir::Plan`].

mod cse;
mod dce;
mod explain;
mod fold_transpose;
mod fuse_epilogue;
mod lower_block_sparse;
mod pass;
mod pipeline;
mod plan;
mod provenance;
mod prune_block_sparse;

pub use cse::Cse;
pub use dce::Dce;
pub use explain::explain;
pub use fold_transpose::FoldTranspose;
pub use fuse_epilogue::FuseEpilogue;
pub use lower_block_sparse::{packed_weights, LowerBlockSparse, PackedWeight};
pub use pass::{all_passes, known_pass_names, pass_by_name, Pass, PassError, CONFIGURED_PASSES};
pub use pipeline::{
    PassReport, Pipeline, PipelineOptions, PipelineReport, PrintAfter, DEFAULT_PASSES,
};
pub use plan::{
    intermediate_bytes, kernel_base_name, lower_plan, unfused_intermediate_bytes,
    unfused_kernel_count, ByteCount, PlanError, INPUT_ALIGN_BYTES,
};
pub use provenance::{Fate, Provenance};
pub use prune_block_sparse::{kept_blocks, kept_blocks_together, PruneBlockSparse, SparseWeight};
