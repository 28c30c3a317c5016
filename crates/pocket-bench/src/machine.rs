//! Facts about the machine and the model file that the results record.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use pocket_runtime::process::CpuTimes;

use super::Error;

/// The CPU's model name from `/proc/cpuinfo`: `model name` on x86, `Model` or `Hardware` on
/// ARM boards (which often have no per-core name); the architecture if none is there.
pub(crate) fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    ["model name", "Model", "Hardware"]
        .iter()
        .find_map(|key| {
            info.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_owned())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// The sha256 of the model at `path`, hex: of the file, or for a model directory (ONNX), of
/// its files' names and hashes in name order.
pub(crate) fn sha256_model(path: &Path) -> Result<String, Error> {
    if !path.is_dir() {
        return sha256_file(path);
    }
    let io = |error| Error::Io { action: "list the model directory", path: path.to_owned(), error };
    let mut files: Vec<_> = std::fs::read_dir(path)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        hasher.update(sha256_file(&file)?);
    }
    Ok(hex(&hasher.finalize()))
}

/// Bytes of the model at `path`: the file, or the files of a model directory (ONNX); 0 where
/// they cannot be read.
pub(crate) fn model_bytes(path: &Path) -> u64 {
    if !path.is_dir() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum()
}

/// The sha256 of the file at `path`, hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String, Error> {
    let io = |error| Error::Io { action: "hash the model file", path: path.to_owned(), error };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// The sha256 of token ids written as little-endian u32s, hex: equal outputs, equal hashes,
/// whatever machine produced them.
pub(crate) fn sha256_tokens(tokens: &[u32]) -> String {
    let mut hasher = Sha256::new();
    for t in tokens {
        hasher.update(t.to_le_bytes());
    }
    hex(&hasher.finalize())
}

/// Nanoseconds every thread of this process has run (`/proc/self/task/*/schedstat`);
/// `None` where the kernel does not keep them.
fn own_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread that exited since the listing has no file any more: it runs no more.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Window over which [`settle`] measures this process's CPU use.
const SETTLE_WINDOW: Duration = Duration::from_millis(10);

/// Wait until this process's threads are idle — using under 10% of a core over a short
/// window — or until `max` has passed; returns the time waited.
///
/// Thread pools spin for a while after their last task before they sleep (ggml's polls
/// for work). When modes alternate, one mode's still-spinning workers would take the cores
/// from the next mode's first tokens; waiting here keeps every run on a quiet process.
pub(crate) fn settle(max: Duration) -> Duration {
    settle_on(max, &mut own_cpu_ns)
}

/// [`settle`] reading the process's CPU nanoseconds from `cpu_ns`.
fn settle_on(max: Duration, cpu_ns: &mut dyn FnMut() -> Option<u64>) -> Duration {
    let start = Instant::now();
    let Some(mut before) = cpu_ns() else {
        return Duration::ZERO;
    };
    while start.elapsed() < max {
        std::thread::sleep(SETTLE_WINDOW);
        let Some(now) = cpu_ns() else {
            break;
        };
        let used = now.saturating_sub(before);
        before = now;
        if used < SETTLE_WINDOW.as_nanos() as u64 / 10 {
            break;
        }
    }
    start.elapsed()
}

/// Other processes using fewer cores than this leave a run undisturbed enough.
pub(crate) const QUIET_CORES: f64 = 0.25;

/// Wait until other processes keep fewer than [`QUIET_CORES`] cores busy over a 100 ms
/// window, or until `max` has passed; returns the time waited. On a shared machine a run
/// that competes for the cores measures the competition (with spinning thread pools, out of
/// all proportion), so it is better to start it a little later.
pub(crate) fn wait_for_quiet(max: Duration) -> Duration {
    let start = Instant::now();
    let Some(mut before) = CpuTimes::read() else {
        return Duration::ZERO;
    };
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Some(now) = CpuTimes::read() else {
            break;
        };
        let quiet = now.other_cores_since(&before).is_none_or(|c| c < QUIET_CORES);
        if quiet || start.elapsed() >= max {
            break;
        }
        before = now;
    }
    start.elapsed()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Busy processes beside the runs (`--load N`): each a shell loop that keeps a core busy,
/// started before the measured runs and killed after them (also when the benchmark fails).
pub(crate) struct Load(Vec<std::process::Child>);

impl Load {
    fn start(n: usize) -> Result<Load, Error> {
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            let child = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(std::process::Stdio::null())
                .spawn()
                .map_err(|e| Error::Invalid(format!("cannot start a busy process for --load: {e}")))?;
            children.push(child);
        }
        Ok(Load(children))
    }

    /// `config.load` busy processes, started now, and how long to wait for a quiet machine
    /// before each measured run. With other processes beside on purpose, waiting for quiet
    /// would wait for ever: the wait (`--wait-quiet`) is once, before they start.
    pub(crate) fn beside(config: &crate::config::BenchConfig) -> Result<(Load, Duration), Error> {
        if config.load > 0 && !config.wait_quiet.is_zero() {
            wait_for_quiet(config.wait_quiet);
        }
        let quiet = if config.load > 0 { Duration::ZERO } else { config.wait_quiet };
        Ok((Load::start(config.load)?, quiet))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_processes_run_beside_until_dropped_and_no_run_waits_for_quiet_then() {
        let mut config = crate::config::BenchConfig::new("m.gguf".into(), "m".into());
        config.wait_quiet = Duration::from_millis(200);
        let (none, quiet) = Load::beside(&config).unwrap();
        assert!(none.0.is_empty() && quiet == config.wait_quiet);
        config.load = 2;
        let (mut load, quiet) = Load::beside(&config).unwrap();
        assert_eq!((load.0.len(), quiet), (2, Duration::ZERO));
        assert!(load.0.iter_mut().all(|c| c.try_wait().unwrap().is_none()), "a busy process ended early");
        let pids: Vec<u32> = load.0.iter().map(std::process::Child::id).collect();
        drop(load);
        // Killed and reaped: no process is left under those ids.
        assert!(pids.iter().all(|p| !Path::new(&format!("/proc/{p}")).exists()), "{pids:?}");
    }

    #[test]
    fn token_hashes_are_of_little_endian_u32s() {
        // sha256 of the empty string.
        assert_eq!(sha256_tokens(&[]), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        // The bytes 01 00 00 00 02 01 00 00.
        let mut h = Sha256::new();
        h.update([1u8, 0, 0, 0, 2, 1, 0, 0]);
        assert_eq!(sha256_tokens(&[1, 258]), hex(&h.finalize()));
    }

    #[test]
    fn settling_waits_while_the_process_is_busy_and_stops_when_it_is_idle() {
        // This test binary's other tests run threads of their own, so the process's real
        // counter says nothing here; the counters are given.
        assert!(own_cpu_ns().is_some_and(|ns| ns > 0));
        let window = SETTLE_WINDOW.as_nanos() as u64;
        // Busy for three windows (a full window of CPU each), then idle.
        let mut readings = [0, window, 2 * window, 3 * window, 3 * window].into_iter();
        let waited = settle_on(Duration::from_secs(2), &mut || readings.next());
        assert!(waited >= 4 * SETTLE_WINDOW && waited < Duration::from_secs(2), "{waited:?}");
        // Always busy: waits until the limit.
        let mut t = 0;
        let waited = settle_on(Duration::from_millis(100), &mut || {
            t += window;
            Some(t)
        });
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        // No counter: no wait.
        assert_eq!(settle_on(Duration::from_secs(1), &mut || None), Duration::ZERO);
    }

    #[test]
    fn file_hash_matches_token_hash_of_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [7u8, 0, 0, 0]).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), sha256_tokens(&[7]));
        assert!(sha256_file(&dir.path().join("missing")).is_err());
        assert!(!cpu_name().is_empty());
    }
}
