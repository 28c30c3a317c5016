//! `cargo bench -p pocket-ggml --bench kernels`: our multi-row matrix kernels alone, against ggml's one-row
//! kernel, for every weight format that has one, at 1 to 16 activation rows (the sizes of a
//! decode step and of verification passes), on one thread: time, GFLOP/s and weight GB/s. And
//! against ggml's own `mul_mat` as llama.cpp runs it, up to prompt-sized passes of 256 rows:
//! its repacked, llamafile or tiled kernels where it has them. This process turns ggml's tiled
//! K-quant kernels off as pocketd does; `GGML_CPU_TILED_MM=1 cargo bench -p pocket-ggml --bench kernels`
//! compares with llama.cpp's defaults.
//!
//! The shapes are Qwen2.5-Coder-0.5B's feed-forward (4864 × 896 for 32-weight blocks,
//! 896 × 4864 for K-quants). The speed-up column is what a verification pass of n tokens
//! saves on the products; a decode step of a model (several threads sharing the memory bus)
//! is more memory-bound than one thread here, so the model's cost curve (`pocket tune`) is
//! the figure that decides whether speculation pays. Writes `target/bench/kernels.json`.

use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

fn main() -> ExitCode {
    // `cargo test --all-targets` runs every bench target with `--list`: answer it, run nothing.
    if std::env::args().any(|a| a == "--list") {
        println!("kernels: bench");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let rows = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64, 128, 256];
    let isa = pocket_ggml::kernel_isa();
    println!(
        "kernels: {}",
        isa.map_or("none on this CPU (ggml's mul_mat is used)".to_owned(), |i| format!("mm-{i}"))
    );
    println!(
        "ggml's tiled K-quant kernels (GGML_CPU_TILED_MM): {}",
        if std::env::var("GGML_CPU_TILED_MM").is_ok_and(|v| v != "0") { "on" } else { "off" }
    );
    println!(
        "{:6} {:>12} {:>4} {:>11} {:>11} {:>8} {:>11} {:>8} {:>8} {:>8}",
        "format",
        "shape",
        "rows",
        "ours µs",
        "one-row µs",
        "speed-up",
        "ggml µs",
        "vs ggml",
        "GFLOP/s",
        "GB/s"
    );
    let shapes: Vec<(usize, usize)> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| {
            let (m, k) = a.split_once('x').with_context(|| format!("{a:?}: a shape is ROWSxCOLS"))?;
            Ok((m.parse()?, k.parse()?))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut results = Vec::new();
    for format in pocket_ggml::kernel_formats() {
        let default = if format.contains("_K") { (896, 4864) } else { (4864, 896) };
        for &(m, k) in if shapes.is_empty() { std::slice::from_ref(&default) } else { &shapes } {
            let Some(timings) = pocket_ggml::time_kernel(format, m, k, &rows, 5) else { continue };
            print_timings(timings, &mut results);
        }
    }
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench"));
    std::fs::create_dir_all(dir)?;
    let report = json!({ "isa": isa, "threads": 1, "results": results });
    std::fs::write(dir.join("kernels.json"), serde_json::to_string_pretty(&report)?)?;
    println!("wrote target/bench/kernels.json");
    Ok(())
}

/// One line per row count, and its JSON.
fn print_timings(timings: Vec<pocket_ggml::KernelTiming>, results: &mut Vec<serde_json::Value>) {
    let us = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{:.1}", s * 1e6));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => "-".to_owned(),
    };
    for t in timings {
        println!(
            "{:6} {:>12} {:>4} {:>11} {:>11} {:>8} {:>11} {:>8} {:>8.1} {:>8.1}",
            t.format,
            format!("{}x{}", t.shape.0, t.shape.1),
            t.rows,
            us(t.ours_seconds),
            us(t.one_row_seconds),
            ratio(t.one_row_seconds, t.ours_seconds),
            us(t.ggml_seconds),
            ratio(t.ggml_seconds, t.ours_seconds),
            t.gflops(),
            t.gbytes_per_second()
        );
        results.push(json!({
            "format": t.format, "m": t.shape.0, "k": t.shape.1, "rows": t.rows,
            "ours_s": t.ours_seconds, "one_row_s": t.one_row_seconds, "ggml_mul_mat_s": t.ggml_seconds,
            "gflops": t.gflops(), "gbytes_per_s": t.gbytes_per_second(),
        }));
    }
}
