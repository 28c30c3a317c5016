//! `cargo bench --bench seq2seq`: flan-t5-small on the seq2seq workload, plain decoding
//! against input copying, suffix drafting and auto, side by side; then the KV cache's
//! bytes per token and agreement for f32, 8-bit and 4-bit (KIVI) on t5-tiny, the fixture
//! with a with-past decoder (flan-t5-small's export has none).
//!
//! Every mode runs each prompt once, in turn (vanilla, inputcopy, suffix, auto, then the
//! next prompt), after one untimed warm-up prompt; greedy output must be identical across
//! modes. The model comes from the models directory (`pocket pull flan-t5-small`); threads
//! from `POCKET_BENCH_THREADS` (default: every core); `POCKET_BENCH_WORKLOAD` replaces
//! `benches/seq2seq.jsonl`.

use std::path::Path;
use std::process::ExitCode;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{
    KvType, LayerPlan, Model, Rows, SamplingConfig, Session, SessionConfig, StopConfig, argmax,
};
use pocket_tract::TractModel;
use pocketd::bench::workload::{self, PromptInput};

const MODES: [SpecMode; 4] = [SpecMode::Off, SpecMode::InputCopy, SpecMode::Suffix, SpecMode::Auto];

fn main() -> ExitCode {
    pocketd::bench::cargo_bench_main("seq2seq", run)
}

#[derive(Default, Clone, Copy)]
struct Totals {
    tokens: usize,
    seconds: f64,
    drafted: usize,
    accepted: usize,
}

fn run() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let threads = std::env::var("POCKET_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(pocket_core::default_threads);
    let dir = pocket_models::models_dir(None);
    let found = pocket_models::resolve("flan-t5-small", &dir).map_err(|e| {
        anyhow::anyhow!("flan-t5-small is not available ({e}); run `pocket pull flan-t5-small` first")
    })?;
    let model = pocketd::seq2seq::load(&found.path, &Ledger::unlimited())?;
    let workload_path = std::env::var_os("POCKET_BENCH_WORKLOAD")
        .map_or_else(|| root.join("benches/seq2seq.jsonl"), Into::into);
    let prompts = workload::parse(&std::fs::read_to_string(&workload_path)?)?;
    println!(
        "flan-t5-small ({}), {threads} threads, {} prompts from {}",
        if model.has_kv_cache() { "with a KV cache" } else { "no KV cache: each step recomputes the prefix" },
        prompts.len(),
        workload_path.display()
    );

    let config = SessionConfig { kv: KvType::F32, n_ctx: 512, threads, ..SessionConfig::default() };
    let ledger = Ledger::unlimited();
    let mut totals = [Totals::default(); MODES.len()];
    let mut costs = None;
    for (i, prompt) in prompts.iter().enumerate() {
        let PromptInput::Text(text) = &prompt.input else {
            anyhow::bail!("{}: not a seq2seq prompt", prompt.id)
        };
        let source = model.tokenizer().encode(text, true)?;
        let cost = match &costs {
            Some(c) => c,
            None => costs.insert(pocketd::seq2seq::measure_cost(&model, &config, &source, &ledger)?),
        }
        .clone();
        let mut plain_text = None;
        for warm in if i == 0 { [true, false].as_slice() } else { [false].as_slice() } {
            for (m, mode) in MODES.iter().enumerate() {
                let mut drafter = pocketd::seq2seq::drafter(*mode, &source, cost.clone(), 8)?;
                let mut session = model.new_session(&config, &ledger)?;
                let g = pocketd::seq2seq::generate(
                    &model,
                    &mut session,
                    &source,
                    SamplingConfig::default(),
                    StopConfig { max_tokens: prompt.max_tokens, stop: Vec::new() },
                    drafter.as_mut(),
                    &mut |_| std::ops::ControlFlow::Continue(()),
                )?;
                if *warm {
                    continue;
                }
                match &plain_text {
                    None => plain_text = Some(g.text.clone()),
                    Some(t) => {
                        anyhow::ensure!(*t == g.text, "{}: {mode} changed the greedy output", prompt.id)
                    }
                }
                let t = &mut totals[m];
                t.tokens += g.tokens.len().saturating_sub(1);
                t.seconds += g.decode_seconds;
                t.drafted += g.spec.drafted;
                t.accepted += g.spec.accepted;
                println!(
                    "  {:<18} {:<9} {:>3} tokens {:>7.1} tok/s  drafted {:>3} accepted {:>3}",
                    prompt.id,
                    mode.name(),
                    g.tokens.len(),
                    g.decode_tok_per_s(),
                    g.spec.drafted,
                    g.spec.accepted
                );
            }
        }
        println!("  {:<18} -> {:?}", prompt.id, plain_text.unwrap_or_default());
    }
    println!("\nmode        decode tok/s   speed-up   acceptance");
    let base = totals[0].tokens as f64 / totals[0].seconds.max(1e-9);
    for (mode, t) in MODES.iter().zip(totals) {
        let rate = t.tokens as f64 / t.seconds.max(1e-9);
        let acceptance =
            if t.drafted > 0 { format!("{:.2}", t.accepted as f64 / t.drafted as f64) } else { "-".into() };
        println!("{:<11} {rate:>12.1} {:>9.2}x {acceptance:>12}", mode.name(), rate / base);
    }
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
        let config = SessionConfig { kv, n_ctx: TOKENS + 1, threads: 1, ..SessionConfig::default() };
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
            pocket_tract::kv_bytes_per_token(kv, 2, 4, 16),
            pocket_tract::kv_bytes_per_token(kv, 8, 6, 64),
            held,
            agreement,
            worst
        );
    }
    Ok(())
}
