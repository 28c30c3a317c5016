//! `cargo bench --bench seq2seq`: flan-t5-small on the seq2seq workload, plain decoding
//! against input copying, suffix drafting and auto, side by side — the same benchmark as
//! `pocket bench -m flan-t5-small` (`pocket_bench`, through the one request pipeline); then the
//! KV cache's bytes per token and agreement for f32, 8-bit and 4-bit (KIVI) on t5-tiny, the
//! fixture with a with-past decoder (flan-t5-small's export has none).
//!
//! Modes alternate per prompt; greedy output must be identical across modes (the report's
//! `identical` column). The model comes from the models directory (`pocket pull
//! flan-t5-small`); threads from `POCKET_BENCH_THREADS` (default: every core);
//! `POCKET_BENCH_WORKLOAD` replaces `crates/pocket-bench/seq2seq.jsonl`. Writes `target/bench/seq2seq.json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pocket_bench::{self as bench, BenchConfig, RunMode, workload};
use pocket_core::memory::Ledger;
use pocket_core::{KvType, LayerPlan, Model, Rows, Session, SessionConfig, argmax};
use pocket_runtime::TractModel;

fn main() -> ExitCode {
    bench::cargo_bench_main("seq2seq", run)
}

fn run() -> anyhow::Result<()> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let dir = pocket_models::models_dir(None);
    let found = pocket_models::resolve("flan-t5-small", &dir).map_err(|e| {
        anyhow::anyhow!("flan-t5-small is not available ({e}); run `pocket pull flan-t5-small` first")
    })?;
    let workload_path = std::env::var_os("POCKET_BENCH_WORKLOAD")
        .map_or_else(|| root.join("crates/pocket-bench/seq2seq.jsonl"), PathBuf::from);
    let prompts = workload::load(&workload_path)?;
    let mut config = BenchConfig::new(found.path.clone(), "flan-t5-small".into());
    config.workload = workload_path.display().to_string();
    config.modes = RunMode::parse_list("vanilla,inputcopy,suffix,auto")?;
    config.kv = KvType::F32;
    if let Some(t) = std::env::var("POCKET_BENCH_THREADS").ok().filter(|t| !t.is_empty()) {
        config.threads = t.parse().map_err(|e| anyhow::anyhow!("POCKET_BENCH_THREADS={t:?}: {e}"))?;
    }
    eprintln!("bench: {} prompts on {} ({} threads)", prompts.len(), found.path.display(), config.threads);
    let results = bench::suite::run(&config, &prompts, &mut |p| {
        if let bench::Progress::Run { index, of, record } = p {
            eprintln!("[{index}/{of}] {} {}", record.mode, record.prompt_id);
        }
    })?;
    print!("{}", bench::report::table(&results));
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |t| root.join(t))
        .join("bench");
    std::fs::create_dir_all(&out)?;
    let json = out.join("seq2seq.json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)? + "\n")?;
    eprintln!("results: {}", json.display());
    kv_report(root)
}

/// KV bytes per token and agreement with the f32 cache, per KV type.
fn kv_report(root: &Path) -> anyhow::Result<()> {
    const TOKENS: usize = 100;
    let tiny = TractModel::load(&root.join("crates/pocket-tract/tests/fixtures/t5-tiny"))?;
    let plan = LayerPlan::full(tiny.info().n_layers)?;
    let sources = ["translate English to German: The house is wonderful.", "summarize: the quick brown fox"];
    println!(
        "\nKV cache ({TOKENS} decoder tokens, t5-tiny: 2 layers x 4 heads x 16; teacher-forced with the f32 run's tokens)"
    );
    println!(
        "kv      bytes/token (long)  flan-t5-small shape   held after {TOKENS}   agreement   worst |dlogit|"
    );
    let mut reference: Vec<(Vec<u32>, Vec<Vec<f32>>)> = Vec::new();
    for kv in [KvType::F32, KvType::Q8_0, KvType::Q4_0] {
        let config = SessionConfig {
            kv,
            n_ctx: TOKENS + 1,
            threads: pocket_core::Threads::Fixed(1),
            ..SessionConfig::default()
        };
        let (mut agree, mut total, mut worst, mut held) = (0, 0, 0f32, 0);
        for (c, text) in sources.iter().enumerate() {
            let source = tiny.tokenizer().encode(text, true)?;
            let mut s = tiny.new_session(&config, &Ledger::unlimited())?;
            s.encode(&source)?;
            let mut inputs = vec![tiny.decoder_start()];
            let mut rows = Vec::new();
            for k in 0..TOKENS {
                let row = s.decode(&inputs[k..k + 1], &plan, Rows::Last)?.last().to_vec();
                if kv == KvType::F32 {
                    inputs.push(argmax(&row));
                } else {
                    let (ref_inputs, ref_rows) = &reference[c];
                    inputs.push(ref_inputs[k + 1]);
                    agree += usize::from(argmax(&row) == argmax(&ref_rows[k]));
                    total += 1;
                    worst = row.iter().zip(&ref_rows[k]).map(|(a, b)| (a - b).abs()).fold(worst, f32::max);
                }
                rows.push(row);
            }
            held = s.kv_bytes();
            if kv == KvType::F32 {
                reference.push((inputs, rows));
            }
        }
        let (agreement, worst) =
            if kv == KvType::F32 { (1.0, 0.0) } else { (agree as f64 / total as f64, worst) };
        println!(
            "{:<7} {:>18.0} {:>20.0} {:>17} {:>11.4} {:>16.3e}",
            kv.name(),
            pocket_runtime::kv_bytes_per_token(kv, 2, 4, 16),
            pocket_runtime::kv_bytes_per_token(kv, 8, 6, 64),
            held,
            agreement,
            worst
        );
    }
    Ok(())
}
