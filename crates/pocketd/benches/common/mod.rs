//! What the cargo benches that go through a daemon share: the default model, the threads, and
//! a pocketd of their own.
#![allow(dead_code, unreachable_pub)] // each bench uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The default model's name and file; an error saying how to get it if it is not pulled.
pub fn default_model() -> anyhow::Result<(&'static str, PathBuf)> {
    let name = pocket_models::default_model();
    let dir = pocket_models::models_dir(None);
    let path = pocket_models::resolve(name, &dir)
        .map_err(|e| anyhow::anyhow!("{e}; run `pocket pull {name}` first"))?
        .path;
    Ok((name, path))
}

/// `POCKET_BENCH_THREADS`, else every core.
pub fn threads() -> usize {
    std::env::var("POCKET_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(pocket_core::default_threads)
}

/// A pocketd of the bench's own in a temporary directory, on the models directory, serving the
/// default model; stopped with SIGTERM on drop.
pub struct Daemon {
    child: Child,
    /// Its socket.
    pub socket: PathBuf,
    work: tempfile::TempDir,
}

impl Daemon {
    /// Start it with `threads` threads and `extra` configuration lines, its cache (what it
    /// learns) empty, and wait for its socket.
    pub fn start(threads: usize, extra: &str) -> anyhow::Result<Daemon> {
        let work = tempfile::tempdir()?;
        let socket = work.path().join("pocketd.sock");
        let config = work.path().join("pocketd.toml");
        let dir = pocket_models::models_dir(None);
        let name = pocket_models::default_model();
        std::fs::write(
            &config,
            format!(
                "socket = {socket:?}\nmodels_dir = {dir:?}\ndefault_model = {name:?}\nbus = \"none\"\n\
                 threads = {threads}\n{extra}"
            ),
        )?;
        let child = Command::new(env!("CARGO_BIN_EXE_pocketd"))
            .arg("--config")
            .arg(&config)
            .env("POCKET_CACHE_DIR", work.path().join("cache"))
            .stderr(std::fs::File::create(work.path().join("pocketd.log"))?)
            .stdout(Stdio::null())
            .spawn()?;
        let daemon = Daemon { child, socket, work };
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(&daemon.socket).is_err() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "pocketd did not start:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("pocketd.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// Where cargo benches write their results: `target/bench` in the workspace.
pub fn out_dir() -> anyhow::Result<PathBuf> {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |t| root.join(t))
        .join("bench");
    std::fs::create_dir_all(&out)?;
    Ok(out)
}
