//! Models that think before they answer (Qwen3, SmolLM3, DeepSeek-R1's distillations) write
//! their thinking between `<think>` and `</think>`, then the answer. This module tells the
//! two apart — in a whole text ([`split`]), in a stream of pieces ([`Splitter`]) — and keeps an
//! answer's grammar away from the thinking ([`ThinkingGate`]): a JSON schema or a tool call
//! constrains what follows `</think>`, not the thoughts before it.
//!
//! A model thinks when its chat template speaks of `<think>` or `</think>`. Whether its answer starts
//! inside the thinking depends on the prompt: templates that open the block themselves
//! (`…<|im_start|>assistant\n<think>\n`) leave the model inside it; Qwen3's opens nothing
//! (the model writes `<think>` itself) and, with `enable_thinking: false`, writes an empty
//! block (`<think>\n\n</think>\n\n`) so that the model answers at once.

use pocket_core::spec::Draft;
use pocket_core::{Constraint, Result, Token};

/// Where thinking opens.
pub const OPEN: &str = "<think>";
/// Where it ends.
pub const CLOSE: &str = "</think>";

/// Whether a chat template's model thinks (the template speaks of `<think>` or `</think>`).
pub fn template_thinks(template: &str) -> bool {
    template.contains(OPEN) || template.contains(CLOSE)
}

/// How a rendered prompt leaves a thinking model: `None` when it ends with a closed block
/// (thinking turned off: Qwen3's `enable_thinking = false` writes `<think>\n\n</think>\n\n`),
/// `Some(true)` inside a block it opened, `Some(false)` free to open one.
pub fn thinking_after(prompt: &str) -> Option<bool> {
    if prompt.trim_end().ends_with(CLOSE) {
        return None;
    }
    Some(prompt_opens_thinking(prompt))
}

/// Whether a rendered prompt leaves the model inside a thinking block (its last `<think>`
/// is not closed).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

/// A text's thinking and its answer: the thinking (trimmed of the newlines around it) when
/// there is any — the text starts with `<think>`, or `inside` it — and the answer after
/// `</think>` (without the newlines that follow it). Thinking that never ends is all thinking.
pub fn split(text: &str, inside: bool) -> (Option<String>, String) {
    let mut splitter = Splitter::new(inside);
    let mut parts = splitter.push(text);
    parts.extend(splitter.finish());
    let (mut thinking, mut answer, mut thought) = (String::new(), String::new(), false);
    for part in parts {
        match part {
            Part::Thinking(t) => {
                thought = true;
                thinking.push_str(&t);
            }
            Part::Answer(a) => answer.push_str(&a),
        }
    }
    let thought = thought || splitter.thought;
    (thought.then(|| thinking.trim_matches('\n').to_owned()), answer)
}

/// A piece of a thinking model's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Thinking.
    Thinking(String),
    /// The answer.
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing yet: `<think>` may come (after newlines or spaces).
    Start,
    Thinking,
    /// Just after `</think>`: the newlines before the answer are dropped.
    Closed,
    Answer,
}

/// Splits a stream of text into thinking and answer as it comes, holding back what may be
/// the start of a tag until it is known.
#[derive(Debug, Clone)]
pub struct Splitter {
    state: State,
    held: String,
    thought: bool,
}

impl Splitter {
    /// A splitter for an output that starts inside a thinking block when `inside`.
    pub fn new(inside: bool) -> Splitter {
        Splitter {
            state: if inside { State::Thinking } else { State::Start },
            held: String::new(),
            thought: inside,
        }
    }

    /// Whether the output is still thinking (or may start to).
    pub fn thinking(&self) -> bool {
        matches!(self.state, State::Start | State::Thinking)
    }

    /// The parts `text` makes known.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let rest = self.held.trim_start_matches(['\n', ' ', '\r', '\t']);
                    if let Some(thinking) = rest.strip_prefix(OPEN) {
                        self.held = thinking.to_owned();
                        self.state = State::Thinking;
                        self.thought = true;
                    } else if OPEN.starts_with(rest) {
                        return out; // may still become `<think>`
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(end) => {
                        push(&mut out, Part::Thinking(self.held[..end].to_owned()));
                        self.held.drain(..end + CLOSE.len());
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        let ready = self.held.len() - keep;
                        push(&mut out, Part::Thinking(self.held[..ready].to_owned()));
                        self.held.drain(..ready);
                        return out;
                    }
                },
                State::Closed => {
                    let rest = self.held.trim_start_matches(['\n', '\r']);
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_owned();
                    self.state = State::Answer;
                }
                State::Answer => {
                    push(&mut out, Part::Answer(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// What is still held at the end of the output.
    pub fn finish(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Thinking => push(&mut out, Part::Thinking(held)),
            State::Start | State::Answer => push(&mut out, Part::Answer(held)),
            State::Closed => {}
        }
        out
    }
}

fn push(out: &mut Vec<Part>, part: Part) {
    if !matches!(&part, Part::Thinking(t) | Part::Answer(t) if t.is_empty()) {
        out.push(part);
    }
}

/// The length of the longest end of `text` that `tag` starts with.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// A constraint that applies to the answer only: while the model thinks it allows
/// everything (the end of the text too), and from the tokens of `</think>` on it is the inner
/// constraint, from its start state. An output that may start thinking (the prompt left the
/// choice to the model) allows `<think>` beside what the inner constraint allows at first.
pub struct ThinkingGate<'c> {
    inner: &'c mut dyn Constraint,
    open: Option<Token>,
    close: Vec<Token>,
    phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// The first token: `<think>`, or the answer's first.
    Start,
    /// Thinking, with its last tokens (to spot `</think>`).
    Thinking(Vec<Token>),
    Answering,
}

impl<'c> ThinkingGate<'c> {
    /// `inner` behind thinking that ends with the tokens `close` (`</think>`'s); the output
    /// starts `inside` the thinking, or may open it with the token `open` (when `<think>` is
    /// one token; otherwise the answer starts at once).
    pub fn new(inner: &'c mut dyn Constraint, open: Option<Token>, close: Vec<Token>, inside: bool) -> Self {
        let phase = match (inside, open) {
            (true, _) => Phase::Thinking(Vec::new()),
            (false, Some(_)) => Phase::Start,
            (false, None) => Phase::Answering,
        };
        ThinkingGate { inner, open, close, phase }
    }

    /// Whether the thinking is over (or never began).
    pub fn answering(&self) -> bool {
        self.phase == Phase::Answering
    }

    /// Whether `tokens` end with `</think>`.
    fn ends(&self, tokens: &[Token]) -> bool {
        !self.close.is_empty() && tokens.ends_with(&self.close)
    }

    /// How many of `tokens` are allowed from thinking that has seen `seen`.
    fn allowed_thinking(&mut self, seen: &[Token], tokens: &[Token]) -> Result<usize> {
        let mut window = seen.to_vec();
        for (i, &t) in tokens.iter().enumerate() {
            window.push(t);
            if self.ends(&window) {
                return Ok(i + 1 + self.inner.allowed_prefix(&tokens[i + 1..])?);
            }
        }
        Ok(tokens.len())
    }
}

impl Constraint for ThinkingGate<'_> {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        match self.phase {
            Phase::Thinking(_) => Ok(()),
            Phase::Answering => self.inner.mask(logits),
            Phase::Start => {
                let open = self.open.map(|t| t as usize).filter(|&t| t < logits.len());
                let kept = open.map(|t| logits[t]);
                self.inner.mask(logits)?;
                if let (Some(t), Some(l)) = (open, kept) {
                    logits[t] = l;
                }
                Ok(())
            }
        }
    }

    fn advance(&mut self, token: Token) -> Result<()> {
        match &mut self.phase {
            Phase::Answering => self.inner.advance(token),
            Phase::Start if Some(token) == self.open => {
                self.inner.passed(token);
                self.phase = Phase::Thinking(Vec::new());
                Ok(())
            }
            Phase::Start => {
                self.phase = Phase::Answering;
                self.inner.advance(token)
            }
            Phase::Thinking(seen) => {
                self.inner.passed(token);
                seen.push(token);
                // Only the last tokens matter for spotting the end.
                let keep = self.close.len();
                if seen.len() > 4 * keep.max(1) {
                    seen.drain(..seen.len() - keep);
                }
                if !self.close.is_empty() && seen.ends_with(&self.close) {
                    self.phase = Phase::Answering;
                }
                Ok(())
            }
        }
    }

    fn allowed_prefix(&mut self, tokens: &[Token]) -> Result<usize> {
        match self.phase.clone() {
            Phase::Answering => self.inner.allowed_prefix(tokens),
            Phase::Thinking(seen) => self.allowed_thinking(&seen, tokens),
            Phase::Start => match tokens.split_first() {
                Some((&first, rest)) if Some(first) == self.open => Ok(1 + self.allowed_thinking(&[], rest)?),
                _ => self.inner.allowed_prefix(tokens),
            },
        }
    }

    fn forced(&mut self, max: usize, out: &mut Draft) -> Result<()> {
        match self.phase {
            // At the start `<think>` is always another way.
            Phase::Start | Phase::Thinking(_) => Ok(()),
            Phase::Answering => self.inner.forced(max, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(inside: bool, pieces: &[&str]) -> Vec<Part> {
        let mut s = Splitter::new(inside);
        let mut out: Vec<Part> = pieces.iter().flat_map(|p| s.push(p)).collect();
        out.extend(s.finish());
        // Merge neighbours of a kind, as a client joining deltas would.
        let mut merged: Vec<Part> = Vec::new();
        for part in out {
            match (merged.last_mut(), part) {
                (Some(Part::Thinking(a)), Part::Thinking(b)) | (Some(Part::Answer(a)), Part::Answer(b)) => {
                    a.push_str(&b)
                }
                (_, part) => merged.push(part),
            }
        }
        merged
    }

    #[test]
    fn thinking_and_answer_are_told_apart_wherever_the_tags_are_cut() {
        let whole = "<think>\nLet me see.\n</think>\n\nParis.";
        let expected = vec![Part::Thinking("\nLet me see.\n".into()), Part::Answer("Paris.".into())];
        assert_eq!(stream(false, &[whole]), expected);
        // Every cut into two pieces gives the same parts.
        for cut in 1..whole.len() {
            assert_eq!(stream(false, &[&whole[..cut], &whole[cut..]]), expected, "cut at {cut}");
        }
        let chars: Vec<String> = whole.chars().map(String::from).collect();
        let one_by_one: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(false, &one_by_one), expected);
        assert_eq!(split(whole, false), (Some("Let me see.".into()), "Paris.".into()));
    }

    #[test]
    fn an_answer_without_thinking_is_all_answer_and_unended_thinking_is_all_thinking() {
        assert_eq!(split("Paris.", false), (None, "Paris.".into()));
        assert_eq!(split("<thinking is fun", false), (None, "<thinking is fun".into()));
        assert_eq!(split("<thi", false), (None, "<thi".into()));
        assert_eq!(split("<think>hmm", false), (Some("hmm".into()), String::new()));
        // A prompt that opened the block: the output starts inside it.
        assert_eq!(split("hmm</think>\n\nParis.", true), (Some("hmm".into()), "Paris.".into()));
        assert_eq!(split("", true), (Some(String::new()), String::new()));
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
        assert_eq!(thinking_after("<|im_start|>assistant\n<think>\n\n</think>\n\n"), None);
        assert_eq!(thinking_after("<|im_start|>assistant\n<think>\n"), Some(true));
        assert_eq!(thinking_after("<|im_start|>assistant\n"), Some(false));
    }

    /// Allows only token 1 (and records what it was given).
    struct OnlyOnes(Vec<Token>);

    impl Constraint for OnlyOnes {
        fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
            for (t, l) in logits.iter_mut().enumerate() {
                if t != 1 {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }
        fn advance(&mut self, token: Token) -> Result<()> {
            self.0.push(token);
            Ok(())
        }
        fn allowed_prefix(&mut self, tokens: &[Token]) -> Result<usize> {
            Ok(tokens.iter().take_while(|&&t| t == 1).count())
        }
        fn forced(&mut self, max: usize, out: &mut Draft) -> Result<()> {
            for _ in 0..max.min(1) {
                let _ = out.push(1);
            }
            Ok(())
        }
    }

    #[test]
    fn a_grammar_applies_after_the_thinking_only() {
        let mut inner = OnlyOnes(Vec::new());
        let mut gate = ThinkingGate::new(&mut inner, Some(4), vec![5, 6], false);
        let mut logits = vec![0.0; 8];
        gate.mask(&mut logits).unwrap();
        let mut forced = Draft::new();
        gate.forced(4, &mut forced).unwrap();
        assert!(forced.is_empty(), "nothing is forced while thinking");
        // At the start, `<think>` (4) or what the grammar allows (1).
        assert!(logits.iter().enumerate().all(|(t, l)| (*l == 0.0) == (t == 1 || t == 4)), "{logits:?}");
        assert_eq!(gate.allowed_prefix(&[2]).unwrap(), 0);
        // `<think>`, thinking 3 5 3, then `</think>` = 5 6, then the answer's 1 1 (2 is refused).
        assert_eq!(gate.allowed_prefix(&[4, 3, 5, 3, 5, 6, 1, 1, 2]).unwrap(), 8);
        gate.advance(4).unwrap();
        let mut logits = vec![0.0; 8];
        gate.mask(&mut logits).unwrap();
        assert!(logits.iter().all(|l| *l == 0.0), "thinking is free");
        for t in [3, 5, 3, 5] {
            gate.advance(t).unwrap();
            assert!(!gate.answering());
        }
        gate.advance(6).unwrap();
        assert!(gate.answering());
        gate.mask(&mut logits).unwrap();
        assert!(logits[1] == 0.0 && logits[2] == f32::NEG_INFINITY, "the grammar holds after `</think>`");
        gate.advance(1).unwrap();
        assert_eq!(inner.0, vec![1], "the inner constraint saw only the answer");

        // An answer that starts at once is the grammar's from its first token.
        let mut inner = OnlyOnes(Vec::new());
        let mut gate = ThinkingGate::new(&mut inner, Some(4), vec![5, 6], false);
        gate.advance(1).unwrap();
        assert!(gate.answering());
        let mut logits = vec![0.0; 8];
        gate.mask(&mut logits).unwrap();
        assert_eq!(logits[4], f32::NEG_INFINITY, "no thinking after the answer began");
        // A prompt that opened the thinking starts inside it.
        let mut inner = OnlyOnes(Vec::new());
        let gate = ThinkingGate::new(&mut inner, Some(4), vec![5, 6], true);
        assert!(!gate.answering());
    }
}
