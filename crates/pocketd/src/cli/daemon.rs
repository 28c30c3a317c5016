//! `pocket models` and `pocket status`: what the daemon serves and holds.

use pocket_api::{ModelList, Status};
use pocket_core::memory::format_size;

use super::client::{Client, SocketArgs, runtime};

/// Flags of `pocket models` and `pocket status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the daemon's JSON as it is.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArgs,
}

/// Run `pocket models`.
pub fn models(args: Args) -> anyhow::Result<()> {
    let client = Client::new(&args.socket.socket);
    let rt = runtime()?;
    let list: ModelList = rt.block_on(client.get("/v1/models"))?;
    let status: Status = rt.block_on(client.get("/v1/status"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    for m in &list.data {
        match status.loaded.iter().find(|l| l.name == m.id) {
            Some(l) => println!("{:<28} loaded ({})", m.id, format_size(l.bytes)),
            None => println!("{}", m.id),
        }
    }
    Ok(())
}

/// Run `pocket status`.
pub fn status(args: Args) -> anyhow::Result<()> {
    let client = Client::new(&args.socket.socket);
    let s: Status = runtime()?.block_on(client.get("/v1/status"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("pocketd {} up {:.0} s", s.version, s.uptime_seconds);
    println!(
        "memory: {} of {} reserved (peak {}), {} resident",
        format_size(s.memory.used_bytes),
        format_size(s.memory.budget_bytes),
        format_size(s.memory.peak_bytes),
        format_size(s.memory.resident_bytes)
    );
    if let Some(d) = &s.memory.device {
        let pool = if d.unified { "of host memory" } else { "of its own memory" };
        println!(
            "device {}: {} reserved {pool} (peak {}), budget {}; {} of {} free",
            d.name,
            format_size(d.used_bytes),
            format_size(d.peak_bytes),
            format_size(d.budget_bytes),
            format_size(d.free_bytes),
            format_size(d.total_bytes)
        );
    }
    for m in &s.loaded {
        println!(
            "model {}: {} , {} session(s), idle {:.0} s",
            m.name,
            format_size(m.bytes),
            m.sessions,
            m.idle_seconds
        );
        for run in &m.placement {
            let peer = run.peer.as_deref().map(|p| format!(" of peer {p}")).unwrap_or_default();
            let rtt = run.round_trip_us.map(|us| format!(", round trip {us} µs")).unwrap_or_default();
            println!(
                "  layers {}..{} on {}{peer}: {}{rtt}",
                run.first_layer,
                run.first_layer + run.n_layers,
                run.device,
                format_size(run.weight_bytes)
            );
        }
    }
    if let Some(rpc) = &s.rpc {
        println!("rpc: protocol {}", rpc.protocol);
        for p in &rpc.peers {
            let state = match (&p.lost, p.connected) {
                (Some(why), _) => format!("lost: {why}"),
                (None, true) => "connected".to_owned(),
                (None, false) => "idle".to_owned(),
            };
            let rtt =
                p.round_trip_min_us.map(|us| format!(", round trip {us} µs at best")).unwrap_or_default();
            println!(
                "  peer {}: {state}{rtt}, {} sent, {} received",
                p.peer,
                format_size(p.bytes_to_peer),
                format_size(p.bytes_from_peer)
            );
        }
    }
    for r in &s.sessions {
        println!("request {} on {}: {} tokens so far", r.id, r.model, r.generated_tokens);
    }
    println!("queue: {} waiting of {}", s.queued, s.queue_capacity);
    Ok(())
}
