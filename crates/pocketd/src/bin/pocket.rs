//! `pocket`: the command-line client.

use clap::Parser;

fn main() -> std::process::ExitCode {
    if let Err(e) = pocket_core::cpu::check_build() {
        eprintln!("pocket: {e}");
        return std::process::ExitCode::FAILURE;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POCKET_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match pocketd::cli::Cli::parse().run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
