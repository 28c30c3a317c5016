//! Text out of token bytes, and when generation stops.
//!
//! Tokens are bytes, not characters: a character can be split across tokens, and a stop
//! string can be split across tokens too. [`TextStream`] turns the bytes of each token into
//! the text that is safe to show now, holding back what could still turn out to be the
//! start of a stop string.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end token (end of sequence or end of turn).
    Eos,
    /// A stop string appeared in the text.
    StopString,
    /// The request's `max_tokens` were generated.
    MaxTokens,
    /// The session's context is full.
    ContextFull,
    /// The caller cancelled.
    Cancelled,
}

impl StopReason {
    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::StopString => "stop_string",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When to stop generating, besides the model's end token and the context size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopConfig {
    /// Most tokens to generate (the end token not counted).
    pub max_tokens: usize,
    /// Stop when one of these appears in the text; it is not part of the output.
    pub stop: Vec<String>,
}

impl Default for StopConfig {
    fn default() -> Self {
        StopConfig { max_tokens: 256, stop: Vec::new() }
    }
}

impl StopConfig {
    /// Check the stop strings: an empty one would match before any text.
    pub fn validate(&self) -> Result<()> {
        if let Some(i) = self.stop.iter().position(String::is_empty) {
            return Err(Error::invalid_field(
                "stop",
                format!("stop string {i} is empty; stop strings must have at least one character"),
            ));
        }
        Ok(())
    }
}

/// What one [`TextStream::push`] (or [`TextStream::finish`]) released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Text that is final: show it.
    pub text: &'a str,
    /// The stop string that completed in this chunk, if one did. `text` ends where it
    /// starts, and the stream releases nothing more.
    pub stop: Option<&'a str>,
}

/// Assembles the bytes of successive tokens into text, and watches for stop strings.
///
/// Bytes that cannot be valid UTF-8 whatever follows become U+FFFD as soon as that is
/// known (like [`String::from_utf8_lossy`], one U+FFFD per maximal invalid sequence), so the
/// stream never stalls. When several stop strings occur, the one that completes first wins
/// (on a tie, the longer one), however the bytes were split into tokens.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    stop: Vec<String>,
    /// Bytes of an incomplete character.
    bytes: Vec<u8>,
    /// Decoded text that could still be the start of a stop string.
    held: String,
    /// What the last call released; kept to reuse its buffer.
    out: String,
    stopped: Option<usize>,
    finished: bool,
}

impl TextStream {
    /// A stream watching for `stop` strings (empty ones are ignored; see
    /// [`StopConfig::validate`]).
    pub fn new(stop: &[String]) -> Self {
        TextStream { stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(), ..Self::default() }
    }

    /// Add the bytes of the next token and get the text this completes.
    ///
    /// After a stop string completed, or after [`TextStream::finish`], nothing more is
    /// released.
    pub fn push(&mut self, bytes: &[u8]) -> Chunk<'_> {
        self.out.clear();
        if self.is_done() {
            return Chunk { text: "", stop: None };
        }
        self.bytes.extend_from_slice(bytes);
        self.decode(false);
        self.release(false)
    }

    /// Release everything held back: generation is over. An incomplete character at the
    /// end becomes U+FFFD.
    pub fn finish(&mut self) -> Chunk<'_> {
        self.out.clear();
        if self.is_done() {
            return Chunk { text: "", stop: None };
        }
        self.decode(true);
        self.finished = true;
        self.release(true)
    }

    /// The stop string that ended the stream, if one did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.map(|i| self.stop[i].as_str())
    }

    fn is_done(&self) -> bool {
        self.finished || self.stopped.is_some()
    }

    /// Move the decodable bytes into `held`. Unless `last`, an incomplete character at the
    /// end stays in `bytes` to be completed by the next token.
    fn decode(&mut self, last: bool) {
        let mut used = 0;
        for chunk in self.bytes.utf8_chunks() {
            self.held.push_str(chunk.valid());
            used += chunk.valid().len();
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let at_end = used + invalid.len() == self.bytes.len();
            let incomplete = matches!(std::str::from_utf8(invalid), Err(e) if e.error_len().is_none());
            if at_end && incomplete && !last {
                break;
            }
            self.held.push('\u{FFFD}');
            used += invalid.len();
        }
        self.bytes.drain(..used);
    }

    /// Move text from `held` to `out`: up to a completed stop string, else all that cannot
    /// start one (everything when `last`).
    fn release(&mut self, last: bool) -> Chunk<'_> {
        // Every occurrence found here ends in the newest text: an older one would have
        // been found by an earlier call. So the earliest end is the first to complete.
        let mut hit: Option<(usize, usize, usize)> = None;
        for (i, s) in self.stop.iter().enumerate() {
            if let Some(start) = self.held.find(s.as_str()) {
                let key = (start + s.len(), start, i);
                if hit.is_none_or(|h| (key.0, key.1) < (h.0, h.1)) {
                    hit = Some(key);
                }
            }
        }
        if let Some((_, start, i)) = hit {
            self.out.push_str(&self.held[..start]);
            self.held.clear();
            self.stopped = Some(i);
            return Chunk { text: &self.out, stop: Some(&self.stop[i]) };
        }
        let keep_from = if last { self.held.len() } else { self.holdback_start() };
        self.out.push_str(&self.held[..keep_from]);
        self.held.drain(..keep_from);
        Chunk { text: &self.out, stop: None }
    }

    /// Where the longest suffix of `held` that is a proper prefix of a stop string begins.
    fn holdback_start(&self) -> usize {
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let from = self.held.len().saturating_sub(longest.saturating_sub(1));
        (from..self.held.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| self.stop.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Push `pieces`, then finish; the text of every call concatenated, and the stop.
    fn run(stream: &mut TextStream, pieces: &[&[u8]]) -> (String, Option<String>) {
        let mut text = String::new();
        let mut stop = None;
        for p in pieces {
            let c = stream.push(p);
            text.push_str(c.text);
            if let Some(s) = c.stop {
                assert!(stop.is_none(), "a stop is reported once");
                stop = Some(s.to_string());
            }
        }
        let c = stream.finish();
        text.push_str(c.text);
        if let Some(s) = c.stop {
            stop = Some(s.to_string());
        }
        (text, stop)
    }

    /// Split `bytes` at the given positions (taken modulo its length + 1).
    fn split(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort();
        let mut pieces = Vec::new();
        let mut at = 0;
        for c in cuts.into_iter().chain([bytes.len()]) {
            pieces.push(bytes[at..c].to_vec());
            at = c;
        }
        pieces
    }

    fn run_split(stop: &[String], bytes: &[u8], cuts: &[usize]) -> (String, Option<String>) {
        let pieces = split(bytes, cuts);
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        run(&mut TextStream::new(stop), &refs)
    }

    #[test]
    fn a_character_split_across_tokens_waits_for_its_last_byte() {
        let mut s = TextStream::default();
        let e = "é".as_bytes();
        assert_eq!(s.push(b"caf").text, "caf");
        assert_eq!(s.push(&e[..1]).text, "");
        assert_eq!(s.push(&e[1..]).text, "é");
        assert_eq!(s.finish().text, "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = TextStream::default();
        // 0xFF can never start a character; 0xE2 0x82 is a valid start that 'A' breaks.
        assert_eq!(s.push(b"a\xFFb").text, "a\u{FFFD}b");
        assert_eq!(s.push(b"\xE2\x82").text, "");
        assert_eq!(s.push(b"A").text, "\u{FFFD}A");
        // An incomplete character at the very end is flushed by `finish`.
        assert_eq!(s.push(b"\xF0\x9F").text, "");
        assert_eq!(s.finish().text, "\u{FFFD}");
    }

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let mut s = TextStream::new(&strings(&["</s>"]));
        assert_eq!(s.push(b"Hello <").text, "Hello ");
        assert_eq!(s.push(b"/").text, "");
        // "</b" cannot start "</s>": released.
        assert_eq!(s.push(b"b").text, "</b");
        assert_eq!(s.finish().text, "");

        let mut s = TextStream::new(&strings(&["</s>"]));
        assert_eq!(s.push(b"x </").text, "x ");
        let c = s.push(b"s> more");
        assert_eq!((c.text, c.stop), ("", Some("</s>")));
        assert_eq!(s.stopped(), Some("</s>"));
        assert_eq!(s.push(b"later").text, "");
        assert_eq!(s.finish(), Chunk { text: "", stop: None });
    }

    #[test]
    fn held_back_text_is_flushed_by_finish() {
        let mut s = TextStream::new(&strings(&["STOP"]));
        assert_eq!(s.push(b"ab ST").text, "ab ");
        assert_eq!(s.finish().text, "ST");
    }

    #[test]
    fn the_stop_string_completing_first_wins() {
        let stop = strings(&["abcd", "c"]);
        assert_eq!(run(&mut TextStream::new(&stop), &[b"abcd"]).0, "ab");
        // Same end: the longer one (earlier start).
        let stop = strings(&["bc", "abc"]);
        let (text, hit) = run(&mut TextStream::new(&stop), &[b"x", b"ab", b"cd"]);
        assert_eq!((text.as_str(), hit.as_deref()), ("x", Some("abc")));
    }

    #[test]
    fn stop_strings_across_a_split_character() {
        let stop = strings(&["é!"]);
        let bytes = "café! no".as_bytes();
        let (text, hit) = run_split(&stop, bytes, &[4, 5]);
        assert_eq!((text.as_str(), hit.as_deref()), ("caf", Some("é!")));
    }

    #[test]
    fn empty_stop_strings_are_rejected() {
        let config = StopConfig { max_tokens: 5, stop: strings(&["a", ""]) };
        assert!(
            matches!(config.validate(), Err(Error::InvalidArgument { message: m, .. }) if m.contains("1"))
        );
        assert!(StopConfig::default().validate().is_ok());
        // The stream itself ignores them rather than stopping at once.
        assert_eq!(run(&mut TextStream::new(&strings(&[""])), &[b"ab"]).0, "ab");
    }

    #[test]
    fn stop_reasons_are_named_in_snake_case() {
        assert_eq!(StopReason::ContextFull.to_string(), "context_full");
        assert_eq!(StopReason::StopString.as_str(), "stop_string");
    }

    /// The reference: the first stop string to complete in the whole text.
    fn cut_at_first_stop(text: &str, stop: &[String]) -> (String, Option<String>) {
        stop.iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at, s)))
            .min_by_key(|h| (h.0, h.1))
            .map_or((text.to_string(), None), |(_, at, s)| (text[..at].to_string(), Some(s.clone())))
    }

    proptest! {
        #[test]
        fn without_stop_strings_the_output_is_the_input(
            text in any::<String>(),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            prop_assert_eq!(run_split(&[], text.as_bytes(), &cuts), (text, None));
        }

        #[test]
        fn arbitrary_bytes_come_out_as_lossy_utf8(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let want = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert_eq!(run_split(&[], &bytes, &cuts).0, want);
        }

        #[test]
        fn the_output_ends_before_the_first_stop_string(
            // A small alphabet, multi-byte characters included, so that stop strings occur.
            text in "[abé😀]{0,40}",
            stop in prop::collection::vec("[abé]{1,3}", 1..3),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            prop_assert_eq!(
                run_split(&stop, text.as_bytes(), &cuts),
                cut_at_first_stop(&text, &stop)
            );
        }
    }
}
