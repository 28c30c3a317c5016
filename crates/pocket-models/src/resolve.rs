//! What `-m MODEL` means: a path, a manifest name, or a file in the models directory.

use std::path::{Path, PathBuf};

use crate::manifest::{Catalog, Manifest};
use crate::{Error, Result};

/// A model on disk, ready for an engine to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// What to open: the model file, or for an ONNX (or other multi-file) model the directory
    /// holding its files.
    pub path: PathBuf,
    /// Every file of the model, in the manifest's order (just `path` for a bare file).
    pub files: Vec<PathBuf>,
    /// The manifest, when the model is a known one (also for a pulled file named by path
    /// or file name); `None` for a file no manifest describes.
    pub manifest: Option<Manifest>,
}

impl ResolvedModel {
    /// The model `manifest` describes, if it is pulled into `models_dir`, else
    /// [`Error::NotPulled`].
    pub(crate) fn pulled(manifest: &Manifest, models_dir: &Path) -> Result<ResolvedModel> {
        if let Some(path) = manifest.first_missing(models_dir) {
            return Err(Error::NotPulled { name: manifest.name.clone(), path });
        }
        Ok(ResolvedModel {
            path: manifest.path(models_dir),
            files: manifest.files.iter().map(|f| f.path(models_dir)).collect(),
            manifest: Some(manifest.clone()),
        })
    }
}

/// Resolves what a user typed after `-m`, in this order:
///
/// 1. a path to an existing file (absolute, or relative to the current directory);
/// 2. a manifest name (built-in, or a user manifest in `models_dir`): its files if pulled,
///    else [`Error::NotPulled`] saying to run `pocket pull NAME`;
/// 3. a file in `models_dir` by file name (`foo.gguf`) or by file stem (`foo`), so a model
///    file dropped there needs no manifest;
/// 4. otherwise [`Error::UnknownModel`], listing the names that would work.
///
/// `spec` may name any readable file, so don't pass it untrusted input (from a socket
/// client, say) without restricting it first.
pub fn resolve(spec: &str, models_dir: &Path) -> Result<ResolvedModel> {
    // Before loading the catalog, so that an explicit path works even when a user
    // manifest in the models directory is broken.
    if let Some(model) = as_file(spec) {
        return Ok(model);
    }
    Catalog::load(models_dir)?.resolve(spec, models_dir)
}

impl Catalog {
    /// [`resolve`] with this catalog instead of loading one from `models_dir`.
    pub fn resolve(&self, spec: &str, models_dir: &Path) -> Result<ResolvedModel> {
        if let Some(model) = as_file(spec) {
            return Ok(model);
        }
        if let Some(manifest) = self.get(spec) {
            return ResolvedModel::pulled(manifest, models_dir);
        }
        let loose = loose_files(models_dir)?;
        let by_name = models_dir.join(spec);
        let found = if !spec.is_empty() && by_name.is_file() {
            Some(by_name)
        } else {
            // Sorted, so a stem shared by foo.gguf and foo.onnx picks the same one every time.
            loose.iter().find(|p| p.file_stem().is_some_and(|s| s == spec)).cloned()
        };
        if let Some(path) = found {
            // A pulled file named by its file name is still that model: keep its manifest.
            let manifest = self
                .manifests()
                .iter()
                .find(|m| m.files.len() == 1 && m.files.iter().any(|f| f.path(models_dir) == path));
            return Ok(ResolvedModel { files: vec![path.clone()], path, manifest: manifest.cloned() });
        }
        let mut known: Vec<String> = self.names().map(str::to_owned).collect();
        known.extend(loose.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()));
        Err(Error::UnknownModel { name: spec.to_owned(), known })
    }
}

/// The model files directly in `models_dir`, sorted: regular files (or symlinks to them)
/// that are not pocket's own (hidden files, `*.toml` manifests). Includes pulled files of
/// single-file manifests. An absent directory has none.
pub fn loose_files(models_dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(models_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", models_dir, e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io("list", models_dir, e))?.path();
        let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !name.starts_with('.') && !name.ends_with(".toml") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn as_file(spec: &str) -> Option<ResolvedModel> {
    let path = Path::new(spec);
    (!spec.is_empty() && path.is_file()).then(|| ResolvedModel {
        path: path.to_path_buf(),
        files: vec![path.to_path_buf()],
        manifest: None,
    })
}
