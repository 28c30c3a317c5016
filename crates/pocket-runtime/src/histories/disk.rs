//! Earlier answers on disk, beside the prompt cache's files, so that a restarted daemon drafts
//! from what it had been answering.
//!
//! One file per history (`<16 hex digits of the sha256 of model and hint>.hist`), JSON: the
//! model's fingerprint, the client's hint, what drafting from it learned, each answer's count
//! of tokens and the tokens, with a sha256 of all of them. It is written whole (to a
//! temporary file, then renamed over the old) after each answer is added, and deleted when
//! the history is cleared; the daemon reads them all when it starts. A file that does not
//! parse, says another version or fails its checksum is ignored with a warning.
//!
//! The files are written by a thread of their own, not by the request that added the answer:
//! a full history is some 100 kB of JSON, which took a request 4 ms on a 2-core x86 VM (on
//! top of 1.5 ms to add the answer in memory) and would take longer on a board's SD card.
//! Only the latest version of each history waits to be written, so a burst of answers is
//! written once, and an older version can never be written over a newer one. The daemon
//! waits for what is waiting when it stops ([`HistoryDir::flush`]).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use pocket_core::Token;
use pocket_core::spec::{History, Recall};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const VERSION: u32 = 1;
const EXTENSION: &str = "hist";

/// A history as its file holds it.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    version: u32,
    model: String,
    hint: Option<String>,
    learned: [[f64; 2]; 6],
    entries: Vec<usize>,
    tokens: Vec<Token>,
    /// sha256 of everything above but the version, as hex (see [`checksum`]).
    sha256: String,
}

/// A history read back.
pub(super) struct Loaded {
    pub(super) model: String,
    pub(super) hint: Option<String>,
    pub(super) history: History,
    pub(super) learned: Recall,
}

/// A history's model and hint.
type Key = (String, Option<String>);

/// A history as it is to be written: its tokens, each answer's count of them, and what
/// drafting from it learned. A copy (some 64 kB for a full history), so that the writer holds
/// no reference to the history itself, which the next answer would then have to copy whole.
struct Snapshot {
    tokens: Vec<Token>,
    entries: Vec<usize>,
    learned: Recall,
}

/// What waits for the writer.
#[derive(Default)]
struct Pending {
    /// The latest version of each history not yet written.
    latest: HashMap<Key, Snapshot>,
    /// Whether the writer is writing a batch it took.
    writing: bool,
    /// Whether the writer should stop once nothing waits.
    stop: bool,
}

/// What the callers and the writer share.
struct Shared {
    dir: PathBuf,
    pending: Mutex<Pending>,
    /// Wakes the writer: something waits, or it should stop.
    wake: Condvar,
    /// Wakes [`HistoryDir::flush`]: nothing waits and nothing is being written.
    idle: Condvar,
    /// Held while files are written or deleted, so that a clear waits for a batch being
    /// written and deletes what it wrote. Taken before `pending` where both are.
    io: Mutex<()>,
    /// Names the temporary files of writes apart.
    writes: AtomicU64,
}

/// The directory the histories are written to, and the thread that writes them.
pub(super) struct HistoryDir {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HistoryDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryDir").field("dir", &self.shared.dir).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Whole-value updates only: a panic elsewhere cannot leave them half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HistoryDir {
    /// `dir`, made if missing, and its writer started; `None` (with a warning) where either
    /// cannot be.
    pub(super) fn open(dir: PathBuf) -> Option<HistoryDir> {
        if let Err(e) = fs::create_dir_all(&dir) {
            tracing::warn!(
                "earlier answers' directory {}: {e}; they will not be kept on disk",
                dir.display()
            );
            return None;
        }
        let shared = Arc::new(Shared {
            dir,
            pending: Mutex::default(),
            wake: Condvar::new(),
            idle: Condvar::new(),
            io: Mutex::new(()),
            writes: AtomicU64::new(0),
        });
        let writing = shared.clone();
        match std::thread::Builder::new().name("history-writer".into()).spawn(move || writing.run()) {
            Ok(writer) => Some(HistoryDir { shared, writer: Some(writer) }),
            Err(e) => {
                tracing::warn!(
                    "cannot start the writer of earlier answers: {e}; they will not be kept on disk"
                );
                None
            }
        }
    }

    /// Has `model`'s `history` under `hint`, with what drafting from it `learned`, written in
    /// place of what was written of it before, soon, by the writer; a failure is a warning.
    pub(super) fn write(&self, model: &str, hint: Option<&str>, history: &History, learned: Recall) {
        let (tokens, entries) = history.saved();
        let snapshot = Snapshot { tokens: tokens.to_vec(), entries, learned };
        let mut pending = lock(&self.shared.pending);
        pending.latest.insert((model.to_owned(), hint.map(str::to_owned)), snapshot);
        self.shared.wake.notify_one();
    }

    /// Waits until every history handed to [`HistoryDir::write`] is written.
    pub(super) fn flush(&self) {
        let mut pending = lock(&self.shared.pending);
        while !pending.latest.is_empty() || pending.writing {
            pending = self.shared.idle.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Every history in the directory, most recently written first; files that are not
    /// valid are skipped with a warning.
    pub(super) fn read_all(&self) -> Vec<Loaded> {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = self
            .shared
            .files()
            .into_iter()
            .map(|p| (fs::metadata(&p).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH), p))
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        files
            .into_iter()
            .filter_map(|(_, path)| match read(&path) {
                Ok(loaded) => Some(loaded),
                Err(why) => {
                    tracing::warn!("ignoring earlier answers in {}: {why}", path.display());
                    None
                }
            })
            .collect()
    }

    /// Deletes the files of the histories under `hint` (every model's), or all of them, and
    /// what of them waits to be written; a batch being written is written first.
    pub(super) fn remove(&self, hint: Option<&str>) {
        let _io = lock(&self.shared.io);
        lock(&self.shared.pending)
            .latest
            .retain(|(_, h), _| hint.is_some_and(|hint| h.as_deref() != Some(hint)));
        for path in self.shared.files() {
            let matches = match hint {
                None => true,
                // A file that cannot be read is nobody's to keep.
                Some(h) => read(&path).map_or(true, |l| l.hint.as_deref() == Some(h)),
            };
            if matches && let Err(e) = fs::remove_file(&path) {
                tracing::warn!("cannot delete earlier answers in {}: {e}", path.display());
            }
        }
    }
}

impl Drop for HistoryDir {
    /// Writes what waits, then stops the writer.
    fn drop(&mut self) {
        lock(&self.shared.pending).stop = true;
        self.shared.wake.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Shared {
    /// The writer: writes what waits, batch after batch, until told to stop with nothing
    /// left.
    fn run(&self) {
        loop {
            {
                let mut pending = lock(&self.pending);
                while pending.latest.is_empty() && !pending.stop {
                    pending = self.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
                }
                if pending.latest.is_empty() {
                    return;
                }
                pending.writing = true;
            }
            {
                // Taken under `io`, so that a clear in between has removed its own.
                let _io = lock(&self.io);
                let batch = std::mem::take(&mut lock(&self.pending).latest);
                for ((model, hint), snapshot) in batch {
                    self.write_file(&model, hint.as_deref(), snapshot);
                }
            }
            let mut pending = lock(&self.pending);
            pending.writing = false;
            if pending.latest.is_empty() {
                self.idle.notify_all();
            }
        }
    }

    fn path(&self, model: &str, hint: Option<&str>) -> PathBuf {
        let mut h = Sha256::new();
        h.update(model.as_bytes());
        h.update([0]);
        if let Some(hint) = hint {
            h.update([1]);
            h.update(hint.as_bytes());
        }
        let name: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.{EXTENSION}"))
    }

    /// Writes `model`'s history under `hint`, replacing what was written of it before; a
    /// failure is a warning.
    fn write_file(&self, model: &str, hint: Option<&str>, snapshot: Snapshot) {
        let Snapshot { tokens, entries, learned } = snapshot;
        let learned = learned.counts();
        let saved = Saved {
            version: VERSION,
            model: model.to_owned(),
            hint: hint.map(str::to_owned),
            learned,
            sha256: checksum(model, hint, &learned, &entries, &tokens),
            entries,
            tokens,
        };
        let path = self.path(model, hint);
        let n = self.writes.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("{EXTENSION}.{}.{n}.tmp", std::process::id()));
        let written = serde_json::to_vec(&saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| fs::write(&tmp, bytes))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            tracing::warn!("cannot write earlier answers to {}: {e}", path.display());
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == EXTENSION))
            .collect()
    }
}

/// Reads and checks one file.
fn read(path: &Path) -> Result<Loaded, String> {
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let s: Saved = serde_json::from_slice(&bytes).map_err(|e| format!("not a history file: {e}"))?;
    if s.version != VERSION {
        return Err(format!("version {}, not {VERSION}", s.version));
    }
    if s.sha256 != checksum(&s.model, s.hint.as_deref(), &s.learned, &s.entries, &s.tokens) {
        return Err("its checksum does not match (damaged)".into());
    }
    let history = History::from_saved(&s.tokens, &s.entries)
        .ok_or_else(|| "its answers do not add up to its tokens".to_owned())?;
    Ok(Loaded { model: s.model, hint: s.hint, history, learned: Recall::from_counts(s.learned) })
}

/// sha256 of a history's fields, as hex: the model, the hint (absent and empty apart), the
/// learned counts, the entries and the tokens, little-endian.
fn checksum(
    model: &str,
    hint: Option<&str>,
    learned: &[[f64; 2]; 6],
    entries: &[usize],
    tokens: &[Token],
) -> String {
    let mut h = Sha256::new();
    h.update(model.as_bytes());
    h.update([0]);
    match hint {
        Some(hint) => {
            h.update([1]);
            h.update(hint.as_bytes());
        }
        None => h.update([0]),
    }
    for c in learned.iter().flatten() {
        h.update(c.to_le_bytes());
    }
    for &n in entries {
        h.update((n as u64).to_le_bytes());
    }
    for &t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
