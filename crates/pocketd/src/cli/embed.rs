//! `pocket embed`: embed texts in this process (no daemon needed), one JSON array per line.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Parser;
use pocket_core::Threads;
use pocket_runtime::WeightFormat;
use pocket_runtime::embed::{EmbedInput, embed};

use super::common::ModelArgs;

/// `pocket embed` flags.
#[derive(Debug, Parser)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The texts; none: one per line of standard input.
    texts: Vec<String>,
    /// Cut a text longer than the model reads to its first tokens rather than refuse it.
    #[arg(long)]
    truncate: bool,
    /// CPU threads of each pass: `auto` or a count.
    #[arg(short = 't', long, default_value = "auto")]
    threads: Threads,
    /// Also print each text's cosine similarity to the first text (to standard error).
    #[arg(long)]
    similarity: bool,
}

/// Run `pocket embed`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let texts = if args.texts.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<Vec<_>, _>>().context("reading standard input")?
    } else {
        args.texts.clone()
    };
    let model = args.model.open(WeightFormat::AsStored, &pocket_core::memory::Ledger::unlimited())?;
    let embedded = embed(&model, &EmbedInput::Texts(texts.clone()), args.truncate, None, args.threads)?;
    let mut out = std::io::stdout().lock();
    for v in &embedded.vectors {
        serde_json::to_writer(&mut out, v)?;
        writeln!(out)?;
    }
    if args.similarity {
        let first = &embedded.vectors[0];
        for (text, v) in texts.iter().zip(&embedded.vectors) {
            let dot: f32 = first.iter().zip(v).map(|(a, b)| a * b).sum();
            eprintln!("{dot:.4}  {text}");
        }
    }
    eprintln!(
        "{} texts, {} tokens, {} values each{}",
        embedded.vectors.len(),
        embedded.prompt_tokens,
        embedded.vectors[0].len(),
        if embedded.truncated > 0 { format!(", {} truncated", embedded.truncated) } else { String::new() }
    );
    Ok(())
}
