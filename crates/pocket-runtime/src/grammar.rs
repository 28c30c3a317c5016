//! Structured output: JSON schemas and grammars compiled with llguidance into a
//! [`pocket_core::Constraint`] for the generation loop.
//!
//! A model's [`Grammars`] is built once, on its first constrained request: the trie of every
//! token's bytes (special tokens marked, so that a grammar never emits `<|im_end|>` as text)
//! and llguidance's precomputed token classes. Each request then compiles its own grammar into
//! a [`GrammarConstraint`] that follows the tokens it generates.

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use pocket_core::spec::Draft;
use pocket_core::{Constraint, Model, Token};
use serde_json::{Value, json};

use crate::closing::{Closing, Markup};
use crate::json_least::SchemaEnding;
use crate::{Error, Result, gbnf};

/// The largest grammar source accepted (a JSON schema's or a Lark grammar's text): schemas
/// apps send are a few kilobytes; one this large would take long to compile and is refused
/// before trying.
pub const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// Bytes a request's grammar state is charged in the memory budget: the parser's rows and
/// lexer states (bounded by [`limits`]) and the mask, as an allowance rather than a
/// measurement (llguidance does not report its heap).
pub const GRAMMAR_STATE_BYTES: u64 = 4 << 20;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against `schema`; `strict` refuses schemas using keywords that cannot be
    /// enforced instead of enforcing the rest.
    JsonSchema {
        /// The JSON schema.
        schema: Value,
        /// OpenAI's `strict`.
        strict: bool,
    },
    /// A grammar in llguidance's Lark dialect (it may inline JSON schemas with `%json`), or in
    /// llama.cpp's GBNF, recognised by its `name ::= …` rules and converted to Lark
    /// ([`crate::gbnf`]).
    Lark(String),
}

impl Grammar {
    /// The request field a grammar comes from, for errors.
    pub fn param(&self) -> &'static str {
        match self {
            Grammar::JsonObject | Grammar::JsonSchema { .. } => "response_format",
            Grammar::Lark(_) => "grammar",
        }
    }

    /// llguidance's form of this grammar. JSON is written the way people and models write it
    /// (`", "` and `": "`, no free whitespace, which a small model can otherwise fill
    /// forever); a schema's own `x-guidance` options win.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        let options = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let with_options = |mut schema: Value, lenient: bool| {
            if let Value::Object(map) = &mut schema {
                let mut o = options.clone();
                o["lenient"] = Value::Bool(lenient);
                map.entry("x-guidance").or_insert(o);
            }
            schema
        };
        Ok(match self {
            Grammar::JsonObject => TopLevelGrammar::from_lark(json_object_lark()),
            Grammar::JsonSchema { schema, strict } => {
                let size = serde_json::to_string(schema).map_or(0, |s| s.len());
                check_size(self.param(), size)?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(Error::invalid(
                        self.param(),
                        "json_schema.schema must be a JSON schema (an object)",
                    ));
                }
                TopLevelGrammar::from_json_schema(with_options(schema.clone(), !strict))
            }
            Grammar::Lark(text) => {
                check_size(self.param(), text.len())?;
                // GBNF (llama.cpp's) comes in the same field: converted, it is Lark too.
                let mut text = if gbnf::looks_like_gbnf(text) {
                    gbnf::to_lark(text)
                        .map_err(|e| Error::invalid(self.param(), format!("GBNF grammar: {e}")))?
                } else {
                    text.clone()
                };
                // llguidance's lexer wants a grammar's last line ended (a final string literal
                // without a newline is a lexer error); people rarely write one.
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                TopLevelGrammar::from_lark(text)
            }
        })
    }
}

/// How deep objects and arrays nest in a `json_object` answer (2: the object's values may be
/// objects or arrays of plain values), how many members or items each holds, and how many
/// characters a string may hold: any JSON object within these bounds is allowed. An open
/// `{"type": "object"}` lets a small model add keys, nest lists of objects, or write one
/// string, until `max_tokens` cuts the JSON off; bounded, it has to close them within a few
/// hundred tokens, so the answer parses. Apps that want more send a `json_schema`.
pub const JSON_OBJECT_BOUNDS: (usize, usize, usize) = (2, 6, 128);

/// The Lark grammar of a `json_object` answer (see [`JSON_OBJECT_BOUNDS`]).
fn json_object_lark() -> String {
    let (depth, members, string_chars) = JSON_OBJECT_BOUNDS;
    let more = members - 1;
    let mut g = String::from("start: object0\n");
    for d in 0..depth {
        g += &format!("object{d}: \"{{\" (member{d} (\", \" member{d}){{0,{more}}})? \"}}\"\n");
        g += &format!("member{d}: string \": \" value{d}\n");
        g += &format!("array{d}: \"[\" (value{d} (\", \" value{d}){{0,{more}}})? \"]\"\n");
        if d + 1 < depth {
            g += &format!("value{d}: scalar | object{n} | array{n}\n", n = d + 1);
        } else {
            g += &format!("value{d}: scalar\n");
        }
    }
    g += "scalar: string | NUMBER | \"true\" | \"false\" | \"null\"\n";
    // The string's body ends after so many characters; the closing quote is then forced. (A
    // bound in tokens, `[max_tokens=…]`, would do as well but llguidance cannot roll such a
    // lexeme back, which closing the JSON before `max_tokens` does.)
    g += "string: \"\\\"\" STRING_BODY \"\\\"\"\n";
    g += &format!(
        r#"STRING_BODY: /([^"\\\x00-\x1f]|\\(["\\\/bfnrt]|u[0-9a-fA-F]{{4}})){{0,{string_chars}}}/"#
    );
    g += "\nNUMBER: /-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,15})?([eE][+-]?[0-9]{1,3})?/\n";
    g
}

fn check_size(param: &'static str, size: usize) -> Result<()> {
    if size > MAX_GRAMMAR_BYTES {
        return Err(Error::invalid(
            param,
            format!(
                "the grammar is {size} bytes; pocketd compiles grammars of at most {MAX_GRAMMAR_BYTES} bytes"
            ),
        ));
    }
    Ok(())
}

/// The bounds a grammar compiles and runs within: llguidance's own, with the grammar size
/// and lexer states lowered to what a board's memory and a request's latency allow. A
/// grammar past them is refused when it is compiled (or, for the per-step ones, ends the
/// request with an error) rather than stalling the daemon.
pub fn limits() -> ParserLimits {
    ParserLimits {
        max_grammar_size: 100_000,
        max_lexer_states: 50_000,
        initial_lexer_fuel: 500_000,
        ..ParserLimits::default()
    }
}

/// A model's vocabulary as llguidance sees it, built once and shared by its requests.
pub struct Grammars {
    factory: ParserFactory,
    /// Every end token of the model: the grammar's end-of-sequence stands for all of them.
    ends: Vec<Token>,
    eos: Token,
    /// The tokens holding JSON's punctuation, which closing a JSON answer looks at.
    structural: Arc<[Token]>,
    /// Seconds building it took.
    pub build_seconds: f64,
}

impl Grammars {
    /// The trie of `model`'s tokens and llguidance's factory over it.
    pub fn new(model: Arc<dyn Model>) -> Result<Self> {
        let start = Instant::now();
        let n_vocab = model.info().n_vocab;
        let tokenizer = model.tokenizer();
        let ends: Vec<Token> = (0..n_vocab as Token).filter(|&t| tokenizer.is_end(t)).collect();
        let Some(&eos) = ends.first() else {
            return Err(Error::invalid(
                "response_format",
                format!("{} has no end token, so a grammar cannot end its output", model.info().name),
            ));
        };
        let words: Vec<Vec<u8>> = (0..n_vocab as Token)
            .map(|t| {
                // Only a token with no text of its own can be a special one.
                let piece = tokenizer.piece(t);
                match piece.is_empty().then(|| tokenizer.special_text(t)).flatten() {
                    Some(text) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], text.as_bytes()].concat(),
                    None => piece,
                }
            })
            .collect();
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let structural = Closing::structural_tokens(&trie);
        let env: TokEnv = Arc::new(ModelTokens { trie, model });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| grammar_error("response_format", e))?;
        factory.set_stderr_log_level(0);
        *factory.limits_mut() = limits();
        Ok(Grammars { factory, ends, eos, structural, build_seconds: start.elapsed().as_secs_f64() })
    }

    /// Compile `grammar` for one request. Errors name the request field and say what
    /// llguidance could not accept (an unsupported keyword under `strict`, a Lark syntax
    /// error, a grammar past the [`limits`]).
    pub fn compile(&self, grammar: &Grammar) -> Result<GrammarConstraint> {
        let parser = self
            .factory
            .create_parser(grammar.top_level()?)
            .map_err(|e| grammar_error(grammar.param(), e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar_error(grammar.param(), e));
        }
        Ok(GrammarConstraint {
            matcher,
            ends: self.ends.clone(),
            eos: self.eos,
            saved: Vec::new(),
            schema: match grammar {
                Grammar::JsonObject => Some(Arc::new(SchemaEnding::new(json!({"type": "object"})))),
                Grammar::JsonSchema { schema, .. } => Some(Arc::new(SchemaEnding::new(schema.clone()))),
                Grammar::Lark(_) => None,
            },
            structural: self.structural.clone(),
            closing: None,
        })
    }
}

fn grammar_error(param: &'static str, e: impl std::fmt::Display) -> Error {
    Error::invalid(param, format!("cannot compile the grammar: {e}"))
}

/// llguidance's view of a model's tokenizer: the trie, and the model's own tokenizer for the
/// forced text it turns back into tokens.
struct ModelTokens {
    trie: TokTrie,
    model: Arc<dyn Model>,
}

impl TokenizerEnv for ModelTokens {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        // Forced text is whole characters in practice; a split one only costs a draft.
        self.model.tokenizer().encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// One request's grammar state.
#[derive(Clone)]
pub struct GrammarConstraint {
    matcher: Matcher,
    ends: Vec<Token>,
    eos: Token,
    /// The end tokens' logits while a mask is applied.
    saved: Vec<(Token, f32)>,
    /// For a JSON answer, what its endings are (the schema; any value for `json_object`).
    schema: Option<Arc<SchemaEnding>>,
    structural: Arc<[Token]>,
    /// For a JSON answer: closing it before `max_tokens` cuts it.
    closing: Option<Closing>,
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint").field("ends", &self.ends).finish_non_exhaustive()
    }
}

impl GrammarConstraint {
    fn error(&self, what: &str, e: impl std::fmt::Display) -> pocket_core::Error {
        pocket_core::Error::invalid_field("response_format", format!("the output grammar failed {what}: {e}"))
    }

    /// Make the answer — a JSON value — whole within `room` tokens: near the end, a token
    /// after which the least ending the schema accepts (an open string ended, required
    /// members written with their least values, brackets closed) would no longer fit is not
    /// allowed, and when only that ending fits it is forced — so an answer cut by
    /// `max_tokens` is still valid JSON ([`crate::closing`]). Only a room smaller than the
    /// schema's least document cannot be met. Grammars other than JSON's are not closed.
    pub fn close_within(&mut self, room: usize) {
        if let (Some(schema), Ok(env)) = (self.schema.clone(), self.matcher.tok_env()) {
            self.closing = Some(Closing::new(env, schema, Markup::JSON, self.structural.clone(), room));
        }
    }

    /// [`GrammarConstraint::close_within`] for an answer of tool calls ([`crate::tools`]):
    /// each call's JSON (`body`, its schema) between the tags of `markup`
    /// ([`crate::tools::call_markup`]) closes before `max_tokens` cuts it; an answer that may
    /// be text is closed only once it starts a call.
    pub(crate) fn close_calls_within(&mut self, room: usize, body: Value, markup: Markup) {
        if let Ok(env) = self.matcher.tok_env() {
            let schema = Arc::new(SchemaEnding::new(body));
            self.closing = Some(Closing::new(env, schema, markup, self.structural.clone(), room));
        }
    }

    /// The shortest answer the JSON grammar accepts, and the tokens it takes: an answer given
    /// fewer tokens than that cannot be valid JSON. `None` for a grammar that is not JSON, or
    /// a schema whose least answer cannot be told from the schema alone.
    pub fn least_answer(&self) -> Option<(String, usize)> {
        let text = self.schema.as_ref()?.ending("")?;
        let tokens = self.matcher.tok_env().ok()?.tok_trie().greedy_tokenize(text.as_bytes()).len();
        Some((text, tokens))
    }

    /// Whether the answer was closed early: it was cut, though it ended as valid JSON.
    pub fn closed(&self) -> bool {
        self.closing.as_ref().is_some_and(|c| c.forced)
    }

    /// The token closing forces next, if any (`None` too when the grammar would not allow it,
    /// which it should: closing then gives up).
    fn closing_token(&mut self, mask: &SimpleVob) -> Option<Token> {
        let t = self.closing.as_mut()?.forced_token(&mut self.matcher)?;
        if mask.is_allowed(t) {
            return Some(t);
        }
        tracing::debug!(token = t, "the grammar does not allow the ending's next token: closing gives up");
        self.closing = None;
        None
    }
}

/// The allowed token with the highest logit.
fn likeliest(mask: &SimpleVob, logits: &[f32]) -> Option<Token> {
    let mut best: Option<(f32, Token)> = None;
    mask.iter_set_entries(|t| {
        if let Some(&l) = logits.get(t)
            && best.is_none_or(|(b, _)| l > b)
        {
            best = Some((l, t as Token));
        }
    });
    best.map(|(_, t)| t)
}

/// `logits` with only `t` left (its own logit kept where the mask had left it one).
fn force(logits: &mut [f32], t: Token) {
    if let Some(&kept) = logits.get(t as usize) {
        logits.fill(f32::NEG_INFINITY);
        logits[t as usize] = if kept.is_finite() { kept } else { 0.0 };
    }
}

impl Constraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> pocket_core::Result<()> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| self.error("computing a mask", e))?;
        if let Some(t) = self.closing_token(&mask) {
            // Forcing what the model would have written anyway changes nothing.
            if likeliest(&mask, logits) != Some(t)
                && let Some(c) = self.closing.as_mut()
            {
                c.forced = true;
            }
            force(logits, t);
            return Ok(());
        }
        // The grammar's one end token stands for all of the model's (`<|im_end|>` and
        // `<|endoftext|>` alike): they keep their own logits when it may end here.
        let end_allowed = mask.is_allowed(self.eos);
        self.saved.clear();
        if end_allowed {
            self.saved.extend(self.ends.iter().filter_map(|&t| Some((t, *logits.get(t as usize)?))));
        }
        for (word, chunk) in mask.as_slice().iter().zip(logits.chunks_mut(32)) {
            if *word == u32::MAX {
                continue;
            }
            for (bit, l) in chunk.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // Rows past the trie's vocabulary (padding some models have) are never allowed.
        for l in logits.iter_mut().skip(mask.len()) {
            *l = f32::NEG_INFINITY;
        }
        for &(t, l) in &self.saved {
            logits[t as usize] = l;
        }
        if let Some(c) = self.closing.as_mut()
            && c.prune(&mut self.matcher, &mask, logits)
            && let Some(t) = self.closing_token(&mask)
        {
            force(logits, t);
        }
        Ok(())
    }

    fn advance(&mut self, token: Token) -> pocket_core::Result<()> {
        self.matcher.consume_token(token).map_err(|e| self.error("on a token", e))?;
        if let Some(c) = self.closing.as_mut() {
            c.advance(token);
        }
        Ok(())
    }

    fn passed(&mut self, _token: Token) {
        if let Some(c) = self.closing.as_mut() {
            c.passed();
        }
    }

    fn allowed_prefix(&mut self, tokens: &[Token]) -> pocket_core::Result<usize> {
        self.matcher.validate_tokens(tokens).map_err(|e| self.error("checking a draft", e))
    }

    fn forced(&mut self, max: usize, out: &mut Draft) -> pocket_core::Result<()> {
        for t in self.matcher.compute_ff_tokens().into_iter().take(max) {
            // A full draft keeps what it holds: the rest is forced again next step.
            if out.push(t).is_err() {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use pocket_core::testing::FakeModel;

    use super::*;
    use crate::ErrorKind;

    /// The grammars of the fake model, whose tokens are `a` to `h`.
    fn grammars() -> Grammars {
        Grammars::new(Arc::new(FakeModel::default())).unwrap()
    }

    /// Whether `grammar` accepts `text` (of `a` to `g`) whole.
    fn accepts(grammar: &mut GrammarConstraint, text: &str) -> bool {
        let tokens: Vec<Token> = text.bytes().map(|b| Token::from(b - b'a')).collect();
        let consumed = grammar.matcher.try_consume_tokens(&tokens).unwrap();
        let whole = consumed == tokens.len() && grammar.matcher.is_accepting().unwrap();
        grammar.matcher.rollback(consumed).unwrap();
        whole
    }

    #[test]
    fn a_gbnf_grammar_in_the_grammar_field_is_converted_and_enforced() {
        let grammars = grammars();
        let gbnf = "# llama.cpp's format\nroot ::= (\"ab\" | [c-d])+ tail\ntail ::= \"e\"\n";
        let mut g = grammars.compile(&Grammar::Lark(gbnf.into())).unwrap();
        for text in ["abe", "cde", "abcabde"] {
            assert!(accepts(&mut g, text), "{text}");
        }
        for text in ["e", "ace", "abef", "ab"] {
            assert!(!accepts(&mut g, text), "{text}");
        }
        // Lark is still Lark.
        let mut g = grammars.compile(&Grammar::Lark("start: \"ab\" | \"c\"".into())).unwrap();
        assert!(accepts(&mut g, "ab") && accepts(&mut g, "c") && !accepts(&mut g, "abc"));
    }

    #[test]
    fn a_gbnf_grammar_that_cannot_convert_is_an_invalid_grammar_naming_the_field() {
        let grammars = grammars();
        let refuse = |text: &str| grammars.compile(&Grammar::Lark(text.into())).unwrap_err();
        let e = refuse("root ::= \"a\" <think>");
        assert_eq!((e.kind(), e.param()), (ErrorKind::Invalid, Some("grammar")), "{e}");
        assert!(e.to_string().starts_with("GBNF grammar: line 1, column 14: token references"), "{e}");
        let e = refuse("answer ::= \"a\"");
        assert!(e.to_string().starts_with("GBNF grammar: no `root` rule"), "{e}");
        // Lark's own errors are llguidance's, as before.
        let e = refuse("start: (");
        assert!(e.to_string().starts_with("cannot compile the grammar"), "{e}");
    }
}
