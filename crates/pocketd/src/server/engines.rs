//! Which engine runs each model file, remembered while the file stays the same.
//!
//! Deciding reads the file's metadata: [`Engine::for_path`] opens a GGUF twice (is it an
//! embedding model? does our graph build it?), checking every key and tensor record, the
//! vocabulary included. For Qwen2.5 (151,936 tokens and their merges) that took some 200 ms
//! on a 2-core VM, and every request's admission and every `/v1/models` listing paid it: a
//! warm request answered from the prompt cache in 45 ms of prefill took 230 ms in all. The
//! answer depends only on the file, so it is kept per path with the file's identity (device,
//! inode, length, modification time); a file pulled again or replaced is read again.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use pocket_runtime::Engine;

/// What identifies a file's contents well enough to reuse what was read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    /// The stamp of the file (or directory, an ONNX model's) at `path`; `None` where it cannot
    /// be read, so that nothing is kept for it.
    fn of(path: &Path) -> Option<Stamp> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp { dev: meta.dev(), ino: meta.ino(), len: meta.len(), modified: meta.modified().ok() })
    }
}

/// The engines of the model files asked about.
pub(crate) struct Engines {
    decide: fn(&Path) -> Engine,
    known: Mutex<HashMap<PathBuf, (Stamp, Engine)>>,
}

impl Default for Engines {
    fn default() -> Self {
        Engines::deciding_with(Engine::for_path)
    }
}

impl Engines {
    /// Engines decided by `decide` (the daemon's: [`Engine::for_path`]).
    fn deciding_with(decide: fn(&Path) -> Engine) -> Self {
        Engines { decide, known: Mutex::new(HashMap::new()) }
    }

    /// The engine that runs the model at `path`: the one decided before while the file is
    /// unchanged, else decided now.
    pub(crate) fn of(&self, path: &Path) -> Engine {
        let stamp = Stamp::of(path);
        let known = |m: &HashMap<PathBuf, (Stamp, Engine)>| {
            m.get(path).filter(|(s, _)| Some(*s) == stamp).map(|&(_, e)| e)
        };
        if let Some(engine) = known(&self.lock()) {
            return engine;
        }
        // Decided outside the lock: another request's model need not wait for this file.
        let engine = (self.decide)(path);
        if let Some(stamp) = stamp {
            self.lock().insert(path.to_owned(), (stamp, engine));
        }
        engine
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, (Stamp, Engine)>> {
        // Plain inserts only: a poisoned lock holds nothing half-done.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static DECIDED: AtomicUsize = AtomicUsize::new(0);

    fn counting(path: &Path) -> Engine {
        DECIDED.fetch_add(1, Ordering::SeqCst);
        Engine::for_path(path)
    }

    #[test]
    fn a_file_is_read_once_while_it_stays_the_same_and_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, b"not a model").unwrap();
        let engines = Engines::deciding_with(counting);
        // A file our loader must judge goes to our graph, which says what is wrong with it.
        assert_eq!(engines.of(&path), Engine::Ggml);
        assert_eq!(engines.of(&path), Engine::Ggml);
        assert_eq!(DECIDED.load(Ordering::SeqCst), 1);
        // Replaced by another file (a new inode and length): read again.
        let other = dir.path().join("other");
        std::fs::write(&other, b"not a model either").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(engines.of(&path), Engine::Ggml);
        assert_eq!(DECIDED.load(Ordering::SeqCst), 2);
        // A path that is not there is decided each time and nothing is kept for it.
        let missing = dir.path().join("missing.gguf");
        engines.of(&missing);
        engines.of(&missing);
        assert_eq!(DECIDED.load(Ordering::SeqCst), 4);
        assert_eq!(engines.lock().len(), 1);
    }
}
