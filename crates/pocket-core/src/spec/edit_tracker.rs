//! Following an output that copies earlier text with edits in it.
//!
//! Asked to rename a variable, add type hints or fix a line, a model copies the code it was
//! given and changes a few tokens here and there. A suffix match loses its place at every
//! change: once `text` has replaced `s`, no suffix of the output occurred before, and the
//! match needs several copied tokens to find its place again. The tracker keeps the place: it
//! follows the output through the earlier text token by token; where they part, it looks a
//! short way ahead in both for the token where they meet again, which steps over a
//! substitution, an insertion or a deletion. A substitution confirmed by the tokens after it
//! is learnt, and what the tracker predicts from the earlier text carries it: a name changed
//! once is predicted changed everywhere after, until the model keeps one unchanged.

use super::suffix::Match;
use crate::Token;

/// How far ahead of the point where the output left the earlier text it may meet it again.
const MAX_SKIP: usize = 24;
/// How many output tokens after leaving the earlier text are searched for the meeting point
/// before the tracker gives up.
const MAX_GAP: usize = 24;
/// Tokens the output must follow after meeting the earlier text again before the edit
/// counts as confirmed (learnt, and no longer undone by parting again at once).
const CONFIRM: usize = 3;
/// Longest side of a substitution that is learnt.
const MAX_SUBSTITUTION: usize = 6;
/// Most substitutions kept.
const MAX_SUBSTITUTIONS: usize = 32;
/// Shortest suffix match the tracker starts following from.
const MIN_ANCHOR: usize = 3;

/// `from`, in the earlier text, became `to` in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Substitution {
    from: Vec<Token>,
    to: Vec<Token>,
}

/// A place in the earlier text: the next token to read, or the middle of a substitution's
/// replacement being written out (`pos` is then already past its `from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    pos: usize,
    /// The substitution and the index into its `to` of the next token.
    within: Option<(usize, usize)>,
    /// Whether the earlier text is the one before the fence (it ends there).
    fenced: bool,
}

/// Where the output left the earlier text: `pos` is the first earlier token it did not
/// reproduce, `at` the index of the first output token that differed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parting {
    pos: usize,
    at: usize,
    fenced: bool,
}

/// Where the earlier text ends for predicting token `at`: at the fence for the text before
/// it, and before `at` itself for the rest.
fn text_end(fenced: bool, fence: usize, at: usize) -> usize {
    if fenced { fence } else { at }
}

/// The output met the earlier text again after `parting`: output token `at` is earlier
/// token `pos`. Unconfirmed until [`CONFIRM`] tokens have followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meeting {
    parting: Parting,
    pos: usize,
    at: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not following anything.
    Idle,
    /// The output has followed the earlier text for the last `run` tokens; `cursor` says
    /// what it predicts next.
    Following { cursor: Cursor, run: usize, meeting: Option<Meeting> },
    /// The output left the earlier text and has not met it again yet.
    Parted(Parting),
}

/// Follows the output through the earlier text it copies (see the module docs).
///
/// The tokens it is given are the whole sequence (for an encoder-decoder model, the source
/// and then the output), and only ever grow between [`EditTracker::reset`]s. Tokens before a
/// `fence` (the source's end) and tokens after it are separate texts: following one never
/// runs on into the other.
#[derive(Debug, Clone)]
pub(super) struct EditTracker {
    state: State,
    substitutions: Vec<Substitution>,
    /// Tokens of the sequence already followed.
    seen: usize,
}

impl Default for EditTracker {
    fn default() -> Self {
        EditTracker { state: State::Idle, substitutions: Vec::new(), seen: 0 }
    }
}

impl EditTracker {
    /// Forget everything: a new sequence starts, whose first `read` tokens (a prompt) are
    /// taken as read without being followed. A prompt is not an output copying itself, and
    /// what its repetitions differ in are no edits to learn.
    pub(super) fn reset(&mut self, read: usize) {
        *self = EditTracker { seen: read, ..EditTracker::default() };
    }

    /// Follow the tokens of `tokens` not seen yet, then, unless the tracker follows the
    /// output at least as far back as `anchor` (the sequence's longest repeated suffix)
    /// reaches, start following from there.
    pub(super) fn update(&mut self, tokens: &[Token], fence: usize, anchor: Option<Match>) {
        for at in self.seen..tokens.len() {
            self.follow(tokens, fence, at);
        }
        self.seen = tokens.len();
        let Some(m) = anchor else { return };
        if m.len >= MIN_ANCHOR && m.len > self.run().unwrap_or(0) && m.end < tokens.len() {
            let cursor = Cursor { pos: m.end, within: None, fenced: m.end <= fence };
            self.state = State::Following { cursor, run: m.len, meeting: None };
        }
    }

    /// How many of the last tokens the tracker has followed, if it follows the output now.
    pub(super) fn run(&self) -> Option<usize> {
        match self.state {
            State::Following { run, .. } => Some(run),
            _ => None,
        }
    }

    /// Appends to `out` up to `max` tokens that the earlier text, with the substitutions
    /// learnt, predicts after `tokens` (the sequence last given to [`EditTracker::update`]);
    /// returns how many. `out` must have room for `max` tokens if its `Extend` can fail.
    pub(super) fn predict(
        &self,
        tokens: &[Token],
        fence: usize,
        max: usize,
        out: &mut impl Extend<Token>,
    ) -> usize {
        let State::Following { mut cursor, .. } = self.state else { return 0 };
        let end = text_end(cursor.fenced, fence, tokens.len());
        let mut n = 0;
        while n < max {
            let Some((token, next, _)) = self.next(tokens, cursor, end) else { break };
            out.extend([token]);
            cursor = next;
            n += 1;
        }
        n
    }

    /// The token the earlier text predicts at `cursor`, the cursor after it, and the
    /// substitution that gave it (if one did); `None` when the earlier text, which ends
    /// before `end`, has nothing more.
    fn next(&self, tokens: &[Token], cursor: Cursor, end: usize) -> Option<(Token, Cursor, Option<usize>)> {
        if let Some((i, offset)) = cursor.within {
            let to = &self.substitutions[i].to;
            let within = (offset + 1 < to.len()).then_some((i, offset + 1));
            return Some((to[offset], Cursor { within, ..cursor }, Some(i)));
        }
        let rest = tokens.get(cursor.pos..end)?;
        let first = *rest.first()?;
        // Of the substitutions that apply here, the one replacing the most.
        let applies = self
            .substitutions
            .iter()
            .enumerate()
            .filter(|(_, s)| rest.starts_with(&s.from))
            .max_by_key(|(_, s)| s.from.len());
        Some(match applies {
            Some((i, s)) => {
                let within = (s.to.len() > 1).then_some((i, 1));
                (s.to[0], Cursor { pos: cursor.pos + s.from.len(), within, ..cursor }, Some(i))
            }
            None => (first, Cursor { pos: cursor.pos + 1, ..cursor }, None),
        })
    }

    /// Follow output token `tokens[at]`.
    fn follow(&mut self, tokens: &[Token], fence: usize, at: usize) {
        let token = tokens[at];
        match self.state {
            State::Idle => {}
            State::Following { cursor, run, meeting } => {
                match self.next(tokens, cursor, text_end(cursor.fenced, fence, at)) {
                    Some((predicted, next, _)) if predicted == token => {
                        let run = run + 1;
                        let meeting = match meeting {
                            Some(m) if run >= CONFIRM => {
                                self.learn(tokens, m);
                                None
                            }
                            m => m,
                        };
                        self.state = State::Following { cursor: next, run, meeting };
                    }
                    Some((_, _, substitution)) => {
                        // A substitution the output did not make is wrong here, and likely
                        // wherever it would apply next: forget it (the cursor that named it
                        // goes too).
                        if let Some(i) = substitution {
                            self.substitutions.swap_remove(i);
                        }
                        // Parting again right after meeting means the meeting point was
                        // chance: look again from the first parting.
                        let parting = match meeting {
                            Some(m) => m.parting,
                            None => Parting { pos: cursor.pos, at, fenced: cursor.fenced },
                        };
                        self.state = State::Parted(parting);
                        self.meet(tokens, fence, at, parting);
                    }
                    None => self.state = State::Idle,
                }
            }
            State::Parted(parting) if at - parting.at > MAX_GAP => self.state = State::Idle,
            State::Parted(parting) => self.meet(tokens, fence, at, parting),
        }
    }

    /// If output token `at` occurs in the earlier text a short way after `parting`, follow
    /// from its nearest occurrence there.
    fn meet(&mut self, tokens: &[Token], fence: usize, at: usize, parting: Parting) {
        let last = text_end(parting.fenced, fence, at).min(parting.pos + MAX_SKIP + 1);
        let found = (parting.pos..last).find(|&pos| tokens[pos] == tokens[at]);
        if let Some(pos) = found {
            let cursor = Cursor { pos: pos + 1, within: None, fenced: parting.fenced };
            self.state = State::Following { cursor, run: 1, meeting: Some(Meeting { parting, pos, at }) };
        }
    }

    /// Learn the substitution a confirmed meeting shows, if it is one (not an insertion or a
    /// deletion) and short.
    fn learn(&mut self, tokens: &[Token], m: Meeting) {
        let from = &tokens[m.parting.pos..m.pos];
        let to = &tokens[m.parting.at..m.at];
        let short = |side: &[Token]| !side.is_empty() && side.len() <= MAX_SUBSTITUTION;
        if short(from)
            && short(to)
            && from != to
            && self.substitutions.len() < MAX_SUBSTITUTIONS
            && !self.substitutions.iter().any(|s| s.from == from)
        {
            self.substitutions.push(Substitution { from: from.to_vec(), to: to.to_vec() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SuffixAutomaton;

    /// Feed the tracker the tokens of `tokens` it has not seen one at a time, as generation
    /// does (no fence), each time anchored at the longest repeated suffix as the suffix
    /// drafter's automaton finds it; then its prediction.
    fn predict(t: &mut EditTracker, tokens: &[Token], max: usize) -> Vec<Token> {
        for n in t.seen + 1..=tokens.len() {
            t.update(&tokens[..n], 0, longest_repeated_suffix(&tokens[..n]));
        }
        let mut out = Vec::new();
        t.predict(tokens, 0, max, &mut out);
        out
    }

    fn longest_repeated_suffix(tokens: &[Token]) -> Option<Match> {
        let mut sam = SuffixAutomaton::new();
        sam.extend(tokens);
        sam.longest_match()
    }

    /// A tracker for the output after `prompt`.
    fn after(prompt: &[Token]) -> EditTracker {
        let mut t = EditTracker::default();
        t.reset(prompt.len());
        t
    }

    // The earlier text, "def f ( s ) : return g ( s ) + h ( s )", as tokens.
    const DEF: Token = 1;
    const F: Token = 2;
    const OPEN: Token = 3;
    const S: Token = 4;
    const CLOSE: Token = 5;
    const COLON: Token = 6;
    const RETURN: Token = 7;
    const G: Token = 8;
    const PLUS: Token = 9;
    const H: Token = 10;
    const TEXT: Token = 20;
    const INSTRUCTION: Token = 30;
    const BODY: [Token; 16] =
        [DEF, F, OPEN, S, CLOSE, COLON, RETURN, G, OPEN, S, CLOSE, PLUS, H, OPEN, S, CLOSE];

    #[test]
    fn a_renamed_name_is_predicted_renamed_once_the_rename_is_confirmed() {
        let prompt = [&[INSTRUCTION][..], &BODY, &[INSTRUCTION]].concat();
        let mut t = after(&prompt);
        // The output starts copying: "def f (" is anchored and followed.
        let mut seq = [&prompt[..], &[DEF, F, OPEN]].concat();
        assert_eq!(predict(&mut t, &seq, 3), [S, CLOSE, COLON]);
        // "text" instead of "s": parted, and nothing is predicted until the output meets the
        // text again, at ")".
        seq.push(TEXT);
        assert_eq!(predict(&mut t, &seq, 3), Vec::<Token>::new());
        seq.push(CLOSE);
        // Unconfirmed yet: the next "s" is still predicted as "s".
        assert_eq!(predict(&mut t, &seq, 6), [COLON, RETURN, G, OPEN, S, CLOSE]);
        seq.extend([COLON, RETURN]);
        // Confirmed: every later "s" is predicted as "text".
        assert_eq!(predict(&mut t, &seq, 9), [G, OPEN, TEXT, CLOSE, PLUS, H, OPEN, TEXT, CLOSE]);
        seq.extend([G, OPEN, TEXT, CLOSE, PLUS, H, OPEN]);
        assert_eq!(predict(&mut t, &seq, 3), [TEXT, CLOSE, INSTRUCTION]);
        assert_eq!(t.run(), Some(10));
    }

    #[test]
    fn a_substitution_the_output_does_not_make_is_forgotten() {
        let mut t = after(&BODY);
        let mut seq = [&BODY[..], &[DEF, F, OPEN, TEXT, CLOSE, COLON, RETURN]].concat();
        assert_eq!(predict(&mut t, &seq, 4), [G, OPEN, TEXT, CLOSE]);
        // The model keeps this "s": the substitution goes, and the output is back on the
        // text at once.
        seq.extend([G, OPEN, S]);
        assert_eq!(predict(&mut t, &seq, 5), [CLOSE, PLUS, H, OPEN, S]);
        assert!(t.substitutions.is_empty());
    }

    #[test]
    fn insertions_and_deletions_are_stepped_over_and_not_learnt() {
        // ": int" inserted after "s" (type hints).
        let (colon, int) = (40, 41);
        let mut t = after(&BODY);
        let mut seq = [&BODY[..], &[DEF, F, OPEN, S, colon, int, CLOSE]].concat();
        assert_eq!(predict(&mut t, &seq, 3), [COLON, RETURN, G]);
        seq.extend([COLON, RETURN, G]);
        assert_eq!(predict(&mut t, &seq, 3), [OPEN, S, CLOSE]);
        assert!(t.substitutions.is_empty());
        // "g ( s ) +" deleted.
        let mut t = after(&BODY);
        let mut seq = [&BODY[..], &BODY[..7], &[H]].concat();
        assert_eq!(predict(&mut t, &seq, 3), [OPEN, S, CLOSE]);
        seq.extend([OPEN, S, CLOSE]);
        // Past the body comes what follows it in the sequence: here the output's start.
        assert_eq!(predict(&mut t, &seq, 3), [DEF, F, OPEN]);
        assert!(t.substitutions.is_empty());
    }

    #[test]
    fn a_chance_meeting_is_undone_when_the_output_parts_again_at_once() {
        // "( s )" became "( x h y )": the "h" meets the text by chance (in "+ h ( s )"), the
        // "y" after it parts again, and the search goes back to the first parting.
        let (x, y) = (50, 52);
        let mut t = after(&BODY);
        let mut seq = [&BODY[..], &[DEF, F, OPEN, x, H]].concat();
        assert_eq!(predict(&mut t, &seq, 3), [OPEN, S, CLOSE]);
        seq.push(y);
        assert_eq!(predict(&mut t, &seq, 3), Vec::<Token>::new());
        assert_eq!(t.run(), None);
        seq.push(CLOSE);
        assert_eq!(predict(&mut t, &seq, 3), [COLON, RETURN, G]);
        // Confirmed: "s" became "x h y", and nothing from the chance meeting was learnt.
        seq.extend([COLON, RETURN, G]);
        assert_eq!(predict(&mut t, &seq, 2), [OPEN, x]);
        assert_eq!(t.substitutions, [Substitution { from: vec![S], to: vec![x, H, y] }]);
    }

    #[test]
    fn the_fence_keeps_the_two_texts_apart() {
        // A source "1 2 3 4" before the fence, then an output copying it: following the
        // source stops at its end rather than running on into the output.
        let mut t = EditTracker::default();
        let mut out = Vec::new();
        let seq = [1, 2, 3, 4, 1, 2, 3];
        t.update(&seq, 4, longest_repeated_suffix(&seq));
        assert_eq!(t.predict(&seq, 4, 8, &mut out), 1);
        assert_eq!(out, [4]);
        let seq = [1, 2, 3, 4, 1, 2, 3, 4];
        t.update(&seq, 4, longest_repeated_suffix(&seq));
        assert_eq!(t.predict(&seq, 4, 8, &mut out), 0);
        // Without a fence the copy runs on.
        let mut t = EditTracker::default();
        t.update(&seq, 0, longest_repeated_suffix(&seq));
        assert_eq!(t.predict(&seq, 0, 8, &mut out), 4);
    }
}
