//! The case suite of mlpc: every model under `tests/cases/<name>/model.json` (at the repository
//! root) goes through the whole compiler, frontend to NVRTC and the CPU backend, in
//! `tests/cases.rs`. A directory added there is picked up without touching any code.
//!
//! Per case the suite snapshots the IR after each pass, `--explain`, the plan JSON and every
//! generated `.cu`; it compiles every kernel with NVRTC for `sm_90` (GEMM kernels must not use
//! local memory), and checks the CPU backend and the optimised graph against the reference
//! interpreter run on the source graph. An optional `tests/cases/<name>/expect.txt` states the
//! expected kernel count (`kernels = N`).
//!
//! **Invariant:** this crate holds only tests. It has no library code, and nothing may depend on
//! it.
