//! `pocket tune`: learn what speculation needs about a model on this device — its
//! verification cost curve and, where it could pay, a layer-skip set — and remember it, so
//! that `auto` in `pocket run` and the daemon uses it from the first request. (The daemon
//! learns the same while it is idle; this does it now.)

use anyhow::Context;
use pocket_core::KvType;
use pocket_core::cost::CostModel;
use pocket_core::default_threads;
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_runtime::DEFAULT_MAX_DRAFT;
use pocket_runtime::learn::{self, Progress, SkipSearch, TuneSettings};
use pocket_runtime::weight_choice::{WeightsEstimate, auto_weights, candidates};

use super::common::{ModelArgs, WeightChoice};

/// Acceptance the report values drafts at (about what accepted suffix drafts reach).
const REFERENCE_ACCEPTANCE: f64 = 0.8;

/// Flags of `pocket tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// CPU threads requests will run with (default: all cores this process may use, the most
    /// pocketd's `threads = "auto"` uses); a cost curve holds for one thread count.
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// KV cache type requests will use; a cost curve holds for one KV type.
    #[arg(long, default_value = "f16")]
    kv: KvType,
    /// Search a layer-skip set even where the cost curve says that layer skipping cannot pay.
    #[arg(long)]
    search_anyway: bool,
    /// Measure again what is already known.
    #[arg(long)]
    again: bool,
}

/// Run `pocket tune`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let threads = args.threads.unwrap_or_else(default_threads);
    anyhow::ensure!(threads > 0, "--threads must be at least 1");
    let ledger = Ledger::unlimited();
    let stored = args.model.open(args.model.weights.initial(), &ledger)?;
    let formats = match args.model.weights {
        WeightChoice::Auto => candidates(&stored),
        WeightChoice::Format(w) => vec![w],
    };
    let settings = TuneSettings {
        threads,
        kv: args.kv,
        skip_search: if args.search_anyway { SkipSearch::Always } else { SkipSearch::WhereItCouldPay },
        again: args.again,
    };
    let mut model = stored;
    for (i, &weights) in formats.iter().enumerate() {
        if i > 0 {
            drop(model); // one copy of the weights at a time
            model = args.model.open(weights, &ledger)?;
        }
        let info = model.model().info();
        println!(
            "{} ({}, weights {}) on {}, kernels {}, {threads} threads, {} KV",
            info.name,
            model.engine().name(),
            model.weights(),
            model.device(),
            model.kernels(),
            args.kv
        );
        let tuned = learn::tune(&model, &settings, &ledger, &|| false, &mut |p| match p {
            Progress::MeasuringCurve => eprintln!("  measuring the verification cost curve..."),
            Progress::MeasuringKvAgreement => eprintln!("  measuring quantized KV caches against f16..."),
            Progress::KvAgreement(kv, agreement) => println!(
                "  {kv} KV cache: top-1 agreement with f16 {:.1}%{}",
                agreement * 100.0,
                if agreement >= pocket_runtime::GOOD_KV_AGREEMENT {
                    ""
                } else {
                    ": the memory ladder does not use it"
                }
            ),
            Progress::Searching => eprintln!("  searching a layer-skip set..."),
            _ => {}
        })
        .with_context(|| format!("tuning {}", info.name))?;
        let Some(curve) = &tuned.known.curve else { anyhow::bail!("no cost curve was measured") };
        let points: Vec<String> = curve.iter().map(|p| format!("n={} {:.2}x", p.n, p.relative)).collect();
        println!(
            "  cost curve t(n)/t(1){}: {}",
            if tuned.measured_curve { " (measured now)" } else { " (known)" },
            points.join(", ")
        );
        let cost = CostModel::from_curve(curve);
        let (k, gain) = cost.best_k(REFERENCE_ACCEPTANCE, 0.0, DEFAULT_MAX_DRAFT);
        println!(
            "  free drafts (suffix{}) accepted {:.0}% of the time: {}",
            if model.offers(SpecMode::InputCopy) { ", inputcopy" } else { "" },
            REFERENCE_ACCEPTANCE * 100.0,
            if k > 0 {
                format!("{gain:.2}x with drafts of {k}")
            } else {
                "no gain: auto will not draft".into()
            }
        );
        match learn::profile_steps(&model, threads, args.kv, &ledger) {
            Ok(profile) => println!("  {profile}"),
            Err(e) => println!("  a decode step could not be profiled: {e}"),
        }
        if let Some(exact) = &info.exact_passes {
            println!("  exact passes: {}", exact.why);
        }
        if model.offers(SpecMode::LayerSkip) {
            match &tuned.known.skip_set {
                Some(set) => {
                    let run = 1.0 - set.skip.len() as f64 / set.n_layers as f64;
                    let (k, gain) = cost.best_k(set.agreement, run, DEFAULT_MAX_DRAFT);
                    println!(
                        "  layer skip{}: skipping layers {:?} of {}, agreement {:.2}: {}",
                        if tuned.found_skip_set { " (found now)" } else { " (known)" },
                        set.skip,
                        set.n_layers,
                        set.agreement,
                        if k > 0 && learn_pays(gain) {
                            format!("{gain:.2}x expected with drafts of {k}: auto uses it")
                        } else {
                            format!("{gain:.2}x expected: does not pay here, auto leaves it")
                        }
                    );
                }
                None => println!(
                    "  layer skip: not searched: on this cost curve even a good skip set (half the layers at \
                     0.93 agreement) would not beat plain decoding (--search-anyway searches all the same)"
                ),
            }
        }
    }
    if formats.len() > 1 {
        let (chosen, estimates) = auto_weights(&model, SpecMode::Auto, threads, args.kv);
        let line: Vec<String> = estimates.iter().map(describe).collect();
        println!("--weights auto would choose {chosen} ({})", line.join("; "));
    }
    Ok(())
}

/// Whether an expected speed-up from layer skipping is one `auto` acts on.
fn learn_pays(gain: f64) -> bool {
    pocket_core::spec::AutoConfig::new(CostModel::linear(1.0)).model_drafting_pays(gain)
}

fn describe(e: &WeightsEstimate) -> String {
    format!(
        "{}: {:.1} ms a step, {:.0} tok/s drafting",
        e.weights,
        e.step_seconds * 1e3,
        e.drafting_tok_per_s
    )
}
