//! The whole-sector stores of the Hopper epilogues (`wgmma_detail::store_sector`, used by
//! `store_tile`, the tail of `store_tile_tma` and `GemmBsrWgmma`): a quad of lanes holds a row's
//! 16 output columns as pairs in the wgmma accumulator layout and writes them as four 8-byte
//! stores after four shuffles. The lines below are checked to be in the template, and their
//! lane arithmetic is run here for every lane of a warp: each lane must store exactly the four
//! consecutive columns at its offset, of its own row, so that the quad covers the 32-byte sector
//! once.

const TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_wgmma.cuh");
const BSR_TEMPLATE: &str = include_str!("../../../kernels-templates/gemm_bsr_wgmma.cuh");

/// `store_sector`'s lane arithmetic, as the template writes it.
const TRANSCRIBED: &[&str] = &[
    "const int t = lane & 3;",
    "const int lo_src = (lane & ~3) | ((2 * t) & 3);",
    "const int hi_src = (lane & ~3) | ((2 * t + 1) & 3);",
    "const u32 lo0 = __shfl_sync(0xffffffffu, p0, lo_src);",
    "const u32 lo1 = __shfl_sync(0xffffffffu, p1, lo_src);",
    "const u32 hi0 = __shfl_sync(0xffffffffu, p0, hi_src);",
    "const u32 hi1 = __shfl_sync(0xffffffffu, p1, hi_src);",
    "*reinterpret_cast<uint2*>(out + 4 * t) = make_uint2(t < 2 ? lo0 : lo1, t < 2 ? hi0 : hi1);",
];

/// Where `store_sector` is called: the pair of accumulator registers 4i + 2h (columns 8i + 2t,
/// + 1) goes in as `p0`, 4 (i + 1) + 2h (columns 8 (i + 1) + 2t, + 1) as `p1`, at column 8i.
///
/// In the dense template the call sits in `store_groups_sectors`, whose `pair(r)` packs registers
/// r and r + 1: `store_tile` passes `pack2` of them, `store_tile_tma`'s 32-column tail of a
/// 96-wide band the same with its packed ReLU.
const CALLERS: &[(&str, &[&str])] = &[
    (
        TEMPLATE,
        &[
            "for (int i = I0; i < I1; i += 2) {",
            "const int r = 4 * i + 2 * h;",
            "store_sector<T>(out_row + i * 8, pair(r), pair(r + 4));",
            "auto pair = [&](int r) { return pack2<T>(acc[r], acc[r + 1]); };",
            "store_groups_sectors<0, kGroups, T>(rbase, cbase, p, pair);",
            "const u32 w = pack2<T>(acc[r], acc[r + 1]);",
            "store_groups_sectors<kFirst, BN / 8, T>(rbase, cbase, p, packed);",
        ],
    ),
    (
        BSR_TEMPLATE,
        &[
            "for (int i = 0; i < BR / 8; i += 2) {",
            "const int r = 4 * i + 2 * h;",
            "out_row + cols(g) + i * 8,",
            "out_pair(acc[g][r], acc[g][r + 1]),",
            "out_pair(acc[g][r + 4], acc[g][r + 5]));",
        ],
    ),
];

#[test]
fn the_model_transcribes_the_templates() {
    for line in TRANSCRIBED {
        assert!(
            TEMPLATE.contains(line),
            "gemm_wgmma.cuh no longer says `{line}`: update this test with it"
        );
    }
    for (template, lines) in CALLERS {
        for line in *lines {
            assert!(
                template.contains(line),
                "a caller of store_sector no longer says `{line}`: update this test with it"
            );
        }
    }
}

/// A word of a lane: its row (lane / 4) and the column of its first element.
type Word = (u32, u32);

/// The elements each lane stores, by (row, column), for the given source-lane rule.
fn stored(src: impl Fn(u32, u32) -> (u32, u32)) -> Vec<Vec<(u32, u32)>> {
    // Lane l holds in p0 columns 2t, 2t + 1 and in p1 columns 8 + 2t, 9 + 2t of row l / 4.
    let p0 = |l: u32| -> Word { (l / 4, 2 * (l % 4)) };
    let p1 = |l: u32| -> Word { (l / 4, 8 + 2 * (l % 4)) };
    (0..32)
        .map(|lane| {
            let t = lane & 3;
            let (lo_src, hi_src) = src(lane, t);
            let lo = if t < 2 { p0(lo_src) } else { p1(lo_src) };
            let hi = if t < 2 { p0(hi_src) } else { p1(hi_src) };
            // The 8-byte store: lo's two elements, then hi's, at column 4t of the lane's row.
            vec![
                (lo.0, lo.1),
                (lo.0, lo.1 + 1),
                (hi.0, hi.1),
                (hi.0, hi.1 + 1),
            ]
        })
        .collect()
}

fn is_whole_sector_per_quad(words: &[Vec<(u32, u32)>]) -> bool {
    words.iter().enumerate().all(|(lane, w)| {
        let (row, t) = (lane as u32 / 4, lane as u32 % 4);
        *w == (0..4).map(|k| (row, 4 * t + k)).collect::<Vec<_>>()
    })
}

#[test]
fn each_lane_stores_its_four_columns_of_its_own_row() {
    let template =
        |lane: u32, t: u32| ((lane & !3) | ((2 * t) & 3), (lane & !3) | ((2 * t + 1) & 3));
    assert!(is_whole_sector_per_quad(&stored(template)));
    // The check discriminates: a source lane off by one, or taken across quads, fails it.
    let off = |lane: u32, t: u32| ((lane & !3) | ((2 * t + 1) & 3), (lane & !3) | ((2 * t) & 3));
    assert!(!is_whole_sector_per_quad(&stored(off)));
    let across = |_lane: u32, t: u32| ((2 * t) & 3, (2 * t + 1) & 3);
    assert!(!is_whole_sector_per_quad(&stored(across)));
}
