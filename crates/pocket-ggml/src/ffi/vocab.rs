//! Tokenizer and chat template, from the GGUF file through llama.cpp's vocab-only load.

use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use pocket_core::{ChatMessage, Token, Tokenizer};

use crate::error::{Error, Result};
use crate::ffi::device::cstring;
use crate::ffi::llama::{LlamaWeights, Load};

/// A model's vocabulary: llama.cpp's tokenizer and the chat template the file ships.
pub struct Vocab {
    // Keeps the model the vocabulary belongs to alive.
    owner: Arc<LlamaWeights>,
    vocab: *const sys::llama_vocab,
    template: Option<CString>,
    /// The template as UTF-8 text, for rendering it ourselves.
    template_text: Option<String>,
}

// SAFETY: after loading, the vocabulary is only read: llama.cpp's tokenizer and piece lookups
// take a const vocab and keep their caches precomputed at load time.
unsafe impl Send for Vocab {}
// SAFETY: as for Send.
unsafe impl Sync for Vocab {}

impl Vocab {
    /// Load the vocabulary of the GGUF file at `path` (without its weights).
    pub fn load(path: &Path) -> Result<Self> {
        let owner = LlamaWeights::load(path, Load::VocabOnly).ok_or_else(|| Error::BadModel {
            path: path.to_owned(),
            reason: "llama.cpp could not load its vocabulary".into(),
        })?;
        Ok(Self::of(Arc::new(owner)))
    }

    /// The vocabulary of a model llama.cpp loaded.
    pub(crate) fn of(owner: Arc<LlamaWeights>) -> Self {
        let vocab = owner.vocab();
        let template = owner.chat_template();
        let template_text = template.as_ref().and_then(|t| t.to_str().ok()).map(str::to_owned);
        Vocab { owner, vocab, template, template_text }
    }

    /// Number of tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        self.owner.n_vocab()
    }

    /// Whether the model comes with a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }
}

impl Vocab {
    /// The bytes of `token`; `special` renders control tokens (`<|im_end|>`) as their text
    /// instead of nothing.
    fn render(&self, token: Token, special: bool) -> Vec<u8> {
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
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
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
        self.render(token, false)
    }

    fn chat_template(&self) -> Option<&str> {
        self.template_text.as_deref()
    }

    fn bos_eos_text(&self) -> (String, String) {
        // SAFETY: valid vocab; these return a token id or -1 (LLAMA_TOKEN_NULL).
        let (bos, eos) = unsafe { (sys::llama_vocab_bos(self.vocab), sys::llama_vocab_eos(self.vocab)) };
        let text = |t: sys::llama_token| {
            if t < 0 {
                return String::new();
            }
            String::from_utf8_lossy(&self.render(t as Token, true)).into_owned()
        };
        (text(bos), text(eos))
    }

    fn special_text(&self, token: Token) -> Option<String> {
        if !self.render(token, false).is_empty() {
            return None;
        }
        let text = self.render(token, true);
        (!text.is_empty()).then(|| String::from_utf8_lossy(&text).into_owned())
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
