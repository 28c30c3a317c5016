//! The daemon: configuration, the scheduler under the memory budget, and the transports
//! (HTTP on a Unix socket, D-Bus) that both call it.
//!
//! [`serve`] runs it: listeners (a socket systemd passed, or one bound here), D-Bus, the
//! keep-alive sweep, systemd's readiness and watchdog, and on SIGTERM a graceful stop —
//! new requests are refused, running ones get `shutdown_seconds` to finish and are then
//! cancelled.

pub mod accept;
pub mod admission;
pub mod body;
pub mod bus_callers;
pub mod config;
pub mod connections;
pub mod dbus;
pub mod embeddings;
mod engines;
pub mod error;
#[cfg(test)]
mod fuzzing;
pub mod http;
pub mod job;
pub mod learner;
pub mod listen;
pub mod messages;
pub mod metrics;
pub mod openai;
pub mod registry;
pub mod responses;
pub mod scheduler;
pub mod stored;
mod stream;
pub mod turns;
pub mod worker;

pub use config::{Bus, Config, DEFAULT_CONFIG_PATH};

use std::time::{Duration, Instant};

use anyhow::Context;
use scheduler::Scheduler;

/// Tell systemd something (a no-op when not started by systemd).
fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!("sd_notify: {e}");
    }
}

/// Run the daemon until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let scheduler = Scheduler::new(config.clone())?;
    let socket = listen::unix_listener(&config)?;
    let tcp = match config.tcp {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on tcp {addr}"))?,
        ),
        None => None,
    };
    let bus = dbus::serve(config.bus, scheduler.clone()).await?;

    let (stop_http, http_stopped) = tokio::sync::watch::channel(false);
    let fd_limit = connections::raise_open_files_limit();
    let max = connections::cap_under_fd_limit(config.max_connections, fd_limit);
    if max < config.max_connections {
        tracing::warn!(
            "max_connections = {} does not fit the open files limit ({fd_limit}): {max} it is",
            config.max_connections
        );
    }
    let table = connections::Connections::new(connections::Limits {
        max,
        per_peer: config.max_connections_per_peer.min(max),
        header_timeout: Duration::from_secs(config.header_timeout_seconds),
        idle_timeout: Duration::from_secs(config.idle_timeout_seconds),
    });
    let router = http::router(scheduler.clone());
    let mut servers = vec![tokio::spawn(accept::serve(
        socket.listener,
        router.clone(),
        table.clone(),
        http_stopped.clone(),
    ))];
    if let Some(tcp) = tcp {
        servers.push(tokio::spawn(accept::serve(tcp, router, table.clone(), http_stopped.clone())));
    }
    let timeouts = {
        let table = table.clone();
        every(Duration::from_millis(250), move || {
            let closed = table.sweep();
            if closed > 0 {
                tracing::debug!(closed, "connections timed out");
            }
        })
    };
    let sweeper = {
        let s = scheduler.clone();
        every(Duration::from_secs(1), move || drop(s.registry.expire()))
    };
    let learner = tokio::spawn(scheduler.clone().learn_while_idle());
    let watchdog = sd_notify::watchdog_enabled()
        .map(|period| every(period / 2, || notify(&[sd_notify::NotifyState::Watchdog])));

    let budget = pocket_core::memory::format_size(scheduler.ledger().budget());
    let status = format!(
        "serving on {}{}; budget {budget}",
        socket.description,
        if bus.is_some() {
            format!(" and D-Bus ({:?} bus)", config.bus).to_lowercase()
        } else {
            String::new()
        }
    );
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        models_dir = %config.models_dir.display(),
        open_files = fd_limit,
        max_connections = max,
        "{status}"
    );
    notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(&status)]);

    let signal = wait_for_signal().await?;
    tracing::info!("{signal}: stopping (running requests get {} s)", config.shutdown_seconds);
    notify(&[sd_notify::NotifyState::Stopping, sd_notify::NotifyState::Status("stopping")]);
    scheduler.stop_accepting();
    let deadline = Instant::now() + Duration::from_secs(config.shutdown_seconds);
    if !scheduler.drained(deadline).await {
        tracing::warn!(sessions = scheduler.active(), "the shutdown deadline passed: cancelling");
        scheduler.cancel_all();
        scheduler.drained(Instant::now() + Duration::from_secs(5)).await;
    }
    let _ = stop_http.send(true);
    table.close_unbusy();
    for server in servers {
        let _ = server.await;
    }
    let closing = Instant::now() + Duration::from_secs(2);
    while table.counts().open > 0 && Instant::now() < closing {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if table.counts().open > 0 {
        tracing::debug!(open = table.counts().open, "HTTP connections still open at exit");
    }
    sweeper.abort();
    timeouts.abort();
    // The learner stops within a pass once the scheduler is stopping; its memory goes with it.
    let _ = learner.await;
    if let Some(w) = watchdog {
        w.abort();
    }
    drop(bus);
    // Models unloading write their parked conversations to the prompt cache directory; what
    // is still parked after (a model something else held) is written too.
    scheduler.registry.clear();
    scheduler.flush_prompt_cache();
    // Earlier answers still waiting for their writer.
    scheduler.histories().flush();
    if let Some(path) = socket.bound_path {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Logs: to journald when systemd connected our output to the journal, else to stderr.
/// `RUST_LOG` sets the filter (default `info`).
pub fn init_logging() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,zbus=warn,tracing=warn"));
    let journald =
        std::env::var_os("JOURNAL_STREAM").is_some().then(tracing_journald::layer).and_then(Result::ok);
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(j) => registry.with(j).init(),
        None => registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).init(),
    }
}

/// Runs `task` every `period` (the first time at once) until the returned handle is aborted.
fn every(period: Duration, mut task: impl FnMut() + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            task();
        }
    })
}
