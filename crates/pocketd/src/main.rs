//! `pocketd`: the daemon. See [`pocketd::server`] for what it serves and how it stops.

use clap::Parser;
use pocketd::server::config::Flags;

fn main() -> std::process::ExitCode {
    if let Err(e) = pocket_core::cpu::check_build() {
        eprintln!("pocketd: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let flags = Flags::parse();
    let config = match flags.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pocketd: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if flags.print_config {
        print!("{}", config.to_toml());
        return std::process::ExitCode::SUCCESS;
    }
    pocketd::server::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pocketd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(pocketd::server::serve(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("pocketd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
