//! `pocketd`: the daemon. The transports and scheduler arrive with the daemon issue; until
//! then it says so instead of pretending to serve.

fn main() -> std::process::ExitCode {
    eprintln!(
        "pocketd {}: the daemon is not built yet; use `pocket run` for in-process generation",
        env!("CARGO_PKG_VERSION")
    );
    std::process::ExitCode::from(2)
}
