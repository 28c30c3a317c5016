//! Earlier answers on disk, beside the prompt cache's files, so that a restarted daemon drafts
//! from what it had been answering.
//!
//! One file per history (`<16 hex digits of the sha256 of model and hint>.hist`), JSON: the
//! model's fingerprint, the client's hint, what drafting from it learned, each answer's count
//! of tokens and the tokens, with a sha256 of all of them. It is written whole (to a
//! temporary file, then renamed over the old) each time an answer is added, and deleted when
//! the history is cleared; the daemon reads them all when it starts. A file that does not
//! parse, says another version or fails its checksum is ignored with a warning.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The directory the histories are written to.
#[derive(Debug)]
pub(super) struct HistoryDir {
    dir: PathBuf,
    /// Names the temporary files of writes under way apart.
    writes: AtomicU64,
}

impl HistoryDir {
    /// `dir`, made if missing; `None` (with a warning) where it cannot be.
    pub(super) fn open(dir: PathBuf) -> Option<HistoryDir> {
        match fs::create_dir_all(&dir) {
            Ok(()) => Some(HistoryDir { dir, writes: AtomicU64::new(0) }),
            Err(e) => {
                tracing::warn!(
                    "earlier answers' directory {}: {e}; they will not be kept on disk",
                    dir.display()
                );
                None
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

    /// Writes `model`'s `history` under `hint` with what drafting from it `learned`,
    /// replacing what was written of it before; a failure is a warning.
    pub(super) fn write(&self, model: &str, hint: Option<&str>, history: &History, learned: &Recall) {
        let (tokens, entries) = history.saved();
        let learned = learned.counts();
        let saved = Saved {
            version: VERSION,
            model: model.to_owned(),
            hint: hint.map(str::to_owned),
            learned,
            sha256: checksum(model, hint, &learned, &entries, tokens),
            entries,
            tokens: tokens.to_vec(),
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

    /// Every history in the directory, most recently written first; files that are not
    /// valid are skipped with a warning.
    pub(super) fn read_all(&self) -> Vec<Loaded> {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = self
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

    /// Deletes the files of the histories under `hint` (every model's), or all of them.
    pub(super) fn remove(&self, hint: Option<&str>) {
        for path in self.files() {
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
