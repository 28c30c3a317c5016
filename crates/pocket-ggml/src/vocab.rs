//! Tokenizer and chat template, from the GGUF file through llama.cpp's vocab-only load.

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;
use pocket_core::{ChatMessage, Token, Tokenizer};

use crate::ffi::device::cstring;
use crate::{Error, Result};

/// A model's vocabulary, loaded by llama.cpp without its weights.
pub struct Vocab {
    model: NonNull<sys::llama_model>,
    vocab: *const sys::llama_vocab,
    template: Option<CString>,
}

// SAFETY: after loading, the vocabulary is only read: llama.cpp's tokenizer and piece lookups
// take a const vocab and keep their caches precomputed at load time.
unsafe impl Send for Vocab {}
// SAFETY: as for Send.
unsafe impl Sync for Vocab {}

impl Drop for Vocab {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, freed once.
        unsafe { sys::llama_model_free(self.model.as_ptr()) }
    }
}

impl Vocab {
    /// Load the vocabulary of the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        crate::ffi::init();
        let cpath = cstring(&path.to_string_lossy());
        // SAFETY: default parameters with vocab_only set; cpath is a valid C string.
        let model = unsafe {
            let mut params = sys::llama_model_default_params();
            params.vocab_only = true;
            sys::llama_model_load_from_file(cpath.as_ptr(), params)
        };
        let model = NonNull::new(model).ok_or_else(|| Error::BadModel {
            path: path.to_owned(),
            reason: "llama.cpp could not load its vocabulary".into(),
        })?;
        // SAFETY: a loaded model; the vocab pointer lives as long as the model.
        let vocab = unsafe { sys::llama_model_get_vocab(model.as_ptr()) };
        // SAFETY: a loaded model; the template string, if any, is owned by the model and copied.
        let template = unsafe {
            let t = sys::llama_model_chat_template(model.as_ptr(), std::ptr::null());
            (!t.is_null()).then(|| std::ffi::CStr::from_ptr(t).to_owned())
        };
        Ok(Vocab { model, vocab, template })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        // SAFETY: valid vocab.
        unsafe { sys::llama_vocab_n_tokens(self.vocab) }.max(0) as usize
    }

    /// Whether the model comes with a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }
}

impl Tokenizer for Vocab {
    fn encode(&self, text: &str, add_special: bool) -> pocket_core::Result<Vec<Token>> {
        let len = i32::try_from(text.len())
            .map_err(|_| pocket_core::Error::Tokenizer("text longer than 2 GiB".into()))?;
        let mut out: Vec<sys::llama_token> = vec![0; text.len() + 2];
        loop {
            // SAFETY: text is valid for len bytes; out has room for out.len() tokens.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab,
                    text.as_ptr() as *const _,
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    true,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out.into_iter().map(|t| t as Token).collect());
            }
            if n == i32::MIN {
                return Err(pocket_core::Error::Tokenizer("text too long to tokenize".into()));
            }
            out.resize((-n) as usize, 0);
        }
    }

    fn piece(&self, token: Token) -> Vec<u8> {
        let mut buf = vec![0u8; 32];
        loop {
            // SAFETY: buf has room for buf.len() bytes; invalid ids yield an empty piece.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab,
                    token as sys::llama_token,
                    buf.as_mut_ptr() as *mut _,
                    buf.len() as i32,
                    0,
                    false,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    fn is_end(&self, token: Token) -> bool {
        // SAFETY: valid vocab; out-of-range ids are answered false by llama.cpp.
        unsafe { sys::llama_vocab_is_eog(self.vocab, token as sys::llama_token) }
    }

    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_assistant: bool,
    ) -> pocket_core::Result<String> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| pocket_core::Error::Unsupported("this model has no chat template".into()))?;
        let strings: Vec<(CString, CString)> =
            messages.iter().map(|m| (cstring(m.role.as_str()), cstring(&m.content))).collect();
        let msgs: Vec<sys::llama_chat_message> = strings
            .iter()
            .map(|(r, c)| sys::llama_chat_message { role: r.as_ptr(), content: c.as_ptr() })
            .collect();
        let mut buf = vec![0u8; 256 + messages.iter().map(|m| m.content.len() * 2).sum::<usize>()];
        loop {
            // SAFETY: msgs point into `strings`, alive for the call; buf has buf.len() bytes.
            let n = unsafe {
                sys::llama_chat_apply_template(
                    template.as_ptr(),
                    msgs.as_ptr(),
                    msgs.len(),
                    add_assistant,
                    buf.as_mut_ptr() as *mut _,
                    buf.len() as i32,
                )
            };
            if n < 0 {
                return Err(pocket_core::Error::Unsupported(
                    "llama.cpp does not recognise this model's chat template".into(),
                ));
            }
            if (n as usize) <= buf.len() {
                buf.truncate(n as usize);
                return String::from_utf8(buf).map_err(|_| {
                    pocket_core::Error::Tokenizer("chat template produced invalid UTF-8".into())
                });
            }
            buf.resize(n as usize, 0);
        }
    }
}
