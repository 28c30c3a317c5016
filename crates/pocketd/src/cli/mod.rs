//! The `pocket` command line: one module per subcommand, each with its raw flags (`Args`)
//! and a `run` function.

use clap::{Parser, Subcommand};

pub mod ask;
pub mod bench;
pub mod client;
pub mod common;
pub mod daemon;
pub mod embed;
pub mod parity;
pub mod pull;
pub mod rpc_serve;
pub mod run;
pub mod tune;

/// `pocket`: run and benchmark models on this machine, and talk to pocketd.
#[derive(Debug, Parser)]
#[command(name = "pocket", version = env!("POCKETD_VERSION"), about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `pocket`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch a model named by a manifest into the models directory (sha256-verified).
    Pull(pull::Args),
    /// Generate text in this process (no daemon needed).
    Run(run::Args),
    /// Embed texts in this process with an embedding model (one JSON array per text).
    Embed(embed::Args),
    /// Compare our forward graph with llama.cpp's on the same model file.
    Parity(parity::Args),
    /// Benchmark our engine against llama.cpp on a workload (tok/s, memory, cost curve), in this
    /// process or through a running pocketd.
    Bench(bench::Args),
    /// Learn what speculation needs about a model on this device (its cost curve, a skip set)
    /// and remember it, so that `auto` uses it from the first request.
    Tune(tune::Args),
    /// Ask the daemon (pocketd) and stream its answer.
    Ask(ask::AskArgs),
    /// Chat with the daemon interactively (one message per line).
    Chat(ask::ChatArgs),
    /// List the models the daemon serves.
    Models(daemon::Args),
    /// Show the daemon's memory, models and running requests.
    Status(daemon::Args),
    /// Lend this machine's CPU or GPU to pocketd on another board (ggml's RPC server), with
    /// the memory peers may take capped.
    RpcServe(rpc_serve::Args),
}

impl Cli {
    /// Run the chosen subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Pull(args) => pull::run(args),
            Command::Run(args) => run::run(args),
            Command::Embed(args) => embed::run(args),
            Command::Parity(args) => parity::run(args),
            Command::Bench(args) => bench::run(args),
            Command::Tune(args) => tune::run(args),
            Command::Ask(args) => ask::ask(args),
            Command::Chat(args) => ask::chat(args),
            Command::Models(args) => daemon::models(args),
            Command::Status(args) => daemon::status(args),
            Command::RpcServe(args) => rpc_serve::run(args),
        }
    }
}
