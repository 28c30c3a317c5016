//! `cargo bench`: the default workload on the default model, llama.cpp against our engine.
//!
//! Runs the same library code as `pocket bench` (`pocket_bench`), prints the table, and
//! writes `target/bench/decode.json` and `target/bench/decode.svg`. The model comes from the
//! models directory (`POCKET_MODELS_DIR`, or `models/store` in this tree); threads from
//! `POCKET_BENCH_THREADS` (default: every core).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pocket_bench::{self as bench, BenchConfig, Mode, Progress, workload};

fn main() -> ExitCode {
    bench::cargo_bench_main("decode", run)
}

fn run() -> anyhow::Result<()> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let name = pocket_models::default_model();
    let dir = pocket_models::models_dir(None);
    let model = match pocket_models::resolve(name, &dir) {
        Ok(model) => model,
        Err(e) => {
            anyhow::bail!(
                "the default model {name} is not available ({e}).\n\
                 Run `pocket pull {name}` (or `cargo run --release --bin pocket -- pull {name}`) first."
            );
        }
    };
    let workload_path = root.join("crates/pocket-bench/workload.jsonl");
    let prompts = workload::load(&workload_path)?;

    let mut config = BenchConfig::new(model.path.clone(), name.to_owned());
    config.workload = "crates/pocket-bench/workload.jsonl".into();
    config.modes = vec![Mode::LlamaCpp.into(), Mode::Vanilla.into()];
    if let Some(t) = std::env::var("POCKET_BENCH_THREADS").ok().filter(|t| !t.is_empty()) {
        config.threads = t.parse().map_err(|e| anyhow::anyhow!("POCKET_BENCH_THREADS={t:?}: {e}"))?;
    }
    eprintln!("bench: {} prompts on {} ({} threads)", prompts.len(), model.path.display(), config.threads);
    let results = bench::suite::run(&config, &prompts, &mut |p| {
        if let Progress::Run { index, of, record } = p {
            eprintln!("[{index}/{of}] {} {}", record.mode, record.prompt_id);
        }
    })?;
    print!("{}", bench::report::table(&results));

    let out = target_dir(root).join("bench");
    std::fs::create_dir_all(&out)?;
    let json = out.join("decode.json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")?;
    bench::chart::write_svg(&results, &out.join("decode.svg"))?;
    eprintln!("results: {} (and decode.svg)", json.display());
    Ok(())
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `target/` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t))
}
