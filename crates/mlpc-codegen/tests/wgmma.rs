//! The Hopper (sm_90a) GEMM path: which sample GEMMs take `GemmWgmma`, snapshots of those
//! kernels, and NVRTC compiles of every sample kernel for sm_90a (wgmma in the PTX, no local
//! memory). The sm_90 snapshots of `snapshots.rs` are the proof that the default target is
//! unchanged.
//!
//! The NVRTC tests need NVRTC 13.0 (`LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib`, or
//! `MLPC_NVRTC_LIB`, as `scripts/test.sh` sets up); without it they fail rather than skip.

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel, Grid, Param};
use mlpc_ir::{DType, MatLayout, Op, Plan};

mod nvrtc_checks;

fn sm_90a() -> CodegenOptions {
    CodegenOptions {
        arch: Arch::Sm90a,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
    }
}

/// Every sample plan with its kernels generated for sm_90a.
fn generated() -> Vec<(Plan, Vec<CudaKernel>)> {
    samples::all()
        .into_iter()
        .map(|p| {
            let k = generate(&p, &sm_90a()).unwrap_or_else(|e| panic!("plan `{}`: {e}", p.name));
            (p, k)
        })
        .collect()
}

fn is_wgmma(k: &CudaKernel) -> bool {
    k.source.contains("mlpc::GemmWgmma<") || is_tma(k)
}

fn is_tma(k: &CudaKernel) -> bool {
    k.source.contains("mlpc::GemmWgmmaTma<")
}

#[test]
fn nt_half_gemms_take_wgmma_and_the_rest_keep_their_family() {
    let mut n_wgmma = 0;
    for (plan, kernels) in generated() {
        for (k, pk) in kernels.iter().zip(&plan.kernels) {
            let Op::Gemm(g) = &pk.op else {
                assert!(!is_wgmma(k), "{}", k.name);
                continue;
            };
            // The samples' operands are contiguous: the row stride of A and of B is K, the last
            // dim of A, and a constant one that is not a multiple of 8 keeps the mma.sync kernel.
            let k_dim = plan.buffers[pk.args[0]]
                .ty
                .shape
                .last()
                .and_then(|d| d.fixed());
            let aligned = k_dim.is_none_or(|k| k % 8 == 0);
            let expected =
                plan.dtype != DType::F32 && g.a == MatLayout::N && g.b == MatLayout::T && aligned;
            assert_eq!(is_wgmma(k), expected, "{}:\n{}", k.name, k.source);
            if expected {
                n_wgmma += 1;
                assert!(k.source.contains("#include \"gemm_wgmma.cuh\""));
                // The samples' strides are constants: every one takes the TMA kernel, with one
                // producer and two consumer warpgroups, a persistent grid and one tensor map per
                // matrix operand.
                assert!(is_tma(k), "{}", k.name);
                assert!(k.entry.contains("_wgmma_tma_128x"), "{}", k.entry);
                let Grid::Persistent {
                    tile_m,
                    tile_n,
                    per_sm,
                    ..
                } = k.launch.grid
                else {
                    panic!("{}: expected a persistent grid", k.name)
                };
                // One CTA per SM: two consumer warpgroups and a producer warpgroup; two: one
                // consumer warpgroup and a producer warp.
                let threads = if per_sm == 1 { 384 } else { 160 };
                assert_eq!(k.launch.block, [threads, 1, 1], "{}", k.name);
                assert!(
                    k.source
                        .contains(&format!("__launch_bounds__({threads}, {per_sm})")),
                    "{}",
                    k.name
                );
                assert!(
                    // Every CTA of an SM fits, with the 1 KiB the system reserves for each.
                    k.launch.smem_bytes > 48 * 1024
                        && (k.launch.smem_bytes + 1024) * per_sm <= 228 * 1024,
                    "{}",
                    k.name
                );
                assert_eq!(tile_m, 128);
                assert!(k
                    .source
                    .contains(&format!("mlpc::WgmmaTmaConfig<128, {tile_n}, ")));
                let maps: Vec<_> = k
                    .params
                    .iter()
                    .filter_map(|p| match p {
                        Param::TensorMap {
                            buffer,
                            box_rows,
                            box_cols,
                            ..
                        } => Some((*buffer, *box_rows, *box_cols)),
                        _ => None,
                    })
                    .collect();
                let mut want = vec![(pk.args[0], 128, 64), (pk.args[1], tile_n, 64)];
                if g.dual.is_some() {
                    want.push((pk.args[2], tile_n, 64));
                }
                // A short-grid entry's B map (its narrower tiles).
                assert!(k.short_grids.len() <= 1, "{}", k.name);
                if let Some(s) = k.short_grids.first() {
                    let Grid::Persistent {
                        tile_n: short_n, ..
                    } = s.launch.grid
                    else {
                        panic!("{}: the short grid is not persistent", k.name);
                    };
                    assert!(short_n < tile_n, "{}", k.name);
                    want.push((pk.args[1], short_n, 64));
                }
                // Every sample output has contiguous rows of a 16-byte multiple: the epilogue
                // stores by the copy engine, in 64 x 64 boxes.
                want.push((pk.out, 64, 64));
                assert_eq!(maps, want, "{}", k.name);
                // A deep GEMM's split-K entry (`_splitk`, over the same arguments).
                let split_entries = match &k.launch.grid {
                    Grid::Persistent {
                        split_k, one_tile, ..
                    } => {
                        if let Some(s) = split_k {
                            assert!(k.source.contains(&format!(" {}(", s.entry)), "{}", k.name);
                            assert_eq!(k.params.last(), Some(&Param::Workspace), "{}", k.name);
                        }
                        if let Some(e) = one_tile {
                            assert!(k.source.contains(&format!(" {e}(")), "{}", k.name);
                        }
                        split_k.iter().count() + one_tile.iter().count()
                    }
                    _ => 0,
                };
                // The short-grid entry and its split entry.
                let short_entries = k.short_grids.first().map_or(0, |s| {
                    assert!(k.source.contains(&format!(" {}(", s.entry)), "{}", k.name);
                    let Grid::Persistent {
                        split_k: Some(split),
                        ..
                    } = &s.launch.grid
                    else {
                        panic!("{}: the short grid does not split K", k.name);
                    };
                    assert!(
                        k.source.contains(&format!(" {}(", split.entry)),
                        "{}",
                        k.name
                    );
                    2
                });
                assert_eq!(
                    k.source
                        .matches("const __grid_constant__ mlpc::TensorMap")
                        .count(),
                    maps.len()
                        * (1 + k.small_m.as_ref().map_or(0, |s| s.variants.len())
                            + split_entries
                            + short_entries),
                    "every entry of the module takes the maps: {}",
                    k.name
                );
            } else if plan.dtype != DType::F32 {
                assert!(k.source.contains("mlpc::GemmMma<"), "{}", k.name);
            }
        }
    }
    // linear_bias, linear_gelu_tanh, swiglu (dual + down), batched_residual, geglu_mul (dual).
    assert!(n_wgmma >= 6, "only {n_wgmma} kernels took the wgmma path");
}

#[test]
fn sm_90a_wgmma_kernels() {
    for (plan, kernels) in generated() {
        for k in kernels.iter().filter(|k| is_wgmma(k)) {
            insta::assert_snapshot!(format!("sm_90a__{}__{}", plan.name, k.name), k.listing());
        }
    }
}

#[test]
fn other_targets_never_see_wgmma() {
    for arch in [Arch::Sm90, Arch::Sm80] {
        let opts = CodegenOptions {
            arch,
            allow_tf32: false,
            sparse_gemv: false,
            bsr_walk: false,
        };
        for plan in samples::all() {
            for k in generate(&plan, &opts).unwrap() {
                assert!(!is_wgmma(&k), "{} on {arch}", k.name);
            }
        }
    }
}

#[test]
fn every_sample_kernel_compiles_for_sm_90a_without_local_memory() {
    let kernels: Vec<CudaKernel> = generated().into_iter().flat_map(|(_, k)| k).collect();
    // Every entry of each module (split K, one tile, the short grid and its split entry) keeps
    // off local memory, and no wgmma is serialised.
    let compiled = nvrtc_checks::compile_clean(&kernels, Arch::Sm90a);
    for (k, c) in kernels.iter().zip(&compiled) {
        if is_wgmma(k) {
            assert!(
                c.ptx.contains("wgmma.mma_async.sync.aligned.m64n"),
                "{}",
                k.name
            );
            // The cp.async kernel's own stores must be made visible to wgmma (the async proxy);
            // the copy engine writes through the async proxy itself.
            assert!(
                is_tma(k) || c.ptx.contains("fence.proxy.async.shared::cta"),
                "{}",
                k.name
            );
            assert!(c.resources.registers <= 255 && c.resources.barriers >= 1);
        }
        if is_tma(k) {
            eprintln!("{}: {:?}", k.name, c.resources);
            for needle in [
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                "mbarrier.try_wait.parity.shared::cta.b64",
            ] {
                assert!(
                    c.ptx.contains(needle),
                    "{}: no `{needle}` in the PTX",
                    k.name
                );
            }
            // The register handover of one CTA per SM (two keep the launch bound's share).
            let handover = k.launch.block[0] == 384;
            for needle in [
                "setmaxnreg.dec.sync.aligned.u32 40",
                "setmaxnreg.inc.sync.aligned.u32 232",
            ] {
                assert_eq!(c.ptx.contains(needle), handover, "{}: `{needle}`", k.name);
            }
            // ptxas ignores setmaxnreg it cannot honour, with a warning in the log.
            assert!(!c.log.contains("setmaxnreg"), "{}: {}", k.name, c.log);
        }
    }
}

/// Every activation as the epilogue of the widest tiles, whose accumulators leave the epilogue
/// the fewest registers: a plain GEMM onto 192 columns with K = 1024 (the 128 x 192 ping-pong
/// tile, its split-K entry and short grid) and a dual GEMM onto 192 (the 128 x 96 ping-pong
/// tile), gate activation on both. `tanhf` spilled 124 bytes on the plain tile and 48 on the
/// dual one before `activate_fast` had a tanh of its own.
#[test]
fn every_activation_fits_the_wide_tiles_without_local_memory() {
    use mlpc_codegen::samples::PlanBuilder;
    use mlpc_ir::{Activation, BufferKind, Dual, Epilogue, Gemm};
    use smallvec::smallvec;
    let mut kernels = Vec::new();
    for act in Activation::ALL {
        let mut p = PlanBuilder::new(&format!("wide_{}", act.name()), DType::Bf16);
        let x = p.dense("x", BufferKind::Input, &["T", "1024"]);
        let w = p.dense("w", BufferKind::Weight, &["192", "1024"]);
        let xs = p.dense("xs", BufferKind::Input, &["T", "64"]);
        let wg = p.dense("wg", BufferKind::Weight, &["192", "64"]);
        let wu = p.dense("wu", BufferKind::Weight, &["192", "64"]);
        let y = p.dense("y", BufferKind::Output, &["T", "192"]);
        let h = p.dense("h", BufferKind::Output, &["T", "192"]);
        let plain = Op::Gemm(Gemm {
            a: MatLayout::N,
            b: MatLayout::T,
            dual: None,
            epilogue: smallvec![Epilogue::Act(act)],
        });
        p.kernel(&format!("gemm_{}", act.name()), plain, &[x, w], y);
        let dual = Op::Gemm(Gemm {
            a: MatLayout::N,
            b: MatLayout::T,
            dual: Some(Dual {
                gate: smallvec![Epilogue::Act(act)],
                up: smallvec![],
            }),
            epilogue: smallvec![],
        });
        p.kernel(&format!("dual_gemm_{}", act.name()), dual, &[xs, wg, wu], h);
        let plan = p.finish();
        let ks = generate(&plan, &sm_90a()).unwrap_or_else(|e| panic!("{}: {e}", plan.name));
        assert!(ks.iter().all(is_tma), "{}", plan.name);
        kernels.extend(ks);
    }
    assert!(kernels.iter().any(|k| k.entry.contains("128x192")));
    assert!(kernels.iter().any(|k| k.entry.contains("128x96")));
    nvrtc_checks::compile_clean(&kernels, Arch::Sm90a);
}
