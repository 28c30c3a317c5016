//! Suffix automaton over the running token sequence, the retrieval half of SAM decoding.
use crate::Token;

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Index of the root state (the empty string).
const ROOT: u32 = 0;
/// "No state / no node": the root's suffix link and the end of an edge list.
const NONE: u32 = u32::MAX;

/// A longest suffix match: the last `len` tokens of the sequence also end at `end`, earlier.
///
/// `tokens()[end - len..end] == tokens()[n - len..]` and `end < n` (n = sequence length), so
/// `tokens()[end..]` is never empty: it is the continuation to draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// Number of tokens matched (at least 1).
    pub len: usize,
    /// Index just past the earlier occurrence the match was found at.
    pub end: usize,
}

/// Where another sequence stands in an automaton: the longest suffix of that sequence that
/// occurs in the automaton's tokens ([`SuffixAutomaton::walk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// The state of the matched suffix (the root when nothing matches).
    state: u32,
    /// Tokens matched.
    len: u32,
}

impl Cursor {
    /// Tokens matched (0: none).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether nothing matches.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The automaton state of the matched suffix.
    pub(super) fn state(&self) -> u32 {
        self.state
    }
}

/// One state (an endpos equivalence class) of the automaton.
#[derive(Debug, Clone, Copy)]
struct State {
    /// Length of the longest string in the class.
    len: u32,
    /// Suffix link; `NONE` for the root only.
    link: u32,
    /// End (exclusive) of the class's first occurrence, `min(endpos)`.
    first_end: u32,
    /// First node of the state's out-edge list in `SuffixAutomaton::nodes`, or `NONE`.
    head: u32,
}

/// A node of a state's singly linked list of out-edge tokens.
#[derive(Debug, Clone, Copy)]
struct EdgeNode {
    token: Token,
    next: u32,
}

/// Suffix automaton over a growing token sequence (prompt + generated output) that tracks the
/// longest suffix of the sequence occurring earlier in it, for drafting speculative tokens.
///
/// End rule: of the earlier occurrences of the longest repeated suffix, the FIRST one (smallest
/// `end`) is reported. The first occurrence (`min(endpos)`) is exact and O(1) to maintain;
/// the most recent one would need every suffix-link ancestor updated on each push, which is
/// O(n) per push on repetitive input ("a a a a ...") unless a link-cut tree is used.
///
/// `push` is amortised O(1) (expected, through hashing); `longest_match` is O(1).
#[derive(Debug, Clone)]
pub struct SuffixAutomaton {
    tokens: Vec<Token>,
    states: Vec<State>,
    // Transitions: one flat map keyed by (state, token) packed into a u64. Vocabularies are
    // 50k–150k tokens, so per-state arrays are out, and per-state sorted vecs would allocate on
    // every push; the root alone can have thousands of edges, ruling out linear scans. Cloning a
    // state must copy its edges, which a map cannot enumerate, so each state also keeps its edge
    // tokens as a linked list in one flat `nodes` Vec. Everything grows amortised, never per push.
    edges: HashMap<u64, u32, EdgeHashBuilder>,
    nodes: Vec<EdgeNode>,
    /// The state of the whole sequence.
    last: u32,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixAutomaton {
    /// The most tokens an automaton holds; further pushes are ignored. It keeps the state
    /// (< 2n) and edge (< 3n) indices within `u32`.
    pub const MAX_TOKENS: usize = (u32::MAX / 4) as usize;

    /// An empty automaton.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty automaton with room for `tokens` tokens (2n states, 3n edges, the worst case),
    /// so that pushing that many never reallocates. The reservation is best effort: if the
    /// memory cannot be had, the buffers simply grow on demand.
    pub fn with_capacity(tokens: usize) -> Self {
        let n = tokens.min(Self::MAX_TOKENS);
        let mut sam = Self {
            tokens: Vec::new(),
            states: Vec::new(),
            edges: HashMap::with_hasher(EdgeHashBuilder { seed: RandomState::new().hash_one(0x5eed_u64) }),
            nodes: Vec::new(),
            last: ROOT,
        };
        // try_reserve: a huge `tokens` must not abort or panic.
        let _ = sam.tokens.try_reserve_exact(n);
        let _ = sam.states.try_reserve_exact(2 * n + 1);
        let _ = sam.nodes.try_reserve_exact(3 * n);
        let _ = sam.edges.try_reserve(3 * n);
        sam.clear();
        sam
    }

    /// Empties the automaton, keeping its buffers for reuse.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.states.clear();
        self.states.push(State { len: 0, link: NONE, first_end: 0, head: NONE });
        self.edges.clear();
        self.nodes.clear();
        self.last = ROOT;
    }

    /// Number of tokens pushed.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token has been pushed.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The sequence pushed so far.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Appends one token (ignored once [`Self::MAX_TOKENS`] are held): the standard online
    /// suffix automaton extension, amortised O(1).
    pub fn push(&mut self, token: Token) {
        if self.tokens.len() >= Self::MAX_TOKENS {
            return;
        }
        self.tokens.push(token);
        let n = self.tokens.len() as u32; // <= MAX_TOKENS, fits
        let cur = self.add_state(State { len: n, link: ROOT, first_end: n, head: NONE });
        let mut p = self.last;
        while p != NONE && self.edge(p, token).is_none() {
            self.add_edge(p, token, cur);
            p = self.states[p as usize].link;
        }
        if p != NONE
            && let Some(q) = self.edge(p, token)
        {
            let (p_len, q_state) = (self.states[p as usize].len, self.states[q as usize]);
            if p_len + 1 == q_state.len {
                self.states[cur as usize].link = q;
            } else {
                // Split q: the clone takes the strings of length <= p_len + 1, whose endpos
                // gains n; as n is the largest position, min(endpos) stays q's.
                let clone = self.add_state(State { len: p_len + 1, head: NONE, ..q_state });
                let mut node = q_state.head;
                while node != NONE {
                    let EdgeNode { token: t, next } = self.nodes[node as usize];
                    if let Some(target) = self.edge(q, t) {
                        self.add_edge(clone, t, target);
                    }
                    node = next;
                }
                while p != NONE && self.edge(p, token) == Some(q) {
                    self.edges.insert(edge_key(p, token), clone);
                    p = self.states[p as usize].link;
                }
                self.states[q as usize].link = clone;
                self.states[cur as usize].link = clone;
            }
        }
        self.last = cur;
    }

    /// Appends tokens one by one, as [`Self::push`].
    pub fn extend(&mut self, tokens: &[Token]) {
        self.tokens.reserve(tokens.len().min(Self::MAX_TOKENS.saturating_sub(self.tokens.len())));
        for &token in tokens {
            self.push(token);
        }
    }

    /// The longest suffix of the sequence that also occurs ending strictly before the last
    /// position, with `end` just past that suffix's FIRST occurrence (see the type docs); `None`
    /// if no non-empty suffix repeats. O(1).
    pub fn longest_match(&self) -> Option<Match> {
        // The suffix link of the whole sequence's state is the longest suffix whose endpos is
        // larger than {n}, i.e. the longest suffix that also occurs earlier.
        let link = self.states[self.last as usize].link;
        if link == ROOT {
            return None;
        }
        let state = self.states.get(link as usize)?; // NONE while empty
        Some(Match { len: state.len as usize, end: state.first_end as usize })
    }

    /// Appends to `out` up to `max` tokens that followed the longest match,
    /// `tokens()[m.end..min(m.end + max, len())]`, and returns the match length (0: no match,
    /// nothing appended). `out` must have room for `max` tokens if its `Extend` can fail
    /// (`heapless::Vec` panics when full).
    pub fn draft(&self, max: usize, out: &mut impl Extend<Token>) -> usize {
        let Some(m) = self.longest_match() else { return 0 };
        let stop = m.end.saturating_add(max).min(self.tokens.len());
        out.extend(self.tokens.get(m.end..stop).unwrap_or_default().iter().copied());
        m.len
    }

    /// Moves `cursor`, the longest suffix of some other sequence found in this automaton, on
    /// by that sequence's next `token`: the standard matching walk, amortised O(1). A cursor
    /// belongs to the automaton it walked; pushing more tokens keeps it valid.
    pub fn walk(&self, cursor: &mut Cursor, token: Token) {
        let mut state = cursor.state;
        let mut len = cursor.len;
        loop {
            if let Some(next) = self.edge(state, token) {
                *cursor = Cursor { state: next, len: len + 1 };
                return;
            }
            if state == ROOT {
                *cursor = Cursor::default();
                return;
            }
            state = self.states[state as usize].link;
            len = self.states[state as usize].len;
        }
    }

    /// The tokens that follow `state`'s strings somewhere, each with the state it leads to.
    pub(super) fn children(&self, state: u32) -> impl Iterator<Item = (Token, u32)> + '_ {
        let mut node = self.states.get(state as usize).map_or(NONE, |s| s.head);
        std::iter::from_fn(move || {
            let EdgeNode { token, next } = *self.nodes.get(node as usize)?;
            node = next;
            Some((token, self.edge(state, token)?))
        })
    }

    /// How many times each state's strings occur (the size of its end-position set), indexed
    /// by state: O(states), by counting sort on the states' lengths.
    pub(super) fn occurrences(&self) -> Vec<u32> {
        let mut count: Vec<u32> =
            self.states.iter().map(|s| u32::from(s.first_end == s.len && s.len > 0)).collect();
        // A clone shares its original's first end, so `first_end == len` marks exactly the
        // states made by a push (each ends at its own position); the root ends nowhere.
        let mut by_len = vec![0usize; self.tokens.len() + 2];
        for s in &self.states {
            by_len[s.len as usize] += 1;
        }
        for i in 1..by_len.len() {
            by_len[i] += by_len[i - 1];
        }
        let mut order = vec![0u32; self.states.len()];
        for (i, s) in self.states.iter().enumerate().rev() {
            by_len[s.len as usize] -= 1;
            order[by_len[s.len as usize]] = i as u32;
        }
        for &i in order.iter().rev() {
            let link = self.states[i as usize].link;
            if link != NONE {
                count[link as usize] += count[i as usize];
            }
        }
        count
    }

    /// Bytes the automaton holds on the heap (its buffers' capacities, the map's slots and
    /// control bytes).
    pub fn heap_bytes(&self) -> u64 {
        let slot = std::mem::size_of::<(u64, u32)>() + 1;
        (self.tokens.capacity() * std::mem::size_of::<Token>()
            + self.states.capacity() * std::mem::size_of::<State>()
            + self.nodes.capacity() * std::mem::size_of::<EdgeNode>()
            + self.edges.capacity() * slot) as u64
    }

    fn add_state(&mut self, state: State) -> u32 {
        self.states.push(state);
        (self.states.len() - 1) as u32
    }

    fn edge(&self, state: u32, token: Token) -> Option<u32> {
        self.edges.get(&edge_key(state, token)).copied()
    }

    /// Adds an edge `state --token--> target`; `state` must not have one on `token` yet.
    fn add_edge(&mut self, state: u32, token: Token, target: u32) {
        self.edges.insert(edge_key(state, token), target);
        let head = &mut self.states[state as usize].head;
        self.nodes.push(EdgeNode { token, next: *head });
        *head = (self.nodes.len() - 1) as u32;
    }
}

fn edge_key(state: u32, token: Token) -> u64 {
    (u64::from(state) << 32) | u64::from(token)
}

// SipHash (std's default) would cost more than the rest of a push. The keys are dense small
// integers, so one folded multiply mixes them well; the per-automaton random seed keeps a crafted
// prompt from forcing bucket collisions.

/// Builds [`EdgeHasher`]s sharing a random seed.
#[derive(Debug, Clone, Copy)]
struct EdgeHashBuilder {
    seed: u64,
}

impl BuildHasher for EdgeHashBuilder {
    type Hasher = EdgeHasher;
    fn build_hasher(&self) -> EdgeHasher {
        EdgeHasher { acc: self.seed }
    }
}

/// Hasher for packed `u64` edge keys (`write` is only a fallback).
struct EdgeHasher {
    acc: u64,
}

impl Hasher for EdgeHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.acc = fold(self.acc ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.acc = fold(self.acc ^ x);
    }
    fn finish(&self) -> u64 {
        self.acc
    }
}

fn fold(x: u64) -> u64 {
    let full = u128::from(x) * 0x5851_f42d_4c95_7f2d;
    (full as u64) ^ ((full >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// O(n·len): for every earlier end, the common suffix with the whole sequence; the longest
    /// wins, ties going to the smallest end (first occurrence).
    fn brute(t: &[Token]) -> Option<Match> {
        let mut best: Option<Match> = None;
        for end in 1..t.len() {
            let len = t[..end].iter().rev().zip(t.iter().rev()).take_while(|(a, b)| a == b).count();
            if len > best.map_or(0, |b| b.len) {
                best = Some(Match { len, end });
            }
        }
        best
    }

    fn check_all_prefixes(sam: &mut SuffixAutomaton, seq: &[Token], max: usize) {
        for (i, &t) in seq.iter().enumerate() {
            sam.push(t);
            assert_eq!(sam.tokens(), &seq[..=i]);
            let expected = brute(sam.tokens());
            assert_eq!(sam.longest_match(), expected, "prefix {:?}", sam.tokens());
            let mut out = Vec::new();
            let len = sam.draft(max, &mut out);
            let want = expected.map_or(&[][..], |m| &seq[m.end..(m.end + max).min(i + 1)]);
            assert_eq!((len, &out[..]), (expected.map_or(0, |m| m.len), want));
        }
    }

    fn seqs() -> impl Strategy<Value = Vec<Token>> {
        // Large ids too, so u32::MAX and friends are exercised as ordinary tokens.
        (1usize..=4, any::<bool>()).prop_flat_map(|(k, big)| {
            let alphabet: Vec<Token> =
                if big { vec![u32::MAX, 0, 151_935, 1 << 31] } else { vec![0, 1, 2, 3] };
            proptest::collection::vec(proptest::sample::select(alphabet[..k].to_vec()), 0..200)
        })
    }

    proptest! {
        #[test]
        fn matches_brute_force_after_every_push(seq in seqs(), max in 0usize..12) {
            check_all_prefixes(&mut SuffixAutomaton::new(), &seq, max);
        }

        #[test]
        fn clear_then_reuse_is_fresh(a in seqs(), b in seqs(), max in 0usize..12) {
            let mut sam = SuffixAutomaton::with_capacity(8);
            sam.extend(&a);
            sam.clear();
            prop_assert!(sam.is_empty() && sam.longest_match().is_none());
            check_all_prefixes(&mut sam, &b, max);
        }
    }

    #[test]
    fn repeated_code_line() {
        // "a b c d x a b": "a b" occurred before, followed by "c d x a b".
        let (a, b, c, d, x) = (10, 11, 12, 13, 99);
        let mut sam = SuffixAutomaton::new();
        sam.extend(&[a, b, c, d, x, a, b]);
        assert_eq!(sam.longest_match(), Some(Match { len: 2, end: 2 }));
        let mut out = heapless::Vec::<Token, 3>::new();
        assert_eq!(sam.draft(3, &mut out), 2);
        assert_eq!(out, [c, d, x]);
        let mut out = Vec::new();
        assert_eq!(sam.draft(100, &mut out), 2);
        assert_eq!(out, [c, d, x, a, b]);
    }

    #[test]
    fn first_occurrence_wins_ties() {
        // "x y" occurs ending at 2 and at 5; the first one is reported.
        let mut sam = SuffixAutomaton::new();
        sam.extend(&[1, 2, 3, 1, 2, 4, 1, 2]);
        assert_eq!(sam.longest_match(), Some(Match { len: 2, end: 2 }));
    }

    #[test]
    fn edge_cases() {
        let mut sam = SuffixAutomaton::default();
        assert_eq!((sam.len(), sam.longest_match(), sam.draft(4, &mut Vec::new())), (0, None, 0));
        sam.push(7);
        assert_eq!(sam.longest_match(), None);
        sam.push(8);
        assert_eq!(sam.longest_match(), None);
        // A run overlaps itself: "7 8 8 8" matches "8 8" ending at 3.
        sam.extend(&[8, 8]);
        assert_eq!(sam.longest_match(), Some(Match { len: 2, end: 3 }));
        let mut out = Vec::new();
        assert_eq!(sam.draft(0, &mut out), 2);
        assert!(out.is_empty());
        let mut reserved = SuffixAutomaton::with_capacity(1000);
        reserved.extend(&[7, 8, 8, 8]);
        assert_eq!(reserved.longest_match(), sam.longest_match());
    }
}
