//! The planner: what a session may hold under the budget, given up in a fixed order when it
//! cannot have everything it asked for (docs/architecture.md, the memory budget): first smaller prefill
//! passes (a smaller compute buffer; costs time to first token, not decode speed), then
//! shorter drafts, then a drafter that needs no memory of its own instead of a draft model,
//! then no speculation, then a lower-bit KV cache; and when even the least of those does not
//! fit, an error naming the bytes needed and free.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Ledger;
use crate::spec::SpecMode;
use crate::{Error, Footprint, KvType, Model, Result, SessionConfig};

/// What the suffix automaton holds per token of prompt and output: the token, at most two
/// states of 16 bytes and three transitions in a hash map (about 24 bytes each with the map's
/// slack), rounded up.
pub const SUFFIX_BYTES_PER_TOKEN: u64 = 128;

/// The smallest prefill pass the planner shrinks to: below this, prompt processing loses
/// most of its matrix-matrix speed, and a verification pass (1 + the longest draft) still
/// fits in one.
pub const MIN_PREFILL_BATCH: usize = 32;

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
    /// The lowest KV type the ladder may go down to: none stores keys or values less
    /// precisely than it. [`KvType::Q4_0`] allows the whole ladder; a model whose measured
    /// agreement says 4-bit keys would hurt stops at [`KvType::Q8_0_Q4_0`].
    pub lowest_kv: KvType,
    /// The speculation asked for.
    pub spec: SpecMode,
    /// The longest draft asked for.
    pub max_draft: usize,
    /// The most tokens per forward pass asked for (the prompt is processed in passes of this
    /// many; the compute buffer is sized for one).
    pub n_batch: usize,
}

/// What a session is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// KV cache type.
    pub kv: KvType,
    /// Tokens the session may hold: the request's, plus the positions one verification
    /// writes past them (the draft window, K + 1).
    pub n_ctx: usize,
    /// Most tokens per forward pass.
    pub n_batch: usize,
    /// Most rows of logits per pass: 1 + the longest draft.
    pub max_rows: usize,
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
    pub degraded: Vec<Degradation>,
}

/// One thing a plan gave up to fit the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "gave_up", rename_all = "snake_case")]
pub enum Degradation {
    /// The prompt is processed in smaller passes (a smaller compute buffer).
    SmallerPasses {
        /// Tokens per pass now.
        n_batch: usize,
        /// Tokens per pass asked for.
        asked: usize,
    },
    /// Drafts are shorter.
    ShorterDrafts {
        /// The longest draft now.
        max_draft: usize,
        /// The longest draft asked for.
        asked: usize,
    },
    /// Speculation goes on without the draft model (whose session would not fit).
    WithoutDraftModel {
        /// The drafter used instead.
        spec: SpecMode,
    },
    /// No speculation.
    NoSpeculation,
    /// A lower-bit KV cache.
    LowerKv {
        /// The KV type now.
        kv: KvType,
        /// The KV type asked for.
        asked: KvType,
    },
}

impl std::fmt::Display for Degradation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Degradation::SmallerPasses { n_batch, asked } => {
                write!(f, "prompt in passes of {n_batch} tokens instead of {asked}")
            }
            Degradation::ShorterDrafts { max_draft, .. } => {
                write!(f, "drafts shortened to {max_draft} tokens")
            }
            Degradation::WithoutDraftModel { spec } => write!(f, "{spec} without the draft model"),
            Degradation::NoSpeculation => f.write_str("no speculation"),
            Degradation::LowerKv { kv, asked } => write!(f, "{kv} KV cache instead of {asked}"),
        }
    }
}

impl Plan {
    /// Give `config` what this plan allows: its KV type, pass size and rows of logits, and a
    /// context no longer than the plan's.
    pub fn apply_to(&self, config: &mut SessionConfig) {
        config.kv = self.kv;
        config.n_ctx = config.n_ctx.min(self.n_ctx);
        config.n_batch = self.n_batch;
        config.max_rows = self.max_rows;
    }
}

/// The engine's predictions for one session, asked for each KV type, pass size and rows of
/// logits the planner considers: the target session's footprint (`None` when the engine
/// offers no such KV cache) and, where there is a draft model, its costs.
pub trait SessionCosts {
    /// The target session's footprint with a `kv` cache, passes of `n_batch` tokens and
    /// `max_rows` rows of logits.
    fn target(&mut self, kv: KvType, n_batch: usize, max_rows: usize) -> Result<Option<Footprint>>;

    /// The draft model's costs with a `kv` cache and passes of `n_batch` tokens (a draft
    /// model needs one row of logits); `None` when there is no draft model.
    fn draft(&mut self, kv: KvType, n_batch: usize) -> Result<Option<DraftModelCosts>>;
}

/// [`SessionCosts`] from the engines' own predictions ([`Model::footprint`]): a session of
/// `target` with `config`, speculating with `draft` where given (its weights already loaded
/// and paid for, so only its session counts). Sessions of either model with another KV cache
/// than the engine offers are not offered.
pub struct ModelCosts<'a> {
    /// The target model.
    pub target: &'a dyn Model,
    /// The draft model, if any.
    pub draft: Option<&'a dyn Model>,
    /// The session settings the KV type and pass size are varied from.
    pub config: SessionConfig,
}

impl ModelCosts<'_> {
    fn config(&self, kv: KvType, n_batch: usize, max_rows: usize) -> SessionConfig {
        SessionConfig { kv, n_batch, max_rows, ..self.config.clone() }
    }
}

impl SessionCosts for ModelCosts<'_> {
    fn target(&mut self, kv: KvType, n_batch: usize, max_rows: usize) -> Result<Option<Footprint>> {
        match self.target.footprint(&self.config(kv, n_batch, max_rows)) {
            Ok(f) => Ok(Some(f)),
            Err(Error::InvalidArgument { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn draft(&mut self, kv: KvType, n_batch: usize) -> Result<Option<DraftModelCosts>> {
        let Some(draft) = self.draft else { return Ok(None) };
        let f = draft.footprint(&self.config(kv, n_batch, 1))?;
        Ok(Some(DraftModelCosts {
            weights_bytes: 0,
            kv_bytes_per_token: f.kv_bytes_per_token,
            compute_bytes: f.compute_bytes,
        }))
    }
}

/// The pass sizes tried for a request of `asked`, largest first: halving down to
/// [`MIN_PREFILL_BATCH`].
pub fn prefill_batches(asked: usize) -> Vec<usize> {
    let mut sizes = vec![asked.max(1)];
    let mut n = asked / 2;
    while n >= MIN_PREFILL_BATCH {
        sizes.push(n);
        n /= 2;
    }
    sizes
}

/// Remembers what [`SessionCosts`] answered (measuring a footprint builds a graph).
struct Memo<'a> {
    costs: &'a mut dyn SessionCosts,
    target: HashMap<(KvType, usize, usize), Option<Footprint>>,
    draft: HashMap<(KvType, usize), Option<DraftModelCosts>>,
}

impl Memo<'_> {
    fn target(&mut self, kv: KvType, n_batch: usize, max_rows: usize) -> Result<Option<Footprint>> {
        if let Some(f) = self.target.get(&(kv, n_batch, max_rows)) {
            return Ok(*f);
        }
        let f = self.costs.target(kv, n_batch, max_rows)?;
        self.target.insert((kv, n_batch, max_rows), f);
        Ok(f)
    }

    fn draft(&mut self, kv: KvType, n_batch: usize) -> Result<Option<DraftModelCosts>> {
        if let Some(d) = self.draft.get(&(kv, n_batch)) {
            return Ok(*d);
        }
        let d = self.costs.draft(kv, n_batch)?;
        self.draft.insert((kv, n_batch), d);
        Ok(d)
    }
}

/// Plan a session asking for `request` with what `ledger` has free, from what the engine
/// predicts (`costs`).
///
/// Errors: [`Error::OverBudget`] when even the least plan (no speculation, the lowest-bit KV
/// type offered, the smallest passes) does not fit, naming its bytes;
/// [`Error::InvalidArgument`] when the KV type asked for is not offered, or `draft`
/// speculation is asked for without a draft model.
pub fn plan(ledger: &Ledger, request: &PlanRequest, costs: &mut dyn SessionCosts) -> Result<Plan> {
    let available = ledger.available();
    let mut memo = Memo { costs, target: HashMap::new(), draft: HashMap::new() };
    let batches = prefill_batches(request.n_batch);
    if memo.target(request.kv, batches[0], request.max_draft + 1)?.is_none() {
        return Err(Error::invalid_field(
            "kv",
            format!("the engine offers no {} KV cache for this model", request.kv),
        ));
    }
    let has_draft = memo.draft(request.kv, batches[0])?.is_some();
    if request.spec == SpecMode::Draft && !has_draft {
        return Err(Error::invalid_field("draft_model", "draft speculation needs a draft model"));
    }
    // The drafters to try, most wanted first: the one asked for, then without the draft
    // model's memory, then none.
    let mut drafters =
        vec![(request.spec, has_draft && matches!(request.spec, SpecMode::Draft | SpecMode::Auto))];
    match request.spec {
        SpecMode::Draft => drafters.push((SpecMode::Suffix, false)),
        SpecMode::Auto if has_draft => drafters.push((SpecMode::Auto, false)),
        _ => {}
    }
    if request.spec != SpecMode::Off {
        drafters.push((SpecMode::Off, false));
    }
    let mut least = None;
    // Lower-bit KV types are asked of the engine only when the one asked for does not fit
    // (measuring a footprint builds a graph).
    for (ik, kv) in kv_ladder(request.kv, request.lowest_kv).enumerate() {
        if memo.target(kv, batches[0], request.max_draft + 1)?.is_none() {
            continue; // not offered by this engine
        }
        for (id, &(spec, with_draft)) in drafters.iter().enumerate() {
            let mut k = if spec == SpecMode::Off { 0 } else { request.max_draft.max(1) };
            loop {
                for &n_batch in &batches {
                    let footprint = memo.target(kv, n_batch, k + 1)?.expect("offered at every size");
                    let draft = if with_draft { memo.draft(kv, n_batch)? } else { None };
                    let bytes = session_bytes(request.tokens, &footprint, spec, draft.as_ref(), k);
                    if bytes <= available {
                        let mut degraded = Vec::new();
                        if n_batch < batches[0] {
                            degraded.push(Degradation::SmallerPasses { n_batch, asked: batches[0] });
                        }
                        if k < request.max_draft && spec != SpecMode::Off {
                            degraded
                                .push(Degradation::ShorterDrafts { max_draft: k, asked: request.max_draft });
                        }
                        if id > 0 && spec != SpecMode::Off {
                            degraded.push(Degradation::WithoutDraftModel { spec });
                        }
                        if spec == SpecMode::Off && request.spec != SpecMode::Off {
                            degraded.push(Degradation::NoSpeculation);
                        }
                        if ik > 0 {
                            degraded.push(Degradation::LowerKv { kv, asked: request.kv });
                        }
                        return Ok(Plan {
                            kv,
                            n_ctx: request.tokens + k + 1,
                            n_batch,
                            max_rows: k + 1,
                            spec,
                            draft_model: with_draft,
                            max_draft: k,
                            bytes,
                            available,
                            degraded,
                        });
                    }
                    least = Some(bytes);
                }
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

/// The KV types a session asking for `asked` may be given, in the order the ladder tries them:
/// `asked`, then the types of [`KvType::ALL`] below it (keys and values each at most as precise)
/// and no lower than `lowest`.
pub fn kv_ladder(asked: KvType, lowest: KvType) -> impl Iterator<Item = KvType> {
    std::iter::once(asked)
        .chain(KvType::ALL.into_iter().filter(move |kv| kv.is_below(asked) && kv.at_least(lowest)))
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

    /// Costs like SmolLM2's: a compute buffer that scales with the pass size (10 MiB at 256
    /// tokens), KV bytes per token by type.
    struct Fake {
        kv_types: Vec<(KvType, u64)>,
        draft: Option<DraftModelCosts>,
        asked: usize,
    }

    impl SessionCosts for Fake {
        fn target(&mut self, kv: KvType, n_batch: usize, max_rows: usize) -> Result<Option<Footprint>> {
            self.asked += 1;
            Ok(self.kv_types.iter().find(|(k, _)| *k == kv).map(|&(_, per_token)| Footprint {
                weights_anon_bytes: 0,
                weights_mapped_bytes: 100 * MIB,
                kv_bytes_per_token: per_token,
                kv_block_tokens: 64,
                compute_bytes: 10 * MIB * n_batch as u64 / 256 + 200_000 * max_rows as u64,
                logits_row_bytes: 200_000,
            }))
        }

        fn draft(&mut self, _kv: KvType, n_batch: usize) -> Result<Option<DraftModelCosts>> {
            Ok(self
                .draft
                .map(|d| DraftModelCosts { compute_bytes: d.compute_bytes * n_batch as u64 / 256, ..d }))
        }
    }

    fn costs(with_draft: bool) -> Fake {
        Fake {
            kv_types: vec![
                (KvType::F16, 23040),
                (KvType::Q8_0, 12240),
                (KvType::Q8_0_Q4_0, 9360),
                (KvType::Q4_0, 6480),
            ],
            draft: with_draft.then_some(DraftModelCosts {
                weights_bytes: 60 * MIB,
                kv_bytes_per_token: 12288,
                compute_bytes: 8 * MIB,
            }),
            asked: 0,
        }
    }

    fn request(spec: SpecMode) -> PlanRequest {
        PlanRequest {
            tokens: 1000,
            kv: KvType::F16,
            lowest_kv: KvType::Q4_0,
            spec,
            max_draft: 8,
            n_batch: 256,
        }
    }

    #[test]
    fn everything_asked_for_when_it_fits() {
        let p = plan(&Ledger::new(1 << 30), &request(SpecMode::Draft), &mut costs(true)).unwrap();
        assert_eq!(
            (p.kv, p.spec, p.draft_model, p.max_draft, p.n_ctx, p.n_batch),
            (KvType::F16, SpecMode::Draft, true, 8, 1009, 256)
        );
        assert!(p.degraded.is_empty());
        assert!(p.bytes > 60 * MIB + 10 * MIB + 8 * MIB);
    }

    #[test]
    fn prefill_passes_halve_down_to_the_floor() {
        assert_eq!(prefill_batches(256), [256, 128, 64, 32]);
        assert_eq!(prefill_batches(100), [100, 50]);
        assert_eq!(prefill_batches(16), [16]);
        assert_eq!(prefill_batches(0), [1]);
    }

    #[test]
    fn degrades_in_the_designed_order_as_the_budget_shrinks() {
        let req = request(SpecMode::Draft);
        let mut c = costs(true);
        // Walk the budget down and record each change of plan: the order must be smaller
        // prefill passes, then shorter drafts, then no draft model, then no speculation, then
        // lower-bit KV, then an error.
        let mut seen: Vec<(SpecMode, bool, KvType, usize, usize)> = Vec::new();
        let mut budget = 200 * MIB;
        loop {
            match plan(&Ledger::new(budget), &req, &mut c) {
                Ok(p) => {
                    assert!(p.bytes <= budget);
                    let key = (p.spec, p.draft_model, p.kv, p.max_draft, p.n_batch);
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
        let rank = |&(spec, with_draft, kv, k, n_batch): &(SpecMode, bool, KvType, usize, usize)| {
            let drafter = if with_draft {
                0
            } else if spec != SpecMode::Off {
                1
            } else {
                2
            };
            // Larger is further degraded: KV type, then drafter, then draft length, then pass.
            (
                KvType::ALL.iter().position(|&x| x == kv).unwrap(),
                drafter,
                usize::MAX - k,
                usize::MAX - n_batch,
            )
        };
        for w in seen.windows(2) {
            assert!(rank(&w[0]) < rank(&w[1]), "{:?} came after {:?}", w[1], w[0]);
        }
        assert_eq!(seen.first(), Some(&(SpecMode::Draft, true, KvType::F16, 8, 256)));
        assert_eq!(seen.get(1), Some(&(SpecMode::Draft, true, KvType::F16, 8, 128)), "{seen:?}");
        assert_eq!(seen.last().map(|s| (s.0, s.2, s.4)), Some((SpecMode::Off, KvType::Q4_0, 32)));
        assert!(seen.contains(&(SpecMode::Suffix, false, KvType::F16, 8, 256)), "{seen:?}");
        // One plan that tries everything asks for each footprint once.
        c.asked = 0;
        assert!(plan(&Ledger::new(1), &req, &mut c).is_err());
        // (KV types) × (pass sizes) × (rows for K = 8, 4, 2, 1 and none)
        assert_eq!(c.asked, 4 * 4 * 5, "each footprint is asked for once");
        assert!(seen.iter().any(|s| s.2 == KvType::Q8_0_Q4_0), "the mix is a step of the ladder: {seen:?}");
    }

    #[test]
    fn the_ladder_goes_down_from_the_type_asked_for_and_stops_at_the_lowest_allowed() {
        let ladder = |asked: &str, lowest: &str| {
            kv_ladder(asked.parse().unwrap(), lowest.parse().unwrap()).map(|k| k.name()).collect::<Vec<_>>()
        };
        assert_eq!(ladder("f16", "q4_0"), ["f16", "q8_0", "q8_0/q4_0", "q4_0"]);
        assert_eq!(ladder("f16", "q8_0/q4_0"), ["f16", "q8_0", "q8_0/q4_0"]);
        assert_eq!(ladder("f16", "q8_0"), ["f16", "q8_0"]);
        assert_eq!(ladder("q8_0/q4_0", "q4_0"), ["q8_0/q4_0", "q4_0"]);
        // A type asked for outside the ladder is given when it fits; below it, the ladder's.
        assert_eq!(ladder("f16/q8_0", "q4_0"), ["f16/q8_0", "q8_0", "q8_0/q4_0", "q4_0"]);
        // What a user asks for is not refused for being below the lowest the ladder goes to.
        assert_eq!(ladder("q4_0", "q8_0/q4_0"), ["q4_0"]);
    }

    #[test]
    fn keys_that_need_eight_bits_keep_them_however_small_the_budget() {
        let mut req = request(SpecMode::Off);
        req.lowest_kv = KvType::Q8_0_Q4_0;
        let mut c = costs(false);
        let mut budget = 60 * MIB;
        let mut last = None;
        while let Ok(p) = plan(&Ledger::new(budget), &req, &mut c) {
            last = Some(p);
            budget -= MIB / 4;
        }
        let last = last.unwrap();
        assert_eq!(last.kv, KvType::Q8_0_Q4_0);
        assert!(last.degraded.contains(&Degradation::LowerKv { kv: KvType::Q8_0_Q4_0, asked: KvType::F16 }));
    }

    #[test]
    fn a_session_that_cannot_fit_names_the_least_it_needs() {
        let ledger = Ledger::new(5 * MIB);
        let _held = ledger.reserve(3 * MIB, "weights").unwrap();
        let e = plan(&ledger, &request(SpecMode::Off), &mut costs(false)).unwrap_err();
        let Error::OverBudget { needed, available, budget, .. } = e else { panic!("{e}") };
        assert_eq!((available, budget), (2 * MIB, 5 * MIB));
        // The least plan: q4_0 KV for 1001 positions (16 blocks of 64), the compute buffer for
        // passes of 32 tokens, one logits row.
        assert_eq!(needed, 16 * 64 * 6480 + 10 * MIB * 32 / 256 + 200_000 + 200_000);
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        assert!(matches!(
            plan(&Ledger::new(1 << 30), &request(SpecMode::Draft), &mut costs(false)),
            Err(Error::InvalidArgument { .. })
        ));
        let mut only_q8 = costs(false);
        only_q8.kv_types.retain(|(k, _)| *k == KvType::Q8_0);
        assert!(matches!(
            plan(&Ledger::new(1 << 30), &request(SpecMode::Off), &mut only_q8),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
