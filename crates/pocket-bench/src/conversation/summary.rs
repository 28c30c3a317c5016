//! What replayed conversations add up to: per turn, whether a mode's answer equals the
//! reference's; per conversation, how the time to first token grows from the first turn to the
//! last and how much of the prompt was reused; per mode, medians of those.

use std::collections::BTreeMap;

use crate::median::median;
use crate::results::{ConversationModeSummary, ConversationSummary, TurnRecord};
use crate::summary::diverges_at;

/// Set every turn's `identical_to_vanilla` and `diverges_at` by comparing its output (the
/// token ids in `outputs`, one per turn) with the `reference` mode's for the same
/// conversation, round and turn; both stay `None` where the reference has no such turn.
pub fn compare_turns(turns: &mut [TurnRecord], outputs: &[Vec<u32>], reference: &str) {
    let at = |t: &TurnRecord| (t.conversation_id.clone(), t.round, t.turn);
    let references: BTreeMap<_, usize> =
        turns.iter().enumerate().filter(|(_, t)| t.mode == reference).map(|(i, t)| (at(t), i)).collect();
    for i in 0..turns.len().min(outputs.len()) {
        let Some(&r) = references.get(&at(&turns[i])) else {
            continue;
        };
        let Some(reference) = outputs.get(r) else {
            continue;
        };
        let diverges = diverges_at(&outputs[i], reference);
        turns[i].identical_to_vanilla = Some(diverges.is_none());
        turns[i].diverges_at = diverges;
    }
}

/// One replay of a conversation: its mode, id and round.
type Replay<'a> = (&'a str, &'a str, usize);

/// `part / whole`; `None` when `whole` is not positive.
pub fn share(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

/// Summarise `turns`: one [`ConversationSummary`] per conversation, mode and round (in the
/// order they first ran), and one [`ConversationModeSummary`] for each of `modes` (a mode
/// without turns gets an empty one).
pub fn summarize(
    turns: &[TurnRecord],
    modes: &[String],
) -> (Vec<ConversationSummary>, BTreeMap<String, ConversationModeSummary>) {
    let mut groups: Vec<(Replay<'_>, Vec<&TurnRecord>)> = Vec::new();
    for t in turns {
        let key = (t.mode.as_str(), t.conversation_id.as_str(), t.round);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push(t),
            None => groups.push((key, vec![t])),
        }
    }
    let by_conversation: Vec<ConversationSummary> =
        groups.into_iter().map(|((mode, id, round), group)| conversation(mode, id, round, group)).collect();
    let summary = modes
        .iter()
        .map(|mode| {
            let own: Vec<&TurnRecord> = turns.iter().filter(|t| t.mode == *mode).collect();
            let conversations: Vec<&ConversationSummary> =
                by_conversation.iter().filter(|c| c.mode == *mode).collect();
            let prompt: usize = own.iter().map(|t| t.prompt_tokens).sum();
            let cached: usize = own.iter().map(|t| t.cached_tokens).sum();
            let s = ConversationModeSummary {
                conversations: conversations.len(),
                turns: own.len(),
                reused_share: share(cached as f64, prompt as f64),
                ttft_last_over_first_median: median(
                    conversations.iter().filter_map(|c| c.ttft_last_over_first),
                ),
                ttft_last_over_second_median: median(
                    conversations.iter().filter_map(|c| c.ttft_last_over_second),
                ),
                ttft_ms_median: median(own.iter().map(|t| t.ttft_ms)),
                decode_tok_per_s_median: median(own.iter().filter_map(|t| t.decode_tok_per_s)),
                all_identical: all_identical(&own),
            };
            (mode.clone(), s)
        })
        .collect();
    (by_conversation, summary)
}

/// One conversation in one mode and round, from its turns (in any order).
fn conversation(mode: &str, id: &str, round: usize, mut turns: Vec<&TurnRecord>) -> ConversationSummary {
    turns.sort_by_key(|t| t.turn);
    let prompt: usize = turns.iter().map(|t| t.prompt_tokens).sum();
    let cached: usize = turns.iter().map(|t| t.cached_tokens).sum();
    let last = turns.last().map_or(0.0, |t| t.ttft_ms);
    // Over the n-th turn's time: only when the last turn is a later one than it.
    let last_over = |n: usize| -> Option<f64> {
        if turns.len() <= n + 1 {
            return None;
        }
        share(last, turns[n].ttft_ms)
    };
    ConversationSummary {
        mode: mode.to_owned(),
        conversation_id: id.to_owned(),
        round,
        turns: turns.len(),
        prompt_tokens: prompt,
        cached_tokens: cached,
        reused_share: share(cached as f64, prompt as f64),
        ttft_last_over_first: last_over(0),
        ttft_last_over_second: last_over(1),
        all_identical: all_identical(&turns),
    }
}

/// Whether every turn is identical to the reference's; `None` for no turns or when one of
/// them was not compared.
fn all_identical(turns: &[&TurnRecord]) -> Option<bool> {
    let identical: Option<Vec<bool>> = turns.iter().map(|t| t.identical_to_vanilla).collect();
    identical.filter(|i| !i.is_empty()).map(|i| i.iter().all(|&x| x))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A turn with the fields the summary reads; the rest zero.
    pub(crate) fn turn(
        mode: &str,
        id: &str,
        turn: usize,
        prompt: usize,
        cached: usize,
        ttft_ms: f64,
    ) -> TurnRecord {
        TurnRecord {
            mode: mode.into(),
            conversation_id: id.into(),
            round: 0,
            turn,
            prompt_tokens: prompt,
            cached_tokens: cached,
            generated_tokens: 8,
            ttft_ms,
            prefill_ms: ttft_ms / 2.0,
            decode_tok_per_s: Some(100.0 + turn as f64),
            output_sha256: String::new(),
            identical_to_vanilla: None,
            diverges_at: None,
        }
    }

    /// Two conversations of three turns in two modes, as the replay runs them (modes
    /// alternating per turn): without the cache the time to first token grows with the
    /// history; with it, it stays about flat.
    pub(crate) fn sample_turns() -> Vec<TurnRecord> {
        let mut turns = Vec::new();
        for (id, scale) in [("a", 1.0), ("b", 2.0)] {
            for (n, prompt, cached, no_cache_ms, cache_ms) in
                [(1, 40, 30, 100.0, 100.0), (2, 100, 90, 200.0, 50.0), (3, 160, 150, 300.0, 60.0)]
            {
                // Turn 1 of the cache mode starts cold: nothing to continue.
                let cached = if n == 1 { 0 } else { cached };
                turns.push(turn("no-cache", id, n, prompt, 0, no_cache_ms * scale));
                turns.push(turn("cache", id, n, prompt, cached, cache_ms * scale));
            }
        }
        turns
    }

    fn modes() -> Vec<String> {
        vec!["no-cache".into(), "cache".into()]
    }

    #[test]
    fn ratios_and_reuse_per_conversation() {
        let (by_conversation, _) = summarize(&sample_turns(), &modes());
        let keys: Vec<(&str, &str)> =
            by_conversation.iter().map(|c| (c.mode.as_str(), c.conversation_id.as_str())).collect();
        assert_eq!(keys, [("no-cache", "a"), ("cache", "a"), ("no-cache", "b"), ("cache", "b")]);

        let no_cache = &by_conversation[0];
        assert_eq!((no_cache.turns, no_cache.prompt_tokens, no_cache.cached_tokens), (3, 300, 0));
        assert_eq!(no_cache.reused_share, Some(0.0));
        assert_eq!(no_cache.ttft_last_over_first, Some(3.0));
        assert_eq!(no_cache.ttft_last_over_second, Some(1.5));

        let cache = &by_conversation[1];
        // 0 + 90 + 150 of 40 + 100 + 160 prompt tokens.
        assert_eq!((cache.prompt_tokens, cache.cached_tokens), (300, 240));
        assert_eq!(cache.reused_share, Some(0.8));
        assert_eq!(cache.ttft_last_over_first, Some(0.6));
        assert_eq!(cache.ttft_last_over_second, Some(1.2));
        // Times doubled in conversation b: the same ratios.
        assert_eq!(by_conversation[3].ttft_last_over_first, Some(0.6));
        assert_eq!(cache.all_identical, None);
    }

    #[test]
    fn mode_summaries_take_medians_over_conversations_and_reuse_over_all_turns() {
        let mut turns = sample_turns();
        // Conversation b's last turn in the cache mode waits longer: 240 ms over 200 and 100.
        turns[11].ttft_ms = 240.0;
        let (_, summary) = summarize(&turns, &modes());
        let cache = &summary["cache"];
        assert_eq!((cache.conversations, cache.turns), (2, 6));
        assert_eq!(cache.reused_share, Some(480.0 / 600.0));
        // Per conversation: 60/100 and 240/200 → median 0.9; 60/50 and 240/100 → 1.8.
        assert_eq!(cache.ttft_last_over_first_median, Some((0.6 + 1.2) / 2.0));
        assert_eq!(cache.ttft_last_over_second_median, Some((1.2 + 2.4) / 2.0));
        // TTFTs 100, 50, 60, 200, 100, 240 → (100 + 100) / 2.
        assert_eq!(cache.ttft_ms_median, Some(100.0));
        assert_eq!(cache.decode_tok_per_s_median, Some(102.0));
        let no_cache = &summary["no-cache"];
        assert_eq!(no_cache.reused_share, Some(0.0));
        assert_eq!(no_cache.ttft_last_over_first_median, Some(3.0));
        assert_eq!(no_cache.ttft_last_over_second_median, Some(1.5));
    }

    #[test]
    fn short_conversations_and_zero_times_leave_ratios_out() {
        let one = vec![turn("cache", "a", 1, 10, 0, 50.0)];
        let (c, s) = summarize(&one, &["cache".into(), "no-cache".into()]);
        assert_eq!((c[0].ttft_last_over_first, c[0].ttft_last_over_second), (None, None));
        assert_eq!(s["cache"].ttft_last_over_first_median, None);
        // A mode that did not run: an empty summary.
        assert_eq!((s["no-cache"].turns, s["no-cache"].reused_share), (0, None));

        // Two turns: last over first, but no second turn before the last.
        let two = vec![turn("cache", "a", 2, 20, 10, 40.0), turn("cache", "a", 1, 10, 0, 80.0)];
        let (c, _) = summarize(&two, &["cache".into()]);
        assert_eq!((c[0].ttft_last_over_first, c[0].ttft_last_over_second), (Some(0.5), None));

        let zero = vec![turn("cache", "a", 1, 0, 0, 0.0), turn("cache", "a", 2, 0, 0, 10.0)];
        let (c, _) = summarize(&zero, &["cache".into()]);
        assert_eq!((c[0].ttft_last_over_first, c[0].reused_share), (None, None));
        assert_eq!(share(1.0, 4.0), Some(0.25));
    }

    #[test]
    fn turns_are_compared_with_the_reference_at_the_same_turn() {
        let mut turns = sample_turns();
        let mut outputs = vec![vec![1, 2, 3]; turns.len()];
        // The cache mode's answer to conversation a's turn 2 leaves the reference's at token 1.
        outputs[3] = vec![1, 9, 3];
        compare_turns(&mut turns, &outputs, "no-cache");
        assert!(turns.iter().all(|t| t.identical_to_vanilla.is_some()));
        assert_eq!((turns[3].identical_to_vanilla, turns[3].diverges_at), (Some(false), Some(1)));
        assert_eq!((turns[2].identical_to_vanilla, turns[2].diverges_at), (Some(true), None));
        let (by_conversation, summary) = summarize(&turns, &modes());
        assert_eq!(by_conversation[1].all_identical, Some(false));
        assert_eq!(by_conversation[3].all_identical, Some(true));
        assert_eq!(summary["cache"].all_identical, Some(false));
        assert_eq!(summary["no-cache"].all_identical, Some(true));

        // Without the reference nothing is compared.
        let mut alone = vec![turn("cache", "a", 1, 10, 0, 5.0)];
        compare_turns(&mut alone, &[vec![1]], "no-cache");
        assert_eq!(alone[0].identical_to_vanilla, None);
    }
}
