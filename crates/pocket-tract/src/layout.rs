//! Which ONNX files a model directory holds, and which layout they make.
//!
//! Two layouts are read:
//! - Hugging Face Optimum's seq2seq export: `encoder_model.onnx`, `decoder_model.onnx` and,
//!   optionally, `decoder_with_past_model.onnx` (the decoder that takes and returns a KV
//!   cache);
//! - the two-file export without a cache: `encoder.onnx` and `decoder.onnx`.
//!
//! Both need `tokenizer.json` beside them; `config.json` and `generation_config.json` are read
//! when present for the special token ids.

use std::path::{Path, PathBuf};

use crate::Error;

/// The files of one model directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The directory.
    pub dir: PathBuf,
    /// The encoder graph.
    pub encoder: PathBuf,
    /// The decoder graph for the first call (or every call, without a cache).
    pub decoder: PathBuf,
    /// The decoder graph that takes the KV cache, if the export has one.
    pub decoder_with_past: Option<PathBuf>,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// `config.json`, if present.
    pub config: Option<PathBuf>,
    /// `generation_config.json`, if present.
    pub generation_config: Option<PathBuf>,
}

const OPTIMUM: [&str; 2] = ["encoder_model.onnx", "decoder_model.onnx"];
const TWO_FILE: [&str; 2] = ["encoder.onnx", "decoder.onnx"];

impl Layout {
    /// The layout of `dir`, or an error that says what is missing and what was expected.
    pub fn find(dir: &Path) -> Result<Layout, Error> {
        let fail = |reason: String| Error::Layout { dir: dir.to_path_buf(), reason };
        if !dir.is_dir() {
            let what = if dir.exists() { "is not a directory" } else { "does not exist" };
            return Err(fail(format!(
                "{what}; an encoder-decoder model is a directory with {} (or {}) and tokenizer.json",
                OPTIMUM.join(" + "),
                TWO_FILE.join(" + ")
            )));
        }
        let has = |name: &str| dir.join(name).is_file();
        let (encoder, decoder, with_past) = if OPTIMUM.iter().any(|n| has(n)) {
            (
                OPTIMUM[0],
                OPTIMUM[1],
                has("decoder_with_past_model.onnx").then_some("decoder_with_past_model.onnx"),
            )
        } else if TWO_FILE.iter().any(|n| has(n)) {
            (TWO_FILE[0], TWO_FILE[1], None)
        } else if has("model.onnx") || has("decoder_model_merged.onnx") {
            return Err(fail(format!(
                "holds {}, a decoder-only export; pocketd runs decoder-only models from GGUF files, \
                 and encoder-decoder models from {} (or {}) with tokenizer.json",
                if has("model.onnx") { "model.onnx" } else { "decoder_model_merged.onnx" },
                OPTIMUM.join(" + "),
                TWO_FILE.join(" + ")
            )));
        } else {
            return Err(fail(format!(
                "no encoder-decoder graphs: expected {} (optionally decoder_with_past_model.onnx), or {}; \
                 found {}",
                OPTIMUM.join(" + "),
                TWO_FILE.join(" + "),
                listing(dir)
            )));
        };
        for name in [encoder, decoder, "tokenizer.json"] {
            if !has(name) {
                return Err(fail(format!(
                    "{name} is missing (beside {}); found {}",
                    [encoder, decoder].iter().filter(|&&n| n != name).copied().collect::<Vec<_>>().join(", "),
                    listing(dir)
                )));
            }
        }
        let optional = |name: &str| has(name).then(|| dir.join(name));
        Ok(Layout {
            dir: dir.to_path_buf(),
            encoder: dir.join(encoder),
            decoder: dir.join(decoder),
            decoder_with_past: with_past.map(|n| dir.join(n)),
            tokenizer: dir.join("tokenizer.json"),
            config: optional("config.json"),
            generation_config: optional("generation_config.json"),
        })
    }

    /// The graph files, in the order they load.
    pub fn graphs(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.encoder), Some(&self.decoder), self.decoder_with_past.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| p.as_path())
    }

    /// Bytes of the graph files: the weights tract holds in memory.
    pub fn graph_bytes(&self) -> u64 {
        self.graphs().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
    }
}

/// The file names in `dir`, sorted, for an error message.
fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    if names.is_empty() { "nothing".into() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, names: &[&str]) {
        for n in names {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
    }

    #[test]
    fn finds_both_layouts() {
        let d = tempfile::tempdir().unwrap();
        touch(
            d.path(),
            &["encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx", "tokenizer.json"],
        );
        let l = Layout::find(d.path()).unwrap();
        assert!(l.decoder_with_past.is_some());
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), &["encoder.onnx", "decoder.onnx", "tokenizer.json"]);
        let l = Layout::find(d.path()).unwrap();
        assert_eq!(l.decoder_with_past, None);
        assert!(l.decoder.ends_with("decoder.onnx"));
    }

    #[test]
    fn says_what_is_missing() {
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), &["encoder_model.onnx", "tokenizer.json"]);
        let e = Layout::find(d.path()).unwrap_err().to_string();
        assert!(e.contains("decoder_model.onnx is missing"), "{e}");
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), &["encoder.onnx", "decoder.onnx"]);
        let e = Layout::find(d.path()).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json is missing"), "{e}");
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), &["model.onnx", "tokenizer.json"]);
        let e = Layout::find(d.path()).unwrap_err().to_string();
        assert!(e.contains("decoder-only"), "{e}");
        let e = Layout::find(&d.path().join("nope")).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
