//! Earlier answers, for drafting what an app's answers repeat across requests (after
//! SuffixDecoding, Oliaro et al. 2024).
//!
//! Apps on a board ask the same kinds of things again and again, and their answers open,
//! close and are shaped alike ("To find …, you can use …", `{"action": …`). A [`History`]
//! holds earlier answers, each after the last few tokens of its prompt (the chat template's
//! opening of the assistant's turn, and the end of the question), in one suffix automaton.
//! A request walks its own tokens over it ([`History::walk`]); where the longest suffix of
//! the request occurred in earlier answers, the draft follows the continuation that most
//! often came next, and each drafted token carries how often it did
//! ([`History::continuation`]): the frequency scoring that sizes the draft.
//!
//! A history is immutable while requests draft from it (they hold it behind an `Arc`); an
//! answer is added when its request ends, into a copy where one is in use.

use std::collections::VecDeque;

use super::suffix::{Cursor, SuffixAutomaton};
use crate::Token;

/// Ends every answer in the automaton, so that no draft runs from one answer into the next.
/// No vocabulary comes near it.
pub(super) const SEPARATOR: Token = u32::MAX - 1;

/// Tokens of the prompt kept before each answer: enough for a chat template's opening of the
/// assistant's turn and the end of the question, so that an answer's first tokens can be
/// drafted too.
pub const PROMPT_TAIL: usize = 8;

/// Earlier answers in one suffix automaton, oldest first, with how often each of its strings
/// occurs.
#[derive(Debug, Clone, Default)]
pub struct History {
    sam: SuffixAutomaton,
    /// Occurrences of each automaton state's strings.
    counts: Vec<u32>,
    /// Tokens each answer takes in the automaton (prompt tail, answer, separator), oldest
    /// first.
    entries: VecDeque<usize>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an answer: `output`, after the last [`PROMPT_TAIL`] tokens of `prompt`. An empty
    /// answer adds nothing.
    pub fn push(&mut self, prompt: &[Token], output: &[Token]) {
        if output.is_empty() {
            return;
        }
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
        let before = self.sam.len();
        self.sam.extend(tail);
        self.sam.extend(output);
        self.sam.push(SEPARATOR);
        self.entries.push_back(self.sam.len() - before);
        self.counts = self.sam.occurrences();
    }

    /// Drops the oldest answers until at most `tokens` tokens are held, rebuilding the
    /// automaton from the answers kept; whether anything was dropped.
    pub fn keep_newest(&mut self, tokens: usize) -> bool {
        let mut cut = 0;
        let mut held = self.sam.len();
        while held > tokens {
            let Some(n) = self.entries.pop_front() else { break };
            cut += n;
            held -= n;
        }
        if cut == 0 {
            return false;
        }
        let kept = self.sam.tokens()[cut..].to_vec();
        self.sam = SuffixAutomaton::with_capacity(kept.len());
        self.sam.extend(&kept);
        self.counts = self.sam.occurrences();
        true
    }

    /// What the history holds, for writing it out ([`History::from_saved`] reads it back):
    /// its tokens (each answer after its prompt's tail, then a separator), and how many of
    /// them each answer takes, oldest first.
    pub fn saved(&self) -> (&[Token], Vec<usize>) {
        (self.sam.tokens(), self.entries.iter().copied().collect())
    }

    /// The history that [`History::saved`] gave `tokens` and `entries` of; `None` where they
    /// are not such (the entries do not cut the tokens into answers, each ending in a
    /// separator).
    pub fn from_saved(tokens: &[Token], entries: &[usize]) -> Option<History> {
        let mut end = 0;
        for &n in entries {
            end += n;
            if n < 2 || end > tokens.len() || tokens[end - 1] != SEPARATOR {
                return None;
            }
        }
        if end != tokens.len() {
            return None;
        }
        let mut sam = SuffixAutomaton::with_capacity(tokens.len());
        sam.extend(tokens);
        let counts = sam.occurrences();
        Some(History { sam, counts, entries: entries.iter().copied().collect() })
    }

    /// Answers held.
    pub fn answers(&self) -> usize {
        self.entries.len()
    }

    /// Tokens held (prompt tails and separators included).
    pub fn tokens(&self) -> usize {
        self.sam.len()
    }

    /// Bytes held on the heap.
    pub fn bytes(&self) -> u64 {
        self.sam.heap_bytes()
            + (self.counts.capacity() * std::mem::size_of::<u32>()) as u64
            + (self.entries.capacity() * std::mem::size_of::<usize>()) as u64
    }

    /// Moves `cursor` on by a request's next token (see [`SuffixAutomaton::walk`]).
    pub fn walk(&self, cursor: &mut Cursor, token: Token) {
        self.sam.walk(cursor, token);
    }

    /// Appends to `out` up to `max` tokens that most often followed the cursor's suffix in
    /// earlier answers, and for each the share of the occurrences so far that it continued
    /// (`share[i]` for `out`'s i-th new token): at a branch the most frequent continuation is
    /// taken and its share says how sure that is. Stops at the end of an answer. Returns how
    /// many were appended. `out` must have room for `max` tokens if its `Extend` can fail.
    pub fn continuation(
        &self,
        cursor: Cursor,
        max: usize,
        out: &mut impl Extend<Token>,
        share: &mut [f64],
    ) -> usize {
        if cursor.is_empty() {
            return 0;
        }
        let mut state = cursor.state();
        let max = max.min(share.len());
        let mut n = 0;
        while n < max {
            let total = self.counts.get(state as usize).copied().unwrap_or(0);
            // The end of an answer competes: where it is likeliest, the draft stops.
            let Some(&(token, next, count)) = self.ranked::<1>(state, |_| true).first() else { break };
            if token == SEPARATOR || total == 0 {
                break;
            }
            out.extend([token]);
            share[n] = f64::from(count) / f64::from(total);
            n += 1;
            state = next;
        }
        n
    }
}

/// Most continuations of one token a tree offers: the most frequent.
const TREE_FANOUT: usize = 4;

/// Tokens offered for a tree and not yet taken, at most: each taken token offers
/// [`TREE_FANOUT`] and removes itself.
const FRONTIER: usize = TREE_FANOUT * (super::MAX_DRAFT + 1);

/// A token offered for a tree: its reach, its parent's index in the pass, its state, itself.
type Offer = (f64, u8, u32, Token);

impl History {
    /// Writes a tree of what followed the cursor's suffix in earlier answers into `tokens`,
    /// `parents` and `reach` (up to the shortest's length), best first: a token's reach is
    /// its parent's (1 for the cursor) times `alpha` times the share of its parent's
    /// occurrences it continued, and the token of highest reach not yet taken comes next (of
    /// equals, the one offered first). So every token comes after its parent and reaches no
    /// higher, and each prefix of the tree is the best tree of that size this scoring knows.
    /// `parents[i]` is the index of token i's parent in a verification pass: 0 for the
    /// pending token (the cursor), `j + 1` for `tokens[j]`. Returns how many were written.
    pub fn tree(
        &self,
        cursor: Cursor,
        alpha: f64,
        tokens: &mut [Token],
        parents: &mut [u8],
        reach: &mut [f64],
    ) -> usize {
        if cursor.is_empty() {
            return 0;
        }
        let max = tokens.len().min(parents.len()).min(reach.len()).min(super::MAX_DRAFT);
        let mut frontier = heapless::Vec::<Offer, FRONTIER>::new();
        self.offer(cursor.state(), 0, 1.0, alpha, &mut frontier);
        let mut n = 0;
        while n < max {
            let best = (0..frontier.len()).fold(None, |best: Option<usize>, i| match best {
                Some(b) if frontier[b].0 >= frontier[i].0 => Some(b),
                _ => Some(i),
            });
            let Some(i) = best else { break };
            let (r, parent, state, token) = frontier.remove(i);
            (tokens[n], parents[n], reach[n]) = (token, parent, r);
            n += 1;
            self.offer(state, n as u8, r, alpha, &mut frontier);
        }
        n
    }

    /// Offers the [`TREE_FANOUT`] most frequent continuations of `state` but the end of an
    /// answer ([`History::ranked`]), which follow the pass's token
    /// `parent`, reached with probability `reach`.
    fn offer(
        &self,
        state: u32,
        parent: u8,
        reach: f64,
        alpha: f64,
        frontier: &mut heapless::Vec<Offer, FRONTIER>,
    ) {
        let total = self.counts.get(state as usize).copied().unwrap_or(0);
        if total == 0 {
            return;
        }
        for (t, s, c) in self.ranked::<TREE_FANOUT>(state, |t| t != SEPARATOR) {
            frontier.push((reach * alpha * f64::from(c) / f64::from(total), parent, s, t)).ok();
        }
    }

    /// The `N` most frequent continuations of `state` whose token `keep` takes, most frequent
    /// first, each with its state and count; of equals, the one listed first (the latest
    /// added), so that a newer habit wins a tie.
    fn ranked<const N: usize>(
        &self,
        state: u32,
        keep: impl Fn(Token) -> bool,
    ) -> heapless::Vec<(Token, u32, u32), N> {
        let mut top = heapless::Vec::<(Token, u32, u32), N>::new();
        for (t, s) in self.sam.children(state).filter(|&(t, _)| keep(t)) {
            let c = self.counts.get(s as usize).copied().unwrap_or(0);
            let at = top.iter().position(|o| o.2 < c).unwrap_or(top.len());
            if at < N {
                if top.is_full() {
                    top.pop();
                }
                top.insert(at, (t, s, c)).ok();
            }
        }
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(h: &History, context: &[Token]) -> Cursor {
        let mut c = Cursor::default();
        for &t in context {
            h.walk(&mut c, t);
        }
        c
    }

    fn draft(h: &History, context: &[Token], max: usize) -> (Vec<Token>, Vec<f64>) {
        let mut out = Vec::new();
        let mut share = [0.0; 16];
        let n = h.continuation(cursor(h, context), max, &mut out, &mut share);
        (out, share[..n].to_vec())
    }

    #[test]
    fn an_answer_seen_before_is_drafted_from_its_prompt_tail_to_its_end() {
        let mut h = History::new();
        // Prompt "… 1 2 3 4 5 6 7 8 9 ASSISTANT(50)", answer 60 61 62 63.
        let prompt: Vec<Token> = (1..=9).chain([50]).collect();
        h.push(&prompt, &[60, 61, 62, 63]);
        assert_eq!((h.answers(), h.tokens()), (1, PROMPT_TAIL + 4 + 1));
        // Another question ending the same way: the whole answer, each token sure.
        let (out, share) = draft(&h, &[77, 8, 9, 50], 8);
        assert_eq!(out, [60, 61, 62, 63]);
        assert_eq!(share, [1.0; 4]);
        // Partway through, the rest; never past the answer's end.
        assert_eq!(draft(&h, &[50, 60, 61], 8).0, [62, 63]);
        assert_eq!(draft(&h, &[50, 60, 61], 1).0, [62]);
        // Nothing matching, nothing drafted.
        assert_eq!(draft(&h, &[99], 8).0, Vec::<Token>::new());
    }

    #[test]
    fn at_a_branch_the_most_frequent_continuation_wins_with_its_share() {
        let mut h = History::new();
        h.push(&[50], &[60, 61, 70, 71]);
        h.push(&[50], &[60, 61, 80, 81]);
        h.push(&[50], &[60, 61, 80, 81]);
        let (out, share) = draft(&h, &[50], 8);
        assert_eq!(out, [60, 61, 80, 81]);
        // 60 and 61 always followed; 80 followed 2 of the 3 times.
        assert_eq!(share[..2], [1.0, 1.0]);
        assert!((share[2] - 2.0 / 3.0).abs() < 1e-12, "{share:?}");
        assert_eq!(share[3], 1.0);
    }

    #[test]
    fn a_tree_takes_the_likeliest_tokens_first_and_branches_where_answers_did() {
        let mut h = History::new();
        h.push(&[50], &[60, 61, 70, 71]);
        h.push(&[50], &[60, 61, 80, 81]);
        h.push(&[50], &[60, 61, 80, 81]);
        let (mut tokens, mut parents, mut reach) = ([0; 16], [0u8; 16], [0.0; 16]);
        let n = h.tree(cursor(&h, &[50]), 1.0, &mut tokens, &mut parents, &mut reach);
        // 60 61 then the branch: 80 (2 of 3) and 81 after it before 70 (1 of 3), then 71.
        assert_eq!(tokens[..n], [60, 61, 80, 81, 70, 71]);
        assert_eq!(parents[..n], [0, 1, 2, 3, 2, 5]);
        let want = [1.0, 1.0, 2.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
        for (r, w) in reach[..n].iter().zip(want) {
            assert!((r - w).abs() < 1e-12, "{:?}", &reach[..n]);
        }
        // Its first path is what the continuation drafts; a lower alpha reorders nothing
        // here, and the room given bounds it.
        assert_eq!(draft(&h, &[50], 8).0, [60, 61, 80, 81]);
        let n = h.tree(cursor(&h, &[50]), 0.5, &mut tokens[..3], &mut parents, &mut reach);
        assert_eq!((n, &tokens[..3]), (3, &[60, 61, 80][..]));
        assert_eq!(h.tree(Cursor::default(), 1.0, &mut tokens, &mut parents, &mut reach), 0);
    }

    #[test]
    fn a_saved_history_reads_back_as_it_was_and_a_damaged_one_does_not() {
        let mut h = History::new();
        h.push(&[50], &[60, 61, 70]);
        h.push(&[51, 50], &[60, 61, 80]);
        let (tokens, entries) = h.saved();
        let back = History::from_saved(tokens, &entries).expect("reads back");
        assert_eq!(back.saved(), (tokens, entries.clone()));
        assert_eq!(draft(&back, &[50, 60], 8), draft(&h, &[50, 60], 8));
        // Entries that do not cut the tokens into answers are refused.
        assert!(History::from_saved(tokens, &entries[..1]).is_none());
        assert!(History::from_saved(&tokens[1..], &entries).is_none());
        assert!(History::from_saved(tokens, &[2, tokens.len() - 2]).is_none());
        assert!(History::from_saved(&[], &[]).is_some());
    }

    #[test]
    fn the_oldest_answers_go_first_and_what_stays_still_drafts() {
        let mut h = History::new();
        h.push(&[50], &[60, 61, 62]);
        h.push(&[51], &[70, 71, 72]);
        let before = h.bytes();
        assert!(before > 0);
        // Each entry is 1 + 3 + 1 tokens: keep one.
        assert!(h.keep_newest(5));
        assert_eq!((h.answers(), h.tokens()), (1, 5));
        assert_eq!(draft(&h, &[50, 60], 8).0, Vec::<Token>::new());
        assert_eq!(draft(&h, &[51, 70], 8).0, [71, 72]);
        assert!(!h.keep_newest(5));
        assert!(h.keep_newest(0));
        assert_eq!((h.answers(), h.tokens()), (0, 0));
        // Empty answers are not kept.
        h.push(&[1, 2], &[]);
        assert_eq!(h.answers(), 0);
    }

    #[test]
    fn occurrences_match_a_brute_force_count() {
        let mut h = History::new();
        let answers: [&[Token]; 4] = [&[1, 2, 3, 1, 2], &[2, 3, 4], &[1, 2, 3], &[3, 3, 3]];
        for a in answers {
            h.push(&[9], a);
        }
        let text = h.sam.tokens().to_vec();
        // For every substring up to length 3: its count from the automaton equals a scan.
        for len in 1..=3 {
            for start in 0..=text.len() - len {
                let needle = &text[start..start + len];
                let scan = text.windows(len).filter(|w| *w == needle).count() as u32;
                let c = cursor(&h, needle);
                assert_eq!(c.len(), len);
                assert_eq!(h.counts[c.state() as usize], scan, "{needle:?}");
            }
        }
    }
}
