//! The Hopper block-sparse kernel (`GemmBsrWgmma`): which sparse GEMMs take it on sm_90a, their
//! launch descriptions, and snapshots of the generated kernels. The sm_90 snapshots of
//! `snapshots.rs` are the proof that the default target is unchanged.

mod bsr_plans;

use mlpc_codegen::{generate, samples, Arch, CodegenOptions, CudaKernel, Grid, Param};
use mlpc_ir::{MatLayout, Op, Plan};

fn opts(arch: Arch) -> CodegenOptions {
    CodegenOptions {
        arch,
        allow_tf32: false,
        sparse_gemv: false,
        bsr_walk: false,
    }
}

fn plans() -> Vec<Plan> {
    bsr_plans::all()
        .into_iter()
        .chain(samples::sparse())
        .collect()
}

fn is_hopper(k: &CudaKernel) -> bool {
    k.source.contains("mlpc::GemmBsrWgmma<")
}

#[test]
fn sparse_gemms_with_k_contiguous_a_and_wgmma_blocks_take_the_grouped_kernel() {
    let mut n = 0;
    for plan in plans() {
        let kernels = generate(&plan, &opts(Arch::Sm90a)).unwrap();
        for (k, pk) in kernels.iter().zip(&plan.kernels) {
            let Op::SparseGemm(sg) = &pk.op else {
                panic!("{}: not a sparse GEMM", pk.name)
            };
            let [br, bc] = sg.pattern.block;
            let dual = sg.gemm.dual.is_some();
            let expected = plan.dtype != mlpc_ir::DType::F32
                && sg.gemm.a == MatLayout::N
                && [8, 16, 24, 32, 48, 64, 96, 128, 192, 256].contains(&br)
                && bc % 16 == 0
                && (!dual || br <= 128);
            assert_eq!(is_hopper(k), expected, "{}", k.name);
            if !expected {
                continue;
            }
            n += 1;
            assert!(k.source.contains("#include \"gemm_bsr_wgmma.cuh\""));
            assert!(k.entry.contains("_wgmma_128x"), "{}", k.entry);
            // Two consumer warpgroups and a producer warpgroup.
            assert!(k.source.contains("__launch_bounds__(384, 1)"), "{}", k.name);
            assert_eq!(k.launch.block, [384, 1, 1]);
            assert!(k.launch.smem_bytes <= 227 * 1024);
            // Tiles of 128 rows and a group of G block rows, on a persistent grid of one CTA
            // per SM at most; G * BR columns at most 256 (128 for two accumulators, 352 for
            // plain GEMMs of 32-row blocks, whose kernels then have a short-grid entry of
            // eight-row groups).
            let g: u64 = k
                .source
                .split("Kernel::kGroup == ")
                .nth(1)
                .and_then(|s| s.split(',').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{}: no group size", k.name));
            // A, the packed blocks (and the up blocks) through tensor maps of one swizzle atom
            // column (the widest of 64, 32, 16 elements dividing the slice) per box: A in boxes
            // of 128 rows, the blocks in boxes of one block's rows. Windows of two block columns
            // (32-wide blocks in groups of up to 12 block rows): A's box 64 wide; pairs of kept
            // columns (where windows do not pay): one box of 32 per column.
            let maps: Vec<(u32, u32)> = k
                .params
                .iter()
                .filter_map(|p| match p {
                    Param::TensorMap {
                        box_rows, box_cols, ..
                    } => Some((*box_rows, *box_cols)),
                    _ => None,
                })
                .collect();
            let bk = [64, 48, 32, 16].into_iter().find(|d| bc % d == 0).unwrap();
            let sw = [64, 32, 16].into_iter().find(|w| bk % w == 0).unwrap();
            // `BsrWgmmaConfig<BM, G, BK, STAGES[, A_REGS[, WB[, WIDE[, SLOTS[, TMA_STORE[,
            // PAIRS[, STAGING_BUFS]]]]]]]>`.
            let config = k
                .source
                .split("mlpc::BsrWgmmaConfig<")
                .nth(1)
                .and_then(|s| s.split('>').next())
                .unwrap_or_else(|| panic!("{}: no config", k.name));
            let field = |i: usize| config.split(", ").nth(i);
            // The short-grid entries' groups and configurations (`Config_g<rows>`), in order.
            let shorts: Vec<(u64, &str)> = k
                .source
                .split("using Config_g")
                .skip(1)
                .map(|s| {
                    let (g, rest) = s.split_once(" = mlpc::BsrWgmmaConfig<").unwrap();
                    (g.parse().unwrap(), rest.split('>').next().unwrap())
                })
                .collect();
            assert_eq!(shorts.len(), k.short_grids.len(), "{}", k.name);
            // Narrower groups each (at most 256, 128, 64 columns), below the entry's own; the
            // first of eight rows beside groups of eleven.
            let mut last = g;
            for &(sg_g, _) in &shorts {
                assert!(sg_g < last && sg_g * u64::from(br) <= 256, "{}", k.name);
                last = sg_g;
            }
            if g > 8 {
                assert_eq!(shorts.first().map(|s| s.0), Some(8), "{}", k.name);
            }
            let windows = field(5) == Some("2");
            let wide = field(6) == Some("true");
            let pairs = field(9) == Some("true");
            assert!(!windows || (bc == 32 && 2 * g <= 24), "{}", k.name);
            assert!(!pairs || windows, "{}", k.name);
            assert_eq!(
                pairs,
                ["int", "unsigned short"].iter().any(|t| k
                    .source
                    .contains(&format!("__device__ const {t} step_col1["))),
                "{}",
                k.name
            );
            // Wide block copies exactly where a slice takes whole blocks of rows narrower than
            // 128 bytes that are whole 1024-byte periods of at most 256 rows of 128 bytes.
            let rows = br * bc * 2 / 128;
            let whole = windows || bk == bc;
            assert_eq!(
                wide,
                whole && sw < 64 && (br * bc * 2) % 1024 == 0 && rows <= 256,
                "{}",
                k.name
            );
            let sw_a = match (windows, pairs) {
                (true, false) => 64,
                (true, true) => 32,
                _ => sw,
            };
            let block_box = if wide { (rows, 64) } else { (br, sw) };
            let mut expect = vec![(128, sw_a), block_box];
            if dual {
                expect.push(block_box);
            }
            // The short-grid entries' A boxes where they differ from the entry's own, a map for
            // each other width.
            let short_field = |c: &str, i: usize| c.split(", ").nth(i).map(str::to_string);
            let mut a_boxes = vec![sw_a];
            for &(_, c) in &shorts {
                let sw_a_short = match (
                    short_field(c, 5).as_deref() == Some("2"),
                    short_field(c, 9).as_deref() == Some("true"),
                ) {
                    (true, false) => 64,
                    (true, true) => 32,
                    _ => sw,
                };
                if !a_boxes.contains(&sw_a_short) {
                    expect.insert(a_boxes.len(), (128, sw_a_short));
                    a_boxes.push(sw_a_short);
                }
            }
            // The epilogue's TMA stores (of any entry), after the operands: the output in
            // 64 x 64 boxes for consecutive groups, in boxes of a block row's 32 columns for
            // groups of listed block rows (a map each, in the entries' order).
            let listed = std::iter::once(k.source.contains("Epilogue, GroupRows>")).chain(
                shorts
                    .iter()
                    .map(|(sg_g, _)| k.source.contains(&format!("Epilogue, GroupRows_g{sg_g}>"))),
            );
            let stored = std::iter::once(field(8) == Some("true")).chain(
                shorts
                    .iter()
                    .map(|&(_, c)| short_field(c, 8).as_deref() == Some("true")),
            );
            let mut boxes = Vec::new();
            for (st, l) in stored.into_iter().zip(listed) {
                let b = if l { (64, br) } else { (64, 64) };
                if st && !boxes.contains(&b) {
                    boxes.push(b);
                }
            }
            for (name, b) in [("tm_c", (64, 64)), ("tm_cl", (64, br))] {
                assert_eq!(
                    boxes.contains(&b) && (name == "tm_c" || b != (64, 64)),
                    [",", ")"].iter().any(|end| k.source.contains(&format!(
                        "const __grid_constant__ mlpc::TensorMap {name}{end}"
                    ))),
                    "{} {name}",
                    k.name
                );
            }
            expect.extend(boxes);
            assert_eq!(maps, expect, "{}", k.name);
            // The rearranged weights: the packed blocks (and the up blocks), one period a block.
            let relaid: Vec<(usize, usize)> = k
                .relayouts
                .iter()
                .map(|r| (r.buffer, r.perm.len() * r.chunk_bytes as usize))
                .collect();
            let mut expect: Vec<(usize, usize)> = Vec::new();
            if wide {
                let block_bytes = (br * bc * 2) as usize;
                expect.extend(
                    pk.args[1..if dual { 3 } else { 2 }]
                        .iter()
                        .map(|&b| (b, block_bytes)),
                );
            }
            assert_eq!(relaid, expect, "{}", k.name);
            assert!(
                g * u64::from(br)
                    <= if dual {
                        128
                    } else if [br, bc] == [32, 32] && sg.pattern.inp >= 4096 {
                        352
                    } else {
                        256
                    }
            );
            // The grid's tiles: 128 rows by a group's columns, over the output's columns.
            let grid_of = |launch: &mlpc_codegen::Launch, g: u64| {
                let Grid::Persistent {
                    n: cols,
                    tile_m,
                    tile_n,
                    per_sm,
                    ..
                } = &launch.grid
                else {
                    panic!("{}: expected a persistent grid", k.name)
                };
                assert_eq!(
                    (*tile_m, u64::from(*tile_n), *per_sm),
                    (128, g * u64::from(br), 1),
                    "{}",
                    k.name
                );
                assert_eq!(cols.as_constant(), Some(sg.pattern.out), "{}", k.name);
                assert!(
                    k.source.contains(&format!(
                        "    p.groups = {};",
                        sg.pattern.block_rows().div_ceil(g)
                    )),
                    "{}: the group count the kernel walks",
                    k.name
                );
            };
            grid_of(&k.launch, g);
            for (s, &(sg_g, _)) in k.short_grids.iter().zip(&shorts) {
                grid_of(&s.launch, sg_g);
                assert!(
                    k.source.contains(&format!(" {}(\n", s.entry)),
                    "{}",
                    s.entry
                );
                let tile = format!("_wgmma_128x{}x", sg_g * u64::from(br));
                assert!(s.entry.contains(&tile), "{}", s.entry);
            }
            for list in ["grp_ptr", "grp_order", "step_info"] {
                assert!(
                    k.source.contains(&format!("__device__ const int {list}[")),
                    "{}: {list}",
                    k.name
                );
            }
            // The block indices in 16 bits: these weights keep far fewer than 65536 blocks.
            assert!(
                k.source.contains("#define MLPC_BSR_IDX unsigned short\n"),
                "{}",
                k.name
            );
            for list in ["step_first", "step_blk"] {
                assert!(
                    k.source
                        .contains(&format!("__device__ const unsigned short {list}[")),
                    "{}: {list}",
                    k.name
                );
            }
        }
    }
    assert!(n >= 11, "only {n} kernels took the grouped kernel");
}

#[test]
fn other_targets_keep_the_mma_sync_kernel() {
    for arch in [Arch::Sm90, Arch::Sm80] {
        for plan in plans() {
            for k in generate(&plan, &opts(arch)).unwrap() {
                assert!(!is_hopper(&k), "{} on {arch}", k.name);
                assert!(!k.source.contains("wgmma"), "{} on {arch}", k.name);
            }
        }
    }
}

#[test]
fn sm_90a_bsr_kernels() {
    for plan in plans() {
        for k in generate(&plan, &opts(Arch::Sm90a)).unwrap() {
            if is_hopper(&k) {
                insta::assert_snapshot!(format!("sm_90a__{}__{}", plan.name, k.name), k.listing());
            }
        }
    }
}

/// `CodegenOptions::bsr_walk`: every Hopper entry takes a work-item table as its last argument
/// and its launch carries a modelled cost for each of its groups (the own entry's and each short
/// grid's, as many as the entry's `grp_order` lists), the source defines the table's size
/// before the template, and nothing else of the kernel changes. Off, no kernel has any of it.
#[test]
fn work_item_tables_where_asked_for() {
    let walk = CodegenOptions {
        bsr_walk: true,
        ..opts(Arch::Sm90a)
    };
    let mut n = 0;
    for plan in plans() {
        let without = generate(&plan, &opts(Arch::Sm90a)).unwrap();
        let with = generate(&plan, &walk).unwrap();
        for (a, b) in without.iter().zip(&with) {
            assert!(!a.params.contains(&Param::Walk), "{}", a.name);
            assert!(a.launch.walk_costs.is_empty(), "{}", a.name);
            assert!(!a.source.contains("MLPC_BSR_WALK"), "{}", a.name);
            if !is_hopper(a) {
                assert_eq!(a, b, "{}: not a Hopper kernel, unchanged", a.name);
                continue;
            }
            n += 1;
            assert_eq!(b.params.last(), Some(&Param::Walk), "{}", b.name);
            assert_eq!(b.params[..b.params.len() - 1], a.params[..], "{}", b.name);
            assert!(b
                .source
                .starts_with(&a.source[..a.source.find("#include").unwrap()]));
            assert!(
                b.source
                    .contains("#define MLPC_BSR_WALK_CAP 1188\n#include \"gemm_bsr_wgmma.cuh\""),
                "{}",
                b.name
            );
            assert!(b
                .source
                .contains("const __grid_constant__ mlpc::BsrWalk walk"));
            let entries = 1 + b.short_grids.len();
            assert_eq!(
                b.source.matches("    p.walk = &walk;").count(),
                entries,
                "{}",
                b.name
            );
            // Less the table's size, argument and use, the source is the same.
            let stripped = b
                .source
                .replace("#define MLPC_BSR_WALK_CAP 1188\n", "")
                .replace(",\n    const __grid_constant__ mlpc::BsrWalk walk", "")
                .replace("    p.walk = &walk;\n", "");
            assert_eq!(stripped, a.source, "{}", b.name);
            // As many costs as the entry's `grp_order` lists groups, costliest first as the
            // kernel takes them; a short grid's narrower groups are as many or more (eleven
            // block rows: groups of 8 + 3 for the kernel's own, 6 + 5 for the six-row entry).
            let groups = |sfx: &str| -> usize {
                let at = b.source.find(&format!("grp_order{sfx}[")).unwrap();
                b.source[at..]
                    .split(['[', ']'])
                    .nth(1)
                    .unwrap()
                    .parse()
                    .unwrap()
            };
            let sorted = |c: &[u32]| c.windows(2).all(|w| w[0] >= w[1]);
            assert_eq!(b.launch.walk_costs.len(), groups(""), "{}", b.name);
            assert!(sorted(&b.launch.walk_costs), "{}", b.name);
            for s in &b.short_grids {
                let costs = &s.launch.walk_costs;
                assert!(costs.len() >= b.launch.walk_costs.len(), "{}", s.entry);
                assert!(sorted(costs), "{}", s.entry);
            }
        }
    }
    assert!(n >= 3, "{n} Hopper kernels");
}
