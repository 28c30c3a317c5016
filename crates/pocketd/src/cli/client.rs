//! Where the daemon is: the `--socket` flag and a runtime for one client command. The client
//! itself is pocket-api's ([`pocket_api::client::Client`]).

use std::path::PathBuf;

pub use pocket_api::client::{Client, DEFAULT_SOCKET};

/// Flags that say where the daemon is.
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArgs {
    /// pocketd's Unix socket.
    #[arg(long, env = "POCKET_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// A runtime for one client command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}
