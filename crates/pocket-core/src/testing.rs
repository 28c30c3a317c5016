//! A deterministic fake model, for unit tests of what runs above the engines (the generation
//! loop, the drafters, the request pipeline, the daemon's adapters) without a model file.
//! Built for pocket-core's own tests and, with the `testing` feature, for other crates'.
//!
//! The model has [`V`] tokens, `a` to `h`; token 7 (`h`) ends the text. After token `t` its
//! most likely next token is `(t + 1) % V`, so greedy decoding from `a` says `bcdefg` and
//! stops; every speculation mode must give exactly that.

use crate::memory::Ledger;
use crate::spec::SpecMode;
use crate::{
    ChatMessage, Footprint, LayerPlan, Logits, Model, ModelInfo, ModelKind, Result, Rows, Session,
    SessionConfig, Token, Tokenizer,
};

/// Vocabulary size of [`FakeSession`].
pub const V: usize = 8;

/// One `decode` call: the position it started at, its tokens, the rows asked for, and
/// whether the plan was the full model.
pub type Call = (usize, Vec<Token>, Rows, bool);

/// A model whose argmax after token t is (t + 1) % V, with `bias` added to some logits;
/// records every decode.
pub struct FakeSession {
    /// The session's configuration.
    pub config: SessionConfig,
    /// The tokens it holds.
    pub tokens: Vec<Token>,
    logits: Vec<f32>,
    /// Added to every row's logits.
    pub bias: Vec<(Token, f32)>,
    /// Every decode, in order.
    pub calls: Vec<Call>,
    /// Whether it decodes trees of drafts ([`Session::decodes_trees`]).
    pub trees: bool,
    /// The trees it decoded: each one's tokens and parents.
    pub tree_calls: Vec<(Vec<Token>, Vec<u8>)>,
}

impl FakeSession {
    /// An empty session with a context of `n_ctx` tokens.
    pub fn new(n_ctx: usize) -> Self {
        Self::with_config(SessionConfig { n_ctx, ..SessionConfig::default() })
    }

    /// An empty session with a context of `n_ctx` tokens that decodes trees of drafts.
    pub fn with_trees(n_ctx: usize) -> Self {
        FakeSession { trees: true, ..Self::new(n_ctx) }
    }

    /// An empty session configured as `config` says.
    pub fn with_config(config: SessionConfig) -> Self {
        FakeSession {
            config,
            tokens: Vec::new(),
            logits: vec![0.0; V],
            bias: Vec::new(),
            calls: Vec::new(),
            trees: false,
            tree_calls: Vec::new(),
        }
    }

    /// Each row's logits: the argmax after token t is (t + 1) % V, then the bias.
    fn fill_rows(&mut self, tokens: &[Token]) {
        self.logits.clear();
        self.logits.resize(tokens.len() * V, 0.0);
        for (row, &t) in self.logits.chunks_mut(V).zip(tokens) {
            row[(t as usize + 1) % V] = 1.0;
            for &(t, b) in &self.bias {
                row[t as usize] += b;
            }
        }
    }
}

impl Session for FakeSession {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> Result<Logits<'_>> {
        assert!(self.tokens.len() + tokens.len() <= self.config.n_ctx, "context overrun");
        self.calls.push((self.tokens.len(), tokens.to_vec(), rows, plan.is_full()));
        self.tokens.extend_from_slice(tokens);
        let n = rows.count(tokens.len())?;
        self.fill_rows(&tokens[tokens.len() - n..]);
        Ok(Logits::new(&self.logits, V))
    }

    fn decodes_trees(&self) -> bool {
        self.trees
    }

    fn decode_tree(&mut self, tokens: &[Token], parents: &[u8], _plan: &LayerPlan) -> Result<Logits<'_>> {
        assert!(self.trees, "a tree decoded where the session said it decodes none");
        crate::check_tree(tokens, parents, V, self.tokens.len(), self.config.n_ctx)?;
        self.tree_calls.push((tokens.to_vec(), parents.to_vec()));
        self.tokens.extend_from_slice(tokens);
        self.fill_rows(tokens);
        Ok(Logits::new(&self.logits, V))
    }

    fn keep_path(&mut self, base: usize, path: &[u8]) -> Result<()> {
        let tree = self.tokens.split_off(base);
        let parents = &self.tree_calls.last().expect("a tree decoded before").1;
        crate::check_path(path, parents)?;
        self.tokens.extend(path.iter().map(|&i| tree[i as usize]));
        Ok(())
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.tokens.truncate(len);
        Ok(())
    }

    fn memory(&self) -> u64 {
        0
    }

    fn kv_bytes(&self) -> u64 {
        0
    }
}

/// Token t is the letter `a` + t; token 7 (`h`) is the end token. Text of other characters
/// does not encode; a chat renders as its messages' contents, one after another.
#[derive(Debug, Clone)]
pub struct FakeTokenizer {
    /// Each token's bytes (a test may make some of them parts of one character).
    pub pieces: Vec<Vec<u8>>,
}

impl Default for FakeTokenizer {
    fn default() -> Self {
        FakeTokenizer { pieces: (0..V as u8).map(|t| vec![b'a' + t]).collect() }
    }
}

impl Tokenizer for FakeTokenizer {
    fn encode(&self, text: &str, _add_special: bool) -> Result<Vec<Token>> {
        text.bytes()
            .map(|b| match b {
                b'a'..=b'h' => Ok(Token::from(b - b'a')),
                _ => Err(crate::Error::Tokenizer(format!("the fake model has no token for {:?}", b as char))),
            })
            .collect()
    }

    fn piece(&self, token: Token) -> Vec<u8> {
        self.pieces.get(token as usize).cloned().unwrap_or_default()
    }

    fn is_end(&self, token: Token) -> bool {
        token == 7
    }

    fn apply_chat_template(&self, messages: &[ChatMessage], _add_assistant: bool) -> Result<String> {
        Ok(messages.iter().map(|m| m.content.as_str()).collect())
    }
}

/// The fake decoder: [`FakeSession`]s and a [`FakeTokenizer`], with a small footprint so that
/// memory planning has numbers to work with.
#[derive(Debug, Clone)]
pub struct FakeModel {
    info: ModelInfo,
    tokenizer: FakeTokenizer,
}

impl Default for FakeModel {
    fn default() -> Self {
        FakeModel {
            info: ModelInfo {
                name: "fake".into(),
                architecture: "fake".into(),
                kind: ModelKind::Decoder,
                n_layers: 4,
                n_embd: 16,
                n_vocab: V,
                n_ctx_train: 64,
                weights_bytes: 0,
                exact_passes: None,
                placement: Vec::new(),
            },
            tokenizer: FakeTokenizer::default(),
        }
    }
}

impl Model for FakeModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn drafters(&self) -> &'static [SpecMode] {
        &[SpecMode::Off, SpecMode::Auto, SpecMode::Suffix]
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.tokenizer
    }

    fn footprint(&self, _config: &SessionConfig) -> Result<Footprint> {
        Ok(Footprint {
            weights_anon_bytes: 0,
            weights_mapped_bytes: 0,
            kv_bytes_per_token: 64,
            kv_block_tokens: 16,
            compute_bytes: 1024,
            logits_row_bytes: (V * 4) as u64,
        })
    }

    fn session_in(&self, config: &SessionConfig, _ledger: &Ledger) -> Result<Box<dyn Session>> {
        Ok(Box::new(FakeSession::with_config(config.clone())))
    }
}
