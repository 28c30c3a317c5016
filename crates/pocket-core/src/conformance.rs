//! The conformance suite of the engine boundary: what every engine's [`Model`] and
//! [`Session`] must do for the generation loop, speculation and the memory budget to work on
//! it. Each engine runs it from its own tests with [`conformance_tests!`](crate::conformance_tests)
//! on a real model of its own. (It is compiled into the library, small as it is, so that
//! building the tests does not build pocket-core and everything above it a second time with
//! other features.)
//!
//! ```ignore
//! fn subject() -> pocket_core::conformance::Subject { /* a loaded model, a prompt */ }
//! pocket_core::conformance_tests!(smollm2, subject);
//! ```

use crate::spec::SpecMode;
use crate::{Error, LayerPlan, Model, ModelKind, Rows, Session, SessionConfig, Token, argmax};

/// What the suite runs on.
pub struct Subject {
    /// A loaded model.
    pub model: Box<dyn Model>,
    /// At least 8 tokens: a prompt (decoders) or a source text (encoder-decoders).
    pub prompt: Vec<Token>,
    /// The sessions' settings; its context must hold the prompt and 32 tokens more.
    pub config: SessionConfig,
    /// How far logits of the same rows may differ between passes of different shapes (a pass
    /// of n tokens against n passes of one): 0 where the engine's kernels are batch-invariant.
    pub tolerance: f32,
    /// Held for the test's duration (an engine's tests may run one at a time).
    pub serial: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Subject {
    fn seq2seq(&self) -> bool {
        self.model.info().kind == ModelKind::EncoderDecoder
    }

    /// A new session, its source encoded for an encoder-decoder model.
    fn session(&self) -> Box<dyn Session> {
        let mut s = self.model.session(&self.config).expect("a session");
        if self.seq2seq() {
            s.encode(&self.prompt).expect("the source encodes");
        }
        s
    }

    /// The tokens decoded first: the prompt, or an encoder-decoder's decoder start followed
    /// by source tokens (any valid ids do as a teacher-forced decoder input).
    fn head(&self) -> Vec<Token> {
        match self.model.decoder_start() {
            Some(start) if self.seq2seq() => {
                std::iter::once(start).chain(self.prompt.iter().copied()).take(8).collect()
            }
            _ => self.prompt.clone(),
        }
    }

    /// `n` tokens that follow the head, taken from the prompt (valid ids of this vocabulary).
    fn more(&self, n: usize, skip: usize) -> Vec<Token> {
        self.prompt.iter().copied().cycle().skip(skip).take(n).collect()
    }

    fn full(&self) -> LayerPlan {
        LayerPlan::full(self.model.info().n_layers).expect("a full plan")
    }
}

/// The rows of `logits`, copied.
fn rows(logits: &crate::Logits<'_>) -> Vec<Vec<f32>> {
    (0..logits.rows()).map(|i| logits.row(i).to_vec()).collect()
}

fn assert_close(what: &str, a: &[Vec<f32>], b: &[Vec<f32>], tolerance: f32) {
    assert_eq!(a.len(), b.len(), "{what}: {} rows against {}", a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(argmax(x), argmax(y), "{what}: row {i} picks another token");
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst <= tolerance, "{what}: row {i} differs by {worst} (tolerance {tolerance})");
    }
}

/// Truncating a session and decoding gives what a fresh session decoding the same tokens
/// gives, bit for bit (the passes have the same shapes).
pub fn truncate_then_decode_equals_a_fresh_decode(s: &Subject) {
    let plan = s.full();
    let head = s.head();
    let (wrong, right) = (s.more(5, 1), s.more(4, 3));
    let mut a = s.session();
    a.decode(&head, &plan, Rows::None).unwrap();
    for t in &wrong {
        a.decode(&[*t], &plan, Rows::Last).unwrap();
    }
    a.truncate(head.len()).unwrap();
    assert_eq!(a.len(), head.len());
    assert_eq!(a.tokens(), &head[..]);
    let after = rows(&a.decode(&right, &plan, Rows::Tail(right.len())).unwrap());

    let mut b = s.session();
    b.decode(&head, &plan, Rows::None).unwrap();
    let fresh = rows(&b.decode(&right, &plan, Rows::Tail(right.len())).unwrap());
    assert_close("truncate then decode against a fresh session", &after, &fresh, 0.0);
}

/// `Rows::None` returns no rows and still fills the session, `Rows::Last` is the last row of
/// `Rows::Tail(n)`, `Rows::Tail(n)` holds the pass's last n rows in order (each what decoding
/// its token alone gives, within the tolerance), and more rows than tokens is refused.
pub fn rows_select_the_tail_of_the_pass(s: &Subject) {
    let plan = s.full();
    let head = s.head();
    let n_vocab = s.model.info().n_vocab;
    let (first, rest) = head.split_at(head.len() - 4);

    let mut a = s.session();
    let none = a.decode(first, &plan, Rows::None).unwrap();
    assert_eq!(none.rows(), 0);
    assert_eq!(a.len(), first.len());
    let tail = rows(&a.decode(rest, &plan, Rows::Tail(rest.len())).unwrap());
    assert_eq!(tail.len(), rest.len());
    assert!(tail.iter().all(|r| r.len() == n_vocab));

    let mut b = s.session();
    b.decode(first, &plan, Rows::None).unwrap();
    let last = rows(&b.decode(rest, &plan, Rows::Last).unwrap());
    assert_close(
        "Rows::Last against the last row of Rows::Tail",
        &last,
        &tail[tail.len() - 1..],
        s.tolerance,
    );

    let mut c = s.session();
    c.decode(first, &plan, Rows::None).unwrap();
    let mut one_by_one = Vec::new();
    for t in rest {
        one_by_one.extend(rows(&c.decode(&[*t], &plan, Rows::Last).unwrap()));
    }
    assert_close("Rows::Tail against one token a pass", &tail, &one_by_one, s.tolerance);

    let mut d = s.session();
    assert!(matches!(d.decode(rest, &plan, Rows::Tail(rest.len() + 1)), Err(Error::InvalidArgument { .. })));
    assert_eq!(d.len(), 0, "a refused decode holds nothing");
}

/// What a session holds stays within what [`Model::footprint`] predicted for it, and its KV
/// cache within the footprint's KV for the tokens held (and what it sets aside at a fixed
/// size).
pub fn memory_stays_within_the_footprint(s: &Subject) {
    let plan = s.full();
    let footprint = s.model.footprint(&s.config).unwrap();
    let mut a = s.session();
    a.decode(&s.head(), &plan, Rows::Last).unwrap();
    for t in s.more(12, 2) {
        a.decode(&[t], &plan, Rows::Last).unwrap();
        let held = a.len() as u64;
        let kv = footprint.kv_bytes(held.max(s.prompt.len() as u64));
        // An engine may hold part of its cache at a fixed size (a full-precision window over
        // the newest tokens) and count that with its compute, but no more than that.
        let kv_and_fixed = kv + footprint.compute_bytes;
        assert!(
            a.kv_bytes() <= kv_and_fixed,
            "KV {} over the footprint's {kv_and_fixed} for {held} tokens",
            a.kv_bytes()
        );
        let most = kv + footprint.compute_bytes + footprint.logits_row_bytes * s.config.max_rows as u64;
        assert!(a.memory() <= most, "the session holds {} over the {most} predicted", a.memory());
        assert!(a.kv_bytes() <= a.memory());
    }
    assert!(a.memory() > 0);
}

/// Positions decoded with a partial plan are recomputed by the next full-plan pass, whose
/// rows are then those of decoding everything with the full plan; an engine that does not
/// skip layers refuses a partial plan and keeps what it held.
pub fn partial_plans_are_recomputed_or_refused(s: &Subject) {
    let full = s.full();
    let n_layers = s.model.info().n_layers;
    let head = s.head();
    let draft = s.more(3, 5);
    let Ok(partial) = LayerPlan::full(n_layers).and_then(|p| p.without(n_layers / 2..n_layers / 2 + 1))
    else {
        return; // a one-layer model has no partial plan that runs a layer
    };
    let mut a = s.session();
    a.decode(&head, &full, Rows::None).unwrap();
    if !s.model.drafters().contains(&SpecMode::LayerSkip) {
        assert!(a.decode(&draft, &partial, Rows::Last).is_err(), "a partial plan must be refused");
        assert_eq!(a.len(), head.len(), "a refused decode holds nothing more");
        return;
    }
    for t in &draft {
        a.decode(&[*t], &partial, Rows::Last).unwrap();
    }
    let next = s.more(1, 9);
    let verified = rows(&a.decode(&next, &full, Rows::Tail(draft.len() + 1)).unwrap());

    let mut b = s.session();
    b.decode(&head, &full, Rows::None).unwrap();
    let all: Vec<Token> = draft.iter().chain(&next).copied().collect();
    let reference = rows(&b.decode(&all, &full, Rows::Tail(all.len())).unwrap());
    assert_close("recomputed partial positions against the full plan", &verified, &reference, 0.0);
}

/// A verification pass over rejected drafts, truncated back to the accepted ones, leaves the
/// session where plain decoding would have: greedy decoding from it continues with the same
/// tokens.
pub fn rejected_drafts_roll_back(s: &Subject) {
    let plan = s.full();
    let head = s.head();
    let steps = 6;
    // Plain greedy decoding.
    let mut plain = s.session();
    let mut next = argmax(plain.decode(&head, &plan, Rows::Last).unwrap().last());
    let mut expected = vec![next];
    for _ in 0..steps {
        next = argmax(plain.decode(&[next], &plan, Rows::Last).unwrap().last());
        expected.push(next);
    }
    // The same with a wrong draft of 3 after every token: verify, keep only the pending one.
    let mut spec = s.session();
    let mut next = argmax(spec.decode(&head, &plan, Rows::Last).unwrap().last());
    let mut got = vec![next];
    let wrong = s.more(3, 7);
    for _ in 0..steps {
        let base = spec.len();
        let batch: Vec<Token> = std::iter::once(next).chain(wrong.iter().copied()).collect();
        let logits = spec.decode(&batch, &plan, Rows::Tail(batch.len())).unwrap();
        next = argmax(logits.row(0));
        spec.truncate(base + 1).unwrap();
        got.push(next);
    }
    assert_eq!(got, expected, "decoding after rolled-back drafts");
}

/// Bad calls are refused with an error and leave the session as it was: no tokens, a token
/// outside the vocabulary, more than the context, a plan for another model, truncating past
/// the end; and `encode` on a decoder.
pub fn bad_calls_are_refused_and_change_nothing(s: &Subject) {
    let plan = s.full();
    let head = s.head();
    let n_vocab = s.model.info().n_vocab as Token;
    let mut a = s.session();
    a.decode(&head, &plan, Rows::None).unwrap();
    let held = a.len();
    assert!(a.decode(&[], &plan, Rows::Last).is_err(), "no tokens");
    assert!(a.decode(&[n_vocab], &plan, Rows::Last).is_err(), "a token outside the vocabulary");
    let too_many = vec![head[0]; s.config.n_ctx + 1 - held];
    assert!(matches!(a.decode(&too_many, &plan, Rows::Last), Err(Error::ContextOverflow { .. })));
    let other = LayerPlan::full(s.model.info().n_layers + 1).unwrap();
    assert!(a.decode(&head[..1], &other, Rows::Last).is_err(), "a plan for another model");
    assert!(a.truncate(held + 1).is_err(), "truncating past the end");
    assert_eq!(a.len(), held, "refused calls hold nothing more");
    assert_eq!(a.tokens(), &head[..]);
    if !s.seq2seq() {
        assert!(a.encode(&head).is_err(), "a decoder has no encoder");
    }
    // The session still works, as a fresh one does.
    let more = s.more(2, 4);
    let after = rows(&a.decode(&more, &plan, Rows::Tail(2)).unwrap());
    let mut b = s.session();
    b.decode(&head, &plan, Rows::None).unwrap();
    let fresh = rows(&b.decode(&more, &plan, Rows::Tail(2)).unwrap());
    assert_close("after refused calls against a fresh session", &after, &fresh, 0.0);
}

/// What [`Session::save`] copies out, [`Session::restore`] puts into a new session: restoring
/// a prefix of it and decoding on gives bit for bit what the saved session gives after
/// truncating to that prefix. Restoring into a session that holds tokens, more tokens than
/// were saved, or a state of another KV type is refused. (Engines that cannot save skip it.)
pub fn a_restored_session_continues_as_the_saved_one(s: &Subject) {
    let plan = s.full();
    let head = s.head();
    let mut a = s.session();
    a.decode(&head, &plan, Rows::None).unwrap();
    for t in s.more(4, 2) {
        a.decode(&[t], &plan, Rows::Last).unwrap();
    }
    let Some(saved) = a.save().unwrap() else { return };
    if s.seq2seq() {
        return encoded_source_is_restored_whole(s, &saved);
    }
    assert_eq!(saved.tokens, a.tokens(), "the state of every token held");
    let len = head.len() + 2;
    let next = s.more(3, 5);

    let mut b = s.model.session(&s.config).unwrap();
    b.restore(&saved, len).unwrap();
    assert_eq!(b.tokens(), &saved.tokens[..len]);
    let restored = rows(&b.decode(&next, &plan, Rows::Tail(next.len())).unwrap());
    a.truncate(len).unwrap();
    let original = rows(&a.decode(&next, &plan, Rows::Tail(next.len())).unwrap());
    assert_close("a restored session against the saved one", &restored, &original, 0.0);

    assert!(b.restore(&saved, 1).is_err(), "restoring into a session holding tokens");
    let mut c = s.model.session(&s.config).unwrap();
    assert!(c.restore(&saved, saved.tokens.len() + 1).is_err(), "more tokens than were saved");
    let other = crate::SavedState {
        kv: if saved.kv == crate::KvType::F16 { crate::KvType::Q8_0 } else { crate::KvType::F16 },
        ..saved.clone()
    };
    assert!(c.restore(&other, 1).is_err(), "a state of another KV type");
    assert!(c.is_empty(), "refused restores hold nothing");
}

/// An encoder-decoder's saved state is its encoded source: restored whole, it decodes as a
/// session that ran the encoder; a part of it is refused.
fn encoded_source_is_restored_whole(s: &Subject, saved: &crate::SavedState) {
    let (plan, head) = (s.full(), s.head());
    assert_eq!(saved.tokens, s.prompt, "the source");
    let mut b = s.model.session(&s.config).unwrap();
    b.restore(saved, saved.tokens.len()).unwrap();
    let restored = rows(&b.decode(&head, &plan, Rows::Tail(head.len())).unwrap());
    let fresh = rows(&s.session().decode(&head, &plan, Rows::Tail(head.len())).unwrap());
    assert_close("a restored source against an encoded one", &restored, &fresh, 0.0);
    assert!(b.restore(saved, saved.tokens.len()).is_err(), "restoring into a session holding tokens");
    let mut c = s.model.session(&s.config).unwrap();
    assert!(c.restore(saved, saved.tokens.len() - 1).is_err(), "a part of the source");
}

/// The conformance suite as tests: `conformance_tests!(name, subject)` in an engine's test
/// file makes a module `name` of tests, where `subject` is a function returning a
/// [`Subject`](crate::conformance::Subject).
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $subject:ident) => {
        mod $name {
            #[test]
            fn truncate_then_decode_equals_a_fresh_decode() {
                $crate::conformance::truncate_then_decode_equals_a_fresh_decode(&super::$subject());
            }
            #[test]
            fn rows_select_the_tail_of_the_pass() {
                $crate::conformance::rows_select_the_tail_of_the_pass(&super::$subject());
            }
            #[test]
            fn memory_stays_within_the_footprint() {
                $crate::conformance::memory_stays_within_the_footprint(&super::$subject());
            }
            #[test]
            fn partial_plans_are_recomputed_or_refused() {
                $crate::conformance::partial_plans_are_recomputed_or_refused(&super::$subject());
            }
            #[test]
            fn rejected_drafts_roll_back() {
                $crate::conformance::rejected_drafts_roll_back(&super::$subject());
            }
            #[test]
            fn a_restored_session_continues_as_the_saved_one() {
                $crate::conformance::a_restored_session_continues_as_the_saved_one(&super::$subject());
            }
            #[test]
            fn bad_calls_are_refused_and_change_nothing() {
                $crate::conformance::bad_calls_are_refused_and_change_nothing(&super::$subject());
            }
        }
    };
}
