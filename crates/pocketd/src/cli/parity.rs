//! `pocket parity`: our graph against llama.cpp on the same model file.

use pocket_core::KvType;
use pocket_runtime::parity::{ParityOptions, parity};

use super::common::ModelArgs;

/// Flags of `pocket parity`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt the continuation starts from.
    #[arg(long, default_value = "The history of the printing press begins")]
    prompt: String,
    /// Tokens of greedy continuation to compare.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_tokens: usize,
    /// KV type compared with llama.cpp (the `parity:` line); q8_0 and q4_0 are also compared
    /// with it unless `--only`.
    #[arg(long, default_value = "f16")]
    kv: KvType,
    /// Compare only `--kv`.
    #[arg(long)]
    only: bool,
    /// CPU threads for both engines.
    #[arg(short = 't', long, default_value_t = pocket_core::default_threads())]
    threads: usize,
    /// Print every position, not only the disagreements.
    #[arg(short, long)]
    verbose: bool,
}

/// Run `pocket parity`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = args.model.resolve()?;
    let mut kv_types = vec![args.kv];
    if !args.only {
        kv_types.extend([KvType::Q8_0, KvType::Q4_0].into_iter().filter(|&k| k != args.kv));
    }
    let options = ParityOptions {
        prompt: args.prompt,
        n_tokens: args.n_tokens,
        threads: args.threads,
        kv_types,
        device: args.model.device.clone(),
    };
    let report = parity(&path, &options)?;
    println!(
        "{}: {} prompt tokens, {} positions, KV {}, ours on {}, llama.cpp on {}; pocketd's engine for it: {}",
        path.display(),
        report.prompt_tokens,
        report.n,
        args.kv,
        report.device,
        report.reference_device,
        report.engine
    );
    println!("{:>5} {:>9} {:>9} {:>12}", "pos", "llama.cpp", "pocketd", "max|Δlogit|");
    for p in &report.positions {
        if args.verbose || p.reference != p.ours {
            let mark = match p.reference_margin {
                Some(m) => format!("  ← differs (llama.cpp's margin {m:.3})"),
                None => String::new(),
            };
            println!("{:>5} {:>9} {:>9} {:>12.6}{mark}", p.index, p.reference, p.ours, p.max_abs_diff);
        }
    }
    for k in &report.kv {
        println!(
            "kv {:<5} top1 vs llama.cpp {}/{}  top1 vs {} {}/{} ({:.1}%)  max_abs_diff {}",
            k.kv.name(),
            k.top1_vs_llama_cpp,
            report.n,
            args.kv,
            k.top1_vs_first,
            report.n,
            100.0 * k.top1_vs_first as f64 / report.n.max(1) as f64,
            k.max_abs_diff
        );
    }
    if let Some(a) = &report.own_attention {
        let margins: Vec<String> = a.flip_margins.iter().map(|m| format!("{m:.3}")).collect();
        println!(
            "our attention kernel: top1 vs llama.cpp {}/{}  max_abs_diff {}  llama.cpp's margin where top1 differs: [{}]",
            a.top1_vs_llama_cpp,
            report.n,
            a.max_abs_diff,
            margins.join(", ")
        );
    }
    println!("parity: top1 {}/{} max_abs_diff {}", report.top1(), report.n, report.max_abs_diff());
    Ok(())
}
