//! `pocketd`: the daemon. Its configuration is in place (`--print-config`); the scheduler and
//! transports arrive with the rest of the daemon issue, and until then it says so instead of
//! pretending to serve.

use clap::Parser;
use pocketd::server::config::Flags;

fn main() -> std::process::ExitCode {
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
    eprintln!(
        "pocketd {}: serving is not built yet; use `pocket run` for in-process generation",
        env!("CARGO_PKG_VERSION")
    );
    std::process::ExitCode::from(2)
}
