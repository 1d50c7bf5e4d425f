//! Writes a bundle for checking the generated kernels on a GPU: for each sample plan of
//! mlpc-codegen, `DIR/<plan>/plan.json` and `DIR/<plan>/kernels/*` (see `write_artifacts`).
//! `gpu-check/check_kernels.py` runs every kernel of the bundle on the device against a float64
//! reference.
//!
//! Usage: `cargo run -p mlpc-jit --example gpu_bundle -- DIR [sm_90|sm_80|sm_90a]`

use mlpc_codegen::{generate, samples, Arch, CodegenOptions};
use mlpc_jit::{compile_all, write_artifacts, JitOptions};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: gpu_bundle DIR [ARCH]")?);
    let arch = match args.next() {
        Some(a) => Arch::parse(&a).ok_or_else(|| format!("unknown architecture `{a}`"))?,
        None => Arch::Sm90,
    };
    let opts = JitOptions {
        arch,
        ..JitOptions::default()
    };
    for plan in samples::all() {
        let kernels = generate(
            &plan,
            &CodegenOptions {
                arch,
                allow_tf32: false,
                sparse_gemv: true,
                bsr_walk: false,
            },
        )?;
        let compiled = compile_all(&kernels, &opts)?;
        let pdir = dir.join(&plan.name);
        std::fs::create_dir_all(&pdir)?;
        std::fs::write(pdir.join("plan.json"), serde_json::to_string_pretty(&plan)?)?;
        write_artifacts(&pdir, &kernels, &compiled)?;
        println!("{}: {} kernels", plan.name, kernels.len());
    }
    Ok(())
}
