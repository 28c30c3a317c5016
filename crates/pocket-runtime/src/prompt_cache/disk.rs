//! Parked prefixes on disk, across model unloads and daemon restarts.
//!
//! One file per prefix: a magic, a JSON header (the [`PrefixKey`] it may be restored under,
//! the client's hint, sizes and a sha256 of everything after the header), the tokens, then the
//! engine's bytes. Only headers and tokens are read when the directory is opened; a file is
//! read whole, and its checksum checked, only when a request's prefix matches it. A file that
//! is not one of ours, is cut short, fails its checksum or says another version is ignored
//! with a warning and never loaded; one for another model or KV type is simply never matched.
//! The directory is kept under a size, least recently used files deleted first.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use pocket_core::{SavedState, Token};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PrefixKey, lock};

const MAGIC: &[u8; 8] = b"PKTPRFX\0";
const VERSION: u32 = 1;
const EXTENSION: &str = "pkv";
/// Longest header read: past it a file is not ours.
const MAX_HEADER: usize = 64 * 1024;

/// Where parked prefixes are written, and how much of it they may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskOptions {
    /// The directory (made if missing).
    pub dir: PathBuf,
    /// Most bytes its files may take; the least recently used go first.
    pub max_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    version: u32,
    key: PrefixKey,
    hint: Option<String>,
    tokens: usize,
    data_bytes: u64,
    /// sha256 of the tokens (u32, little-endian) and the data, as hex.
    sha256: String,
}

/// A file in the directory, as its header and tokens describe it.
#[derive(Debug, Clone)]
pub(super) struct FileEntry {
    path: PathBuf,
    pub(super) key: PrefixKey,
    pub(super) hint: Option<String>,
    tokens: Vec<Token>,
    header: Header,
    /// Bytes it takes in memory once read (tokens and data).
    pub(super) bytes: u64,
    /// Bytes of the file.
    file_bytes: u64,
    used: SystemTime,
}

pub(super) struct Disk {
    options: DiskOptions,
    index: Mutex<Vec<FileEntry>>,
    written: AtomicU64,
    read: AtomicU64,
    errors: AtomicU64,
}

impl Disk {
    /// The directory of `options`, its files' headers read (those that are not valid are
    /// ignored with a warning).
    pub(super) fn open(options: DiskOptions) -> Disk {
        let disk = Disk {
            index: Mutex::new(Vec::new()),
            written: AtomicU64::new(0),
            read: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            options,
        };
        let dir = &disk.options.dir;
        if let Err(e) = fs::create_dir_all(dir) {
            tracing::warn!(
                "prompt cache directory {}: {e}; prefixes will not be kept on disk",
                dir.display()
            );
            return disk;
        }
        let mut index = Vec::new();
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != EXTENSION) {
                continue;
            }
            match read_head(&path) {
                Ok(f) => index.push(f),
                Err(why) => disk.ignore(&path, &why),
            }
        }
        if !index.is_empty() {
            tracing::info!(files = index.len(), dir = %dir.display(), "prompt cache on disk");
        }
        *lock(&disk.index) = index;
        disk
    }

    pub(super) fn dir(&self) -> &Path {
        &self.options.dir
    }

    fn ignore(&self, path: &Path, why: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("ignoring prompt cache file {}: {why}", path.display());
    }

    /// (written, read back, ignored or failed).
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (l(&self.written), l(&self.read), l(&self.errors))
    }

    /// The eligible file that gives a request the most tokens (`usable` of its tokens), if
    /// that is more than `better_than`.
    pub(super) fn best(
        &self,
        eligible: &dyn Fn(&PrefixKey, Option<&str>) -> bool,
        usable: &dyn Fn(&[Token]) -> usize,
        better_than: usize,
    ) -> Option<(FileEntry, usize)> {
        let index = lock(&self.index);
        index
            .iter()
            .filter(|f| eligible(&f.key, f.hint.as_deref()))
            .map(|f| (usable(&f.tokens), f))
            .filter(|(n, _)| *n > better_than)
            .max_by_key(|(n, _)| *n)
            .map(|(n, f)| (f.clone(), n))
    }

    /// Read `file` whole and check it; `None` (with a warning, and the file forgotten) when it
    /// is not what its header said.
    pub(super) fn read(&self, file: &FileEntry) -> Option<SavedState> {
        match read_whole(file) {
            Ok(saved) => {
                self.read.fetch_add(1, Ordering::Relaxed);
                let _ = File::options()
                    .write(true)
                    .open(&file.path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                tracing::info!(tokens = saved.tokens.len(), file = %file.path.display(), "prefix read back from disk");
                Some(saved)
            }
            Err(why) => {
                self.ignore(&file.path, &why);
                lock(&self.index).retain(|f| f.path != file.path);
                None
            }
        }
    }

    /// Write `saved` (kept under `key` and `hint`), replacing files it extends, and keep the
    /// directory under its size. A failure is a warning: the prefix is only not kept.
    pub(super) fn write(&self, key: &PrefixKey, hint: Option<&str>, saved: &SavedState) {
        match self.try_write(key, hint, saved) {
            Ok(true) => {
                self.written.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot write a prefix to {}: {e}", self.options.dir.display());
            }
        }
    }

    fn try_write(&self, key: &PrefixKey, hint: Option<&str>, saved: &SavedState) -> std::io::Result<bool> {
        let mut index = lock(&self.index);
        let same = |f: &FileEntry| &f.key == key && f.hint.as_deref() == hint;
        if index.iter().any(|f| same(f) && f.tokens == saved.tokens) {
            return Ok(false); // already there (read back and parked again unchanged)
        }
        let sha256 = checksum(&saved.tokens, &saved.data);
        let header = Header {
            version: VERSION,
            key: key.clone(),
            hint: hint.map(str::to_owned),
            tokens: saved.tokens.len(),
            data_bytes: saved.data.len() as u64,
            sha256: sha256.clone(),
        };
        let json = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
        let file_bytes = (MAGIC.len() + 4 + json.len() + 4 * saved.tokens.len() + saved.data.len()) as u64;
        if file_bytes > self.options.max_bytes {
            return Ok(false);
        }
        let name = {
            let mut n = Sha256::new();
            n.update(&json);
            format!("{}.{EXTENSION}", &hex(&n.finalize())[..32])
        };
        let path = self.options.dir.join(&name);
        let tmp = self.options.dir.join(format!(".{name}.tmp"));
        {
            let mut f = std::io::BufWriter::new(File::create(&tmp)?);
            f.write_all(MAGIC)?;
            f.write_all(&(json.len() as u32).to_le_bytes())?;
            f.write_all(&json)?;
            for t in &saved.tokens {
                f.write_all(&t.to_le_bytes())?;
            }
            f.write_all(&saved.data)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        fs::rename(&tmp, &path)?;
        // Files this one extends hold nothing it does not.
        index.retain(|f| {
            let extended = same(f) && f.path != path && saved.tokens.starts_with(&f.tokens);
            if extended {
                let _ = fs::remove_file(&f.path);
            }
            !extended && f.path != path
        });
        index.push(FileEntry {
            path,
            key: key.clone(),
            hint: hint.map(str::to_owned),
            tokens: saved.tokens.clone(),
            header,
            bytes: saved.bytes(),
            file_bytes,
            used: SystemTime::now(),
        });
        // Keep under the size: least recently used first.
        index.sort_by_key(|f| std::cmp::Reverse(f.used));
        let mut total = 0;
        index.retain(|f| {
            total += f.file_bytes;
            let keep = total <= self.options.max_bytes;
            if !keep {
                let _ = fs::remove_file(&f.path);
            }
            keep
        });
        Ok(true)
    }
}

/// The sha256 a file's header carries: of its tokens (u32, little-endian) and its data.
fn checksum(tokens: &[Token], data: &[u8]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update(data);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// The header and tokens of the file at `path`, checked against its length.
fn read_head(path: &Path) -> Result<FileEntry, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(file);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| "shorter than a header".to_owned())?;
    if &magic != MAGIC {
        return Err("not a pocketd prompt cache file".into());
    }
    let len = read_u32(&mut r).map_err(|_| "cut short in its header".to_owned())? as usize;
    if len > MAX_HEADER {
        return Err(format!("a header of {len} bytes (at most {MAX_HEADER})"));
    }
    let mut json = vec![0u8; len];
    r.read_exact(&mut json).map_err(|_| "cut short in its header".to_owned())?;
    let header: Header = serde_json::from_slice(&json).map_err(|e| format!("unreadable header: {e}"))?;
    if header.version != VERSION {
        return Err(format!("version {} (this pocketd reads {VERSION})", header.version));
    }
    let expected = (MAGIC.len() + 4 + len) as u64 + 4 * header.tokens as u64 + header.data_bytes;
    if meta.len() != expected {
        return Err(format!("{} bytes where its header says {expected}", meta.len()));
    }
    let mut tokens = Vec::with_capacity(header.tokens);
    for _ in 0..header.tokens {
        tokens.push(read_u32(&mut r).map_err(|e| e.to_string())?);
    }
    Ok(FileEntry {
        path: path.to_path_buf(),
        key: header.key.clone(),
        hint: header.hint.clone(),
        bytes: header.data_bytes + 4 * header.tokens as u64,
        file_bytes: meta.len(),
        used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        tokens,
        header,
    })
}

/// The whole file of `entry`, checked: the same header as when it was indexed, and the
/// checksum.
fn read_whole(entry: &FileEntry) -> Result<SavedState, String> {
    let fresh = read_head(&entry.path)?;
    if fresh.header != entry.header || fresh.tokens != entry.tokens {
        return Err("changed since it was indexed".into());
    }
    let mut r = BufReader::new(File::open(&entry.path).map_err(|e| e.to_string())?);
    let skip = entry.file_bytes - entry.header.data_bytes;
    std::io::copy(&mut r.by_ref().take(skip), &mut std::io::sink()).map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    data.try_reserve_exact(entry.header.data_bytes as usize).map_err(|e| e.to_string())?;
    r.read_to_end(&mut data).map_err(|e| e.to_string())?;
    if checksum(&fresh.tokens, &data) != entry.header.sha256 {
        return Err("its checksum does not match (the file is corrupt)".into());
    }
    Ok(SavedState { tokens: fresh.tokens, kv: entry.key.kv, data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pocket_core::KvType;

    fn key() -> PrefixKey {
        super::super::tests::key(KvType::F16)
    }

    fn usable(saved: &[Token], tokens: &[Token]) -> usize {
        key().usable(saved, tokens)
    }

    fn options(dir: &Path) -> DiskOptions {
        DiskOptions { dir: dir.to_path_buf(), max_bytes: 1 << 20 }
    }

    #[test]
    fn prefixes_come_back_checked_and_corrupt_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let saved = SavedState { tokens: vec![1, 2, 3, 4], kv: KvType::F16, data: (0..200).collect() };
        let disk = Disk::open(options(dir.path()));
        disk.write(&key(), Some("alice"), &saved);
        fs::write(dir.path().join("stray.pkv"), b"not ours").unwrap();

        let disk = Disk::open(options(dir.path()));
        assert_eq!(disk.counts().2, 1, "the stray file is ignored");
        let eligible = |k: &PrefixKey, h: Option<&str>| k == &key() && h == Some("alice");
        let (file, len) = disk.best(&eligible, &|t| usable(t, &[1, 2, 3, 9]), 0).unwrap();
        assert_eq!(len, 3);
        assert_eq!(disk.read(&file).unwrap(), saved);
        let other = |k: &PrefixKey, _: Option<&str>| k.kv == KvType::Q8_0;
        assert!(
            disk.best(&other, &|t| usable(t, &[1, 2, 3, 9]), 0).is_none(),
            "another KV type never matches"
        );

        // One flipped byte in the data: refused, and forgotten.
        let path = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap() != "stray.pkv")
            .unwrap();
        let mut bytes = fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(disk.read(&file).is_none());
        assert!(disk.best(&eligible, &|t| usable(t, &[1, 2, 3, 9]), 0).is_none());
    }

    #[test]
    fn the_directory_keeps_under_its_size_and_longer_prefixes_replace_shorter() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::open(DiskOptions { dir: dir.path().to_path_buf(), max_bytes: 3000 });
        let s = |tokens: Vec<Token>| SavedState { tokens, kv: KvType::F16, data: vec![1; 1000] };
        disk.write(&key(), None, &s(vec![1]));
        disk.write(&key(), None, &s(vec![1, 2]));
        assert_eq!(lock(&disk.index).len(), 1, "[1, 2] extends [1]");
        disk.write(&key(), None, &s(vec![5]));
        disk.write(&key(), None, &s(vec![6]));
        let index = lock(&disk.index);
        assert_eq!(index.len(), 2, "two files of ~1.3 kB fit 3 kB, three do not");
        assert!(index.iter().all(|f| f.tokens != vec![1, 2]), "the oldest went");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
