//! `tokenizer.json` through the `tokenizers` crate, as the engine boundary's [`Tokenizer`].

use std::path::Path;

use pocket_core::{ChatMessage, Token, Tokenizer};

use crate::Error;

/// SentencePiece's word-start mark, which stands for a space.
const WORD_START: char = '\u{2581}';

/// A Hugging Face tokenizer (T5's unigram model and the like).
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The model's name, for the no-chat-template error.
    model: String,
    eos: Token,
    /// Ids whose text is never shown (`<pad>`, `</s>`, `<unk>`, ...).
    special: Vec<bool>,
}

impl HfTokenizer {
    /// Load `path`; `eos` is the id that ends generation.
    pub(crate) fn load(path: &Path, model: &str, eos: Option<Token>) -> Result<Self, Error> {
        let bad = |reason: String| Error::BadTokenizer { path: path.to_path_buf(), reason };
        let mut inner = tokenizers::Tokenizer::from_file(path).map_err(|e| bad(e.to_string()))?;
        // A shipped tokenizer.json may cut inputs short or pad them (flan-t5's original cuts at
        // 48 tokens); the engine checks lengths itself and says so rather than cut silently.
        inner.with_truncation(None).map_err(|e| bad(e.to_string()))?;
        inner.with_padding(None);
        let vocab = inner.get_vocab_size(true);
        let mut special = vec![false; vocab];
        for (id, token) in inner.get_added_tokens_decoder() {
            if token.special && (id as usize) < vocab {
                special[id as usize] = true;
            }
        }
        let eos = match eos.or_else(|| inner.token_to_id("</s>")) {
            Some(id) => id,
            None => return Err(bad("no end-of-sequence token: no </s> and none in config.json".into())),
        };
        Ok(HfTokenizer { inner, model: model.to_owned(), eos, special })
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<Token> {
        self.inner.token_to_id(token)
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> Token {
        self.eos
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str, add_special: bool) -> pocket_core::Result<Vec<Token>> {
        let encoding =
            self.inner.encode(text, add_special).map_err(|e| pocket_core::Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn piece(&self, token: Token) -> Vec<u8> {
        if self.special.get(token as usize).copied().unwrap_or(true) {
            return Vec::new();
        }
        let Some(text) = self.inner.id_to_token(token) else { return Vec::new() };
        // Byte-fallback tokens (`<0x0A>`) stand for one byte, which may be part of a character.
        if let Some(hex) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'))
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            return vec![byte];
        }
        text.replace(WORD_START, " ").into_bytes()
    }

    fn first_piece(&self, token: Token) -> Vec<u8> {
        // The word-start mark of the first word is not a space in the text (the Metaspace
        // decoder drops it too).
        let mut piece = self.piece(token);
        if piece.first() == Some(&b' ') {
            piece.remove(0);
        }
        piece
    }

    fn is_end(&self, token: Token) -> bool {
        token == self.eos
    }

    fn apply_chat_template(
        &self,
        _messages: &[ChatMessage],
        _add_assistant: bool,
    ) -> pocket_core::Result<String> {
        Err(pocket_core::Error::Unsupported(format!(
            "{} has no chat template: it is an encoder-decoder model that takes plain text; \
             send the text as a completion prompt",
            self.model
        )))
    }
}
