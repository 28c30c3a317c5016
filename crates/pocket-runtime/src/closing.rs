//! Closing a JSON answer before `max_tokens` cuts it: each step, the tokens that would leave
//! too little room to end are taken away, and when what is left is what ending takes, the
//! ending is forced — so that an answer cut by `max_tokens` is still a valid value.
//!
//! The ending is the least one the schema accepts ([`SchemaEnding`]), checked against the
//! grammar before it is forced; where the schema alone cannot tell (a string's `pattern`),
//! the grammar itself is walked for one.

use std::collections::HashMap;
use std::sync::Arc;

use llguidance::Matcher;
use llguidance::toktrie::{SimpleVob, TokEnv, TokTrie};
use pocket_core::Token;

use crate::json_close::{Open, Scan};
use crate::json_least::SchemaEnding;

/// Tokens of room kept beyond the least ending: an ending estimated for a token not yet
/// written can grow by a token once it is (a key finished as a longer one than first
/// thought).
const MARGIN: usize = 1;

/// Closing looks at endings only this close to the end: before, a step pays nothing for it.
/// (One token — a comma before an item of a large object — can lengthen the ending by more
/// than this only in schemas whose least document is that large.)
pub(crate) const HORIZON: usize = 48;

/// Inside a string, the most allowed tokens each looked at; past this, only those with
/// JSON's punctuation.
const MAX_CANDIDATES: usize = 256;

/// The longest ending a walk of the grammar looks for.
const MAX_WALK: usize = 24;

/// What surrounds the JSON value closing follows: nothing for a JSON answer, a tool call's
/// tags for an answer that calls tools.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Markup {
    /// What opens a value.
    pub(crate) open: &'static str,
    /// What closes it.
    pub(crate) close: &'static str,
    /// What opens another value after one closed, when more may follow.
    pub(crate) again: Option<&'static str>,
    /// Whether the answer may be text instead (its first character tells: `open`'s first, or
    /// a bare `{`, start a value).
    pub(crate) text: bool,
    /// The member of the value that is the model's choice to make, not closing's (a tool
    /// call's `name`: a call cut open is better than a call of a function the model did not
    /// choose): closing waits until it is written.
    pub(crate) chosen: Option<&'static str>,
}

impl Markup {
    /// A JSON value alone.
    pub(crate) const JSON: Markup = Markup { open: "", close: "", again: None, text: false, chosen: None };

    /// Where an answer starts.
    fn start(self) -> Place {
        match (self.text, self.open.is_empty()) {
            (true, _) => Place::Start,
            (false, true) => Place::Value(Scan::default(), self.close),
            (false, false) => Place::Before { expect: self.open, at: 0 },
        }
    }
}

/// Where the answer is in its markup.
#[derive(Debug, Clone)]
enum Place {
    /// Nothing written yet of an answer that may be text.
    Start,
    /// `at` bytes of `expect` (the markup opening a value) written.
    Before { expect: &'static str, at: usize },
    /// In a value, which `close` will close.
    Value(Scan, &'static str),
    /// `at` bytes of `close` written after the value.
    After { close: &'static str, at: usize },
    /// The answer's last value closed.
    Done,
    /// The answer is text, or not what closing can read.
    Lost,
}

impl Place {
    fn push_all(&mut self, bytes: &[u8], markup: Markup) {
        for &b in bytes {
            *self = std::mem::replace(self, Place::Lost).push(b, markup);
        }
    }

    fn push(self, b: u8, markup: Markup) -> Place {
        match self {
            Place::Start if markup.open.as_bytes().first() == Some(&b) => {
                Place::Before { expect: markup.open, at: 0 }.push(b, markup)
            }
            Place::Start if b == b'{' => Place::Value(Scan::default(), "").push(b, markup),
            Place::Before { expect, at } if expect.as_bytes().get(at) == Some(&b) => {
                if at + 1 == expect.len() {
                    Place::Value(Scan::default(), markup.close)
                } else {
                    Place::Before { expect, at: at + 1 }
                }
            }
            Place::Value(scan, close) if scan.done && scan.word.is_empty() && !close.is_empty() => {
                Place::After { close, at: 0 }.push(b, markup)
            }
            Place::Value(mut scan, close) => match scan.push_all(&[b]) {
                Some(()) => Place::Value(scan, close),
                None => Place::Lost,
            },
            Place::After { close, at } if close.as_bytes().get(at) == Some(&b) => {
                match (at + 1 == close.len(), markup.again) {
                    (false, _) => Place::After { close, at: at + 1 },
                    (true, Some(again)) => Place::Before { expect: again, at: 0 },
                    (true, None) => Place::Done,
                }
            }
            _ => Place::Lost,
        }
    }

    /// The least text that ends the answer from here; `None` when it cannot be told.
    fn ending(&self, schema: &SchemaEnding, markup: Markup) -> Option<String> {
        match self {
            Place::Start | Place::Lost => None,
            Place::Before { expect, at: 0 } if Some(*expect) == markup.again => Some(String::new()),
            Place::Before { expect, at } => {
                Some(format!("{}{}{}", &expect[*at..], schema.ending_of(&Scan::default())?, markup.close))
            }
            Place::Value(scan, close) => Some(schema.ending_of(scan)? + close),
            Place::After { close, at } => Some(close[*at..].to_owned()),
            Place::Done => Some(String::new()),
        }
    }

    /// Whether the value's member `key` was written (a value or markup past it counts).
    fn has(&self, key: &str) -> bool {
        match self {
            Place::Value(scan, _) => match scan.open.first() {
                Some(Open::Object(o)) => o.has(key.as_bytes()),
                _ => scan.done,
            },
            Place::After { .. } | Place::Done => true,
            Place::Start | Place::Before { .. } | Place::Lost => false,
        }
    }

    /// Whether the answer is inside a string of its JSON value.
    fn in_string(&self) -> bool {
        matches!(self, Place::Value(scan, _) if scan.in_string())
    }
}

/// A JSON answer that must be whole within so many tokens.
#[derive(Clone)]
pub(crate) struct Closing {
    env: TokEnv,
    schema: Arc<SchemaEnding>,
    /// The tokens whose text holds JSON's punctuation (`"`, `,`, `:`, brackets): inside a
    /// string, only these can change what ending takes.
    structural: Arc<[Token]>,
    /// Tokens that may still be generated.
    room: usize,
    markup: Markup,
    /// Where the answer so far is.
    place: Place,
    /// The ending's tokens still to force, the next one last.
    ending: Vec<Token>,
    /// Whether closing changed the answer: the model's likeliest token taken away, or another
    /// forced (the answer is then one cut by `max_tokens`, though it ends whole).
    pub(crate) forced: bool,
    /// Tokens each ending text takes.
    sizes: HashMap<String, usize>,
}

impl Closing {
    pub(crate) fn new(
        env: TokEnv,
        schema: Arc<SchemaEnding>,
        markup: Markup,
        structural: Arc<[Token]>,
        room: usize,
    ) -> Closing {
        Closing {
            env,
            schema,
            structural,
            room,
            markup,
            place: markup.start(),
            ending: Vec::new(),
            forced: false,
            sizes: HashMap::new(),
        }
    }

    /// The tokens of a model's vocabulary that [`Closing::structural`] holds.
    pub(crate) fn structural_tokens(trie: &TokTrie) -> Arc<[Token]> {
        (0..trie.vocab_size() as Token)
            .filter(|&t| {
                trie.token(t).iter().any(|b| matches!(b, b'"' | b',' | b':' | b'{' | b'}' | b'[' | b']'))
            })
            .collect()
    }

    /// `token` was generated.
    pub(crate) fn advance(&mut self, token: Token) {
        self.room = self.room.saturating_sub(1);
        self.place.push_all(self.env.tok_trie().token(token), self.markup);
        if self.ending.last() == Some(&token) {
            self.ending.pop();
        } else {
            self.ending.clear();
        }
    }

    /// Whether closing may act here: near the end, and past what the model must choose
    /// (between values, whether another one starts is closing's to say).
    fn acts(&self) -> bool {
        let chosen = match (&self.place, self.markup.chosen) {
            (_, None) => true,
            (Place::Before { expect, at: 0 }, _) if Some(*expect) == self.markup.again => true,
            (place, Some(key)) => place.has(key),
        };
        self.room <= HORIZON && chosen
    }

    /// A token was generated outside the answer (thinking): one less of room.
    pub(crate) fn passed(&mut self) {
        self.room = self.room.saturating_sub(1);
    }

    /// The token closing forces next, if it has started or must start now.
    pub(crate) fn forced_token(&mut self, matcher: &mut Matcher) -> Option<Token> {
        if self.ending.is_empty()
            && self.acts()
            && let Some(mut ending) = self.ending(matcher)
            && !ending.is_empty()
            && ending.len() <= self.room
            && ending.len() + MARGIN >= self.room
        {
            tracing::debug!(room = self.room, ?ending, place = ?self.place, "closing the answer");
            ending.reverse();
            self.ending = ending;
        }
        self.ending.last().copied()
    }

    /// Take away the tokens `mask` allows after which the least ending would no longer fit
    /// in the room left (as `-inf` in `logits`). When none would be left, the ending is forced
    /// instead (true: the caller asks [`Closing::forced_token`] again).
    pub(crate) fn prune(&mut self, matcher: &mut Matcher, mask: &SimpleVob, logits: &mut [f32]) -> bool {
        if !self.acts() || matches!(self.place, Place::Lost) {
            return false;
        }
        let env = self.env.clone();
        let trie = env.tok_trie();
        // Inside a string, only a token that ends it can lengthen the ending much: a value's
        // characters change nothing, and where any key may come (most of the vocabulary
        // allowed) neither do a key's; a declared key's few prefixes are each looked at.
        let candidates: Vec<Token> = if self.place.in_string() && mask.num_set() > MAX_CANDIDATES {
            self.structural.iter().copied().filter(|&t| mask.is_allowed(t)).collect()
        } else {
            let mut all = Vec::new();
            mask.iter_set_entries(|t| all.push(t as Token));
            all
        };
        let fits = self.room.saturating_sub(1 + MARGIN);
        // Between calls, not beginning another for want of room leaves the answer whole: it
        // was not cut.
        let between =
            matches!(self.place, Place::Before { expect, at: 0 } if Some(expect) == self.markup.again);
        let mut pruned = Vec::new();
        for t in candidates {
            let bytes = trie.token(t);
            if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) || t as usize >= logits.len() {
                continue;
            }
            let mut after = self.place.clone();
            after.push_all(bytes, self.markup);
            let Some(ending) = after.ending(&self.schema, self.markup) else { continue };
            if self.size(&ending) > fits {
                pruned.push((t, std::mem::replace(&mut logits[t as usize], f32::NEG_INFINITY)));
            }
        }
        let best_left = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !between && pruned.iter().any(|&(_, l)| l >= best_left) {
            self.forced = true;
        }
        if pruned.is_empty() || best_left > f32::NEG_INFINITY {
            return false;
        }
        if let Some(mut ending) = self.ending(matcher).filter(|e| !e.is_empty()) {
            ending.reverse();
            self.ending = ending;
            self.forced = true;
            return true;
        }
        // No ending fits whatever comes next: the grammar's choice stands, and the answer may
        // be cut open.
        for (t, l) in pruned {
            logits[t as usize] = l;
        }
        false
    }

    /// Tokens `ending` takes, as forced.
    fn size(&mut self, ending: &str) -> usize {
        if let Some(&n) = self.sizes.get(ending) {
            return n;
        }
        let n = self.env.tok_trie().greedy_tokenize(ending.as_bytes()).len();
        self.sizes.insert(ending.to_owned(), n);
        n
    }

    /// The least ending of the answer so far that the grammar accepts, as tokens: the
    /// schema's, else one walked from the grammar.
    fn ending(&mut self, matcher: &mut Matcher) -> Option<Vec<Token>> {
        let text = self.place.ending(&self.schema, self.markup);
        if let Some(text) = text {
            let tokens = self.env.tok_trie().greedy_tokenize(text.as_bytes());
            let consumed = matcher.try_consume_tokens(&tokens).ok()?;
            let whole = consumed == tokens.len() && (matcher.is_stopped() || matcher.is_accepting().ok()?);
            matcher.rollback(consumed).ok()?;
            if whole {
                return Some(tokens);
            }
        }
        // A walk costs a mask per token, so it looks no further than the room.
        self.walk(matcher, self.room.min(MAX_WALK))
    }

    /// An ending found by walking the grammar itself: at each step the forced tokens, else
    /// the allowed token that closes most (in a string, one starting with its closing `"`;
    /// outside, `]` and `}`), else the shortest allowed one — at most `max` tokens, the
    /// matcher as it was afterwards.
    fn walk(&self, matcher: &mut Matcher, max: usize) -> Option<Vec<Token>> {
        let env = self.env.clone();
        let trie = env.tok_trie();
        let mut place = self.place.clone();
        let mut tokens: Vec<Token> = Vec::new();
        let mut whole = false;
        while tokens.len() < max {
            if matcher.is_stopped() || matcher.is_accepting().unwrap_or(false) {
                whole = true;
                break;
            }
            let forced = matcher.compute_ff_tokens();
            let step = if forced.is_empty() {
                let Ok(mask) = matcher.compute_mask() else { break };
                match closest(trie, &mask, place.in_string()) {
                    Some(t) => vec![t],
                    None => break,
                }
            } else {
                forced
            };
            let step = &step[..step.len().min(max - tokens.len())];
            let Ok(consumed) = matcher.try_consume_tokens(step) else { break };
            tokens.extend_from_slice(&step[..consumed]);
            for &t in &step[..consumed] {
                place.push_all(trie.token(t), self.markup);
            }
            if consumed < step.len() {
                break;
            }
        }
        matcher.rollback(tokens.len()).ok()?;
        whole.then_some(tokens)
    }
}

/// The allowed token a walk takes: the longest that only closes (in a string, its `"` and
/// then closers), else the shortest.
fn closest(trie: &TokTrie, mask: &SimpleVob, in_string: bool) -> Option<Token> {
    let mut pick: Option<(bool, usize, Token)> = None;
    mask.iter_set_entries(|t| {
        let bytes = trie.token(t as Token);
        if bytes.is_empty() || bytes[0] == TokTrie::SPECIAL_TOKEN_MARKER {
            return;
        }
        let closers = |b: &[u8]| b.iter().all(|b| matches!(b, b']' | b'}'));
        let closes = match bytes.split_first() {
            Some((b'"', rest)) if in_string => closers(rest),
            _ => !in_string && closers(bytes),
        };
        let better = match pick {
            None => true,
            Some((c, _, _)) if closes != c => closes,
            Some((c, len, _)) => {
                if c {
                    bytes.len() > len
                } else {
                    bytes.len() < len
                }
            }
        };
        if better {
            pick = Some((closes, bytes.len(), t as Token));
        }
    });
    pick.map(|(.., t)| t)
}
