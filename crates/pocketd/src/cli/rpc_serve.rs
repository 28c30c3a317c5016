//! `pocket rpc-serve`: lend this machine's CPU or GPU to pocketd (or llama.cpp) on another
//! board through ggml's RPC backend, with the memory peers may take capped.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, bail};
use clap::Parser;
use pocket_core::memory::{BudgetSpec, MemoryLimits, format_size};
use pocket_runtime::DeviceChoice;
use pocket_runtime::rpc::{self, DEFAULT_PORT, ServeOptions};

/// `pocket rpc-serve` flags.
#[derive(Debug, Parser)]
pub struct Args {
    /// The IPv4 address and port to listen on. Loopback unless `--allow-network` is given.
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Listen on an address other machines reach. RPC has no authentication: whoever reaches
    /// the port can use the device and run graphs on it. Keep it on a WireGuard link or behind
    /// an SSH tunnel, or allow only the peer's address (docs/rpc.md).
    #[arg(long)]
    allow_network: bool,
    /// The device lent: `cpu`, `auto` (a GPU if there is one) or a ggml device name.
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// The most memory peers may allocate on it, all together (`1GiB`, `700M`); they see this
    /// as the device's size. `auto`: for the CPU what the machine (and this process's cgroup)
    /// has available, less a tenth, as pocketd's own budget; for a GPU its free memory less a
    /// tenth.
    #[arg(long, default_value = "auto")]
    memory: BudgetSpec,
    /// CPU threads that compute peers' graphs. Default: every core.
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Keep tensors peers send in this folder, keyed by hash, so that a peer loading the same
    /// model again sends hashes instead of bytes (ggml's `rpc-server -c`).
    #[arg(long)]
    cache_dir: Option<std::path::PathBuf>,
}

/// Run `pocket rpc-serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(protocol) = rpc::protocol() else {
        bail!("this pocket was built without ggml's RPC backend (GGML_RPC=ON; see docs/rpc.md)");
    };
    let ip = match args.listen.ip() {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(_) => bail!("ggml's RPC server listens on IPv4 addresses only; got {}", args.listen),
    };
    if !ip.is_loopback() {
        if !args.allow_network {
            bail!(
                "{} is not a loopback address: RPC has no authentication, so anyone who reaches the \
                 port could use this device. Pass --allow-network to listen there anyway (inside a \
                 WireGuard link, or allowing only the peer's address: docs/rpc.md), or use an SSH \
                 tunnel to 127.0.0.1",
                args.listen
            );
        }
        tracing::warn!(
            "listening on {}: RPC is unauthenticated and unencrypted; anyone who reaches this port \
             can use the device — keep it on a private link (docs/rpc.md)",
            args.listen
        );
        eprintln!(
            "warning: RPC on {} is unauthenticated and unencrypted; keep the port on a private link",
            args.listen
        );
    }
    let (name, description, free, total) = rpc::serve_device(&args.device)?;
    let cpu = name.eq_ignore_ascii_case("cpu");
    let memory = match args.memory {
        BudgetSpec::Auto if cpu => BudgetSpec::Auto.resolve(&MemoryLimits::read()),
        BudgetSpec::Auto => free - free / 10,
        BudgetSpec::Bytes(b) => b,
    };
    if !cpu && memory > free {
        eprintln!(
            "warning: --memory {} is more than {name} has free ({}): allocations past that will fail",
            format_size(memory),
            format_size(free)
        );
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    eprintln!(
        "pocket rpc-serve: RPC protocol {protocol}, lending {name} ({description}, {}): {} to peers, {threads} threads, on {}",
        format_size(total),
        format_size(memory),
        args.listen
    );
    if let Some(dir) = &args.cache_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the cache folder {}", dir.display()))?;
    }
    rpc::serve(&ServeOptions {
        endpoint: args.listen.to_string(),
        device: args.device,
        memory,
        threads,
        cache_dir: args.cache_dir,
    })?;
    Ok(())
}
