//! The planner: what a session may hold under the budget, given up in a fixed order when it
//! cannot have everything it asked for (../shared/DESIGN.md, Memory): shorter drafts first,
//! then a drafter that needs no memory of its own instead of a draft model, then no
//! speculation, then a lower-bit KV cache; and when even the least of those does not fit, an
//! error naming the bytes needed and free.

use serde::{Deserialize, Serialize};

use super::Ledger;
use crate::spec::SpecMode;
use crate::{Error, Footprint, KvType, Result};

/// What the suffix automaton holds per token of prompt and output: the token, at most two
/// states of 16 bytes and three transitions in a hash map (about 24 bytes each with the map's
/// slack), rounded up.
pub const SUFFIX_BYTES_PER_TOKEN: u64 = 128;

/// What a draft model costs beside the target, as its engine predicts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DraftModelCosts {
    /// Its weights, where they are not already loaded and paid for (0 if they are).
    pub weights_bytes: u64,
    /// Its KV cache per token held.
    pub kv_bytes_per_token: u64,
    /// Its compute buffer.
    pub compute_bytes: u64,
}

/// What a session asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanRequest {
    /// Tokens it will hold: the prompt plus the most it may generate.
    pub tokens: usize,
    /// The KV type asked for.
    pub kv: KvType,
    /// The speculation asked for.
    pub spec: SpecMode,
    /// The longest draft asked for.
    pub max_draft: usize,
}

/// What a session is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// KV cache type.
    pub kv: KvType,
    /// Tokens the session may hold: the request's, plus the positions one verification
    /// writes past them (the draft window, K + 1).
    pub n_ctx: usize,
    /// Speculation.
    pub spec: SpecMode,
    /// Whether speculation may use the draft model (`draft`, or `auto` offered one).
    pub draft_model: bool,
    /// Longest draft (0 without speculation).
    pub max_draft: usize,
    /// Bytes the session is predicted to hold at its largest.
    pub bytes: u64,
    /// Bytes free in the budget when it was planned.
    pub available: u64,
    /// What was given up to fit, in the order it was given up (empty: nothing).
    pub degraded: Vec<String>,
}

/// Plan a session asking for `request` with what `ledger` has free, from what the engine
/// predicts: `by_kv` the target session's footprint for each KV type it offers, `draft` the
/// draft model's costs where there is one.
///
/// Errors: [`Error::OverBudget`] when even the least plan (no speculation, the lowest-bit KV
/// type offered) does not fit, naming its bytes; [`Error::InvalidArgument`] when the KV type
/// asked for is not offered, or `draft` speculation is asked for without a draft model.
pub fn plan(
    ledger: &Ledger,
    request: &PlanRequest,
    by_kv: &[(KvType, Footprint)],
    draft: Option<&DraftModelCosts>,
) -> Result<Plan> {
    let available = ledger.available();
    let start = KvType::ALL.iter().position(|&k| k == request.kv).unwrap_or(0);
    let kv_types: Vec<(KvType, &Footprint)> = KvType::ALL[start..]
        .iter()
        .filter_map(|&k| by_kv.iter().find(|(t, _)| *t == k).map(|(t, f)| (*t, f)))
        .collect();
    if kv_types.first().map(|(k, _)| *k) != Some(request.kv) {
        return Err(Error::invalid(format!("the engine offers no {} KV cache for this model", request.kv)));
    }
    if request.spec == SpecMode::Draft && draft.is_none() {
        return Err(Error::invalid("draft speculation needs a draft model"));
    }
    // The drafters to try, most wanted first: the one asked for, then without the draft
    // model's memory, then none.
    let mut drafters =
        vec![(request.spec, draft.is_some() && matches!(request.spec, SpecMode::Draft | SpecMode::Auto))];
    match request.spec {
        SpecMode::Draft => drafters.push((SpecMode::Suffix, false)),
        SpecMode::Auto if draft.is_some() => drafters.push((SpecMode::Auto, false)),
        _ => {}
    }
    if request.spec != SpecMode::Off {
        drafters.push((SpecMode::Off, false));
    }
    let mut least = None;
    for (ik, &(kv, footprint)) in kv_types.iter().enumerate() {
        for (id, &(spec, with_draft)) in drafters.iter().enumerate() {
            let mut k = if spec == SpecMode::Off { 0 } else { request.max_draft.max(1) };
            loop {
                let bytes =
                    session_bytes(request.tokens, footprint, spec, with_draft.then_some(draft).flatten(), k);
                if bytes <= available {
                    let mut degraded = Vec::new();
                    if k < request.max_draft && spec != SpecMode::Off {
                        degraded.push(format!("drafts shortened to {k} tokens"));
                    }
                    if id > 0 && spec != SpecMode::Off {
                        degraded.push(format!("{spec} without the draft model"));
                    }
                    if spec == SpecMode::Off && request.spec != SpecMode::Off {
                        degraded.push("no speculation".to_owned());
                    }
                    if ik > 0 {
                        degraded.push(format!("{kv} KV cache instead of {}", request.kv));
                    }
                    return Ok(Plan {
                        kv,
                        n_ctx: request.tokens + k + 1,
                        spec,
                        draft_model: with_draft,
                        max_draft: k,
                        bytes,
                        available,
                        degraded,
                    });
                }
                least = Some(bytes);
                if k <= 1 {
                    break;
                }
                k /= 2;
            }
        }
    }
    Err(Error::OverBudget {
        what: format!("a session of {} tokens", request.tokens),
        needed: least.unwrap_or(0),
        available,
        budget: ledger.budget(),
    })
}

/// Bytes a session of `tokens` tokens holds at its largest with `footprint`, speculating with
/// `spec` (and the draft model `draft`, if given) in drafts of up to `k`.
fn session_bytes(
    tokens: usize,
    footprint: &Footprint,
    spec: SpecMode,
    draft: Option<&DraftModelCosts>,
    k: usize,
) -> u64 {
    let held = (tokens + k + 1) as u64;
    let mut bytes =
        footprint.kv_bytes(held) + footprint.compute_bytes + footprint.logits_row_bytes * (k as u64 + 1);
    if matches!(spec, SpecMode::Suffix | SpecMode::Auto) {
        bytes += SUFFIX_BYTES_PER_TOKEN * tokens as u64;
    }
    if let Some(d) = draft {
        let blocks = footprint.kv_block_tokens.max(1);
        bytes += d.weights_bytes + held.div_ceil(blocks) * blocks * d.kv_bytes_per_token + d.compute_bytes;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn footprint(kv_bytes_per_token: u64) -> Footprint {
        Footprint {
            weights_anon_bytes: 0,
            weights_mapped_bytes: 100 * MIB,
            kv_bytes_per_token,
            kv_block_tokens: 64,
            compute_bytes: 10 * MIB,
            logits_row_bytes: 200_000,
        }
    }

    fn offered() -> Vec<(KvType, Footprint)> {
        vec![
            (KvType::F16, footprint(23040)),
            (KvType::Q8_0, footprint(12240)),
            (KvType::Q4_0, footprint(6480)),
        ]
    }

    fn draft() -> DraftModelCosts {
        DraftModelCosts { weights_bytes: 60 * MIB, kv_bytes_per_token: 12288, compute_bytes: 8 * MIB }
    }

    fn request(spec: SpecMode) -> PlanRequest {
        PlanRequest { tokens: 1000, kv: KvType::F16, spec, max_draft: 8 }
    }

    #[test]
    fn everything_asked_for_when_it_fits() {
        let p = plan(&Ledger::new(1 << 30), &request(SpecMode::Draft), &offered(), Some(&draft())).unwrap();
        assert_eq!(
            (p.kv, p.spec, p.draft_model, p.max_draft, p.n_ctx),
            (KvType::F16, SpecMode::Draft, true, 8, 1009)
        );
        assert!(p.degraded.is_empty());
        assert!(p.bytes > 60 * MIB + 10 * MIB + 8 * MIB);
    }

    #[test]
    fn degrades_in_the_designed_order_as_the_budget_shrinks() {
        let req = request(SpecMode::Draft);
        let d = draft();
        // Walk the budget down and record each change of plan: the order must be shorter
        // drafts, then no draft model, then no speculation, then lower-bit KV, then an error.
        let mut seen: Vec<(SpecMode, bool, KvType, usize)> = Vec::new();
        let mut budget = 200 * MIB;
        loop {
            match plan(&Ledger::new(budget), &req, &offered(), Some(&d)) {
                Ok(p) => {
                    assert!(p.bytes <= budget);
                    let key = (p.spec, p.draft_model, p.kv, p.max_draft);
                    if seen.last() != Some(&key) {
                        seen.push(key);
                    }
                }
                Err(e) => {
                    assert!(matches!(e, Error::OverBudget { .. }), "{e}");
                    break;
                }
            }
            budget -= MIB / 4;
        }
        let rank = |&(spec, with_draft, kv, _): &(SpecMode, bool, KvType, usize)| {
            let drafter = if with_draft {
                0
            } else if spec != SpecMode::Off {
                1
            } else {
                2
            };
            (KvType::ALL.iter().position(|&k| k == kv).unwrap(), drafter)
        };
        for w in seen.windows(2) {
            let (a, b) = (rank(&w[0]), rank(&w[1]));
            assert!(a < b || (a == b && w[1].3 < w[0].3), "{:?} came after {:?}", w[1], w[0]);
        }
        assert_eq!(seen.first(), Some(&(SpecMode::Draft, true, KvType::F16, 8)));
        assert_eq!(seen.last().map(|s| (s.0, s.2)), Some((SpecMode::Off, KvType::Q4_0)));
        assert!(seen.contains(&(SpecMode::Suffix, false, KvType::F16, 8)), "{seen:?}");
    }

    #[test]
    fn a_session_that_cannot_fit_names_the_least_it_needs() {
        let ledger = Ledger::new(8 * MIB);
        let _held = ledger.reserve(3 * MIB, "weights").unwrap();
        let e = plan(&ledger, &request(SpecMode::Off), &offered(), None).unwrap_err();
        let Error::OverBudget { needed, available, budget, .. } = e else { panic!("{e}") };
        assert_eq!((available, budget), (5 * MIB, 8 * MIB));
        // The least plan: q4_0 KV for 1001 positions (16 blocks of 64), the compute buffer, one
        // logits row.
        assert_eq!(needed, 16 * 64 * 6480 + 10 * MIB + 200_000);
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        assert!(matches!(
            plan(&Ledger::new(1 << 30), &request(SpecMode::Draft), &offered(), None),
            Err(Error::InvalidArgument(_))
        ));
        let only_q8 = vec![(KvType::Q8_0, footprint(12240))];
        assert!(matches!(
            plan(&Ledger::new(1 << 30), &request(SpecMode::Off), &only_q8, None),
            Err(Error::InvalidArgument(_))
        ));
    }
}
