//! Drafting with a second, smaller model that shares the target's vocabulary.

use super::layerskip::draft_greedy;
use super::{Draft, Drafter};
use crate::memory::Ledger;
use crate::{Error, LayerPlan, Model, Result, Rows, Session, SessionConfig, Token};

/// Drafts greedily with its own session of a smaller model, kept in step with the target's
/// sequence: before each draft it drops what the target rejected and decodes what it has not
/// seen (the prompt on the first draft, the target's own token after each verification).
pub struct DraftModelDrafter {
    session: Box<dyn Session>,
    plan: LayerPlan,
    max_draft: usize,
    name: String,
}

impl DraftModelDrafter {
    /// A drafter running `draft` for `target`, with a session of `config` and drafts of at
    /// most `max_draft` tokens.
    ///
    /// The two models must share a vocabulary: the same size and the same bytes for every
    /// token, or [`Error::InvalidArgument`] names the first difference.
    pub fn new(
        target: &dyn Model,
        draft: &dyn Model,
        config: &SessionConfig,
        max_draft: usize,
    ) -> Result<Self> {
        Self::new_in(target, draft, config, max_draft, &Ledger::unlimited())
    }

    /// [`DraftModelDrafter::new`] with the draft session paying for its memory in `ledger`.
    pub fn new_in(
        target: &dyn Model,
        draft: &dyn Model,
        config: &SessionConfig,
        max_draft: usize,
        ledger: &Ledger,
    ) -> Result<Self> {
        check_same_vocabulary(target, draft)?;
        // It reads one row of logits per pass.
        let config = SessionConfig { max_rows: 1, ..config.clone() };
        Ok(DraftModelDrafter {
            session: draft.session_in(&config, ledger)?,
            plan: LayerPlan::full(draft.info().n_layers)?,
            max_draft,
            name: draft.info().name.clone(),
        })
    }

    /// The draft model's name.
    pub fn model_name(&self) -> &str {
        &self.name
    }

    /// Bytes the draft session holds now.
    pub fn memory(&self) -> u64 {
        self.session.memory()
    }
}

/// Checks that `draft` can propose tokens for `target`: same vocabulary size, same piece for
/// every token, same end tokens.
pub fn check_same_vocabulary(target: &dyn Model, draft: &dyn Model) -> Result<()> {
    let (ti, di) = (target.info(), draft.info());
    if ti.n_vocab != di.n_vocab {
        return Err(Error::invalid_field(
            "draft_model",
            format!(
                "draft model {} has a vocabulary of {} tokens and {} has {}; a draft model must share the \
             target's vocabulary",
                di.name, di.n_vocab, ti.name, ti.n_vocab
            ),
        ));
    }
    let (tt, dt) = (target.tokenizer(), draft.tokenizer());
    for t in 0..ti.n_vocab as Token {
        if tt.piece(t) != dt.piece(t) || tt.is_end(t) != dt.is_end(t) {
            return Err(Error::invalid_field(
                "draft_model",
                format!(
                    "draft model {} and {} differ at token {t} ({:?} vs {:?}); a draft model must share the \
                 target's vocabulary",
                    di.name,
                    ti.name,
                    String::from_utf8_lossy(&dt.piece(t)),
                    String::from_utf8_lossy(&tt.piece(t)),
                ),
            ));
        }
    }
    Ok(())
}

impl DraftModelDrafter {
    /// Make the draft session hold exactly `tokens`: keep the longest common prefix, decode
    /// the rest.
    fn sync(&mut self, tokens: &[Token]) -> Result<()> {
        let held = self.session.tokens();
        let common = held.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        self.session.truncate(common)?;
        if common < tokens.len() {
            self.session.decode(&tokens[common..], &self.plan, Rows::None)?;
        }
        Ok(())
    }
}

impl Drafter for DraftModelDrafter {
    fn name(&self) -> &str {
        "draft"
    }

    fn draft(
        &mut self,
        _target: &mut dyn Session,
        context: &[Token],
        max: usize,
        out: &mut Draft,
    ) -> Result<()> {
        out.clear();
        let max = max.min(self.max_draft);
        let Some((&pending, before)) = context.split_last() else { return Ok(()) };
        if max == 0 {
            return Ok(());
        }
        if before.len() >= self.session.config().n_ctx {
            return Ok(());
        }
        // Catch up on everything before the pending token; `draft_greedy` decodes the pending
        // token itself.
        self.sync(before)?;
        let room = self.session.config().n_ctx - self.session.len();
        draft_greedy(self.session.as_mut(), &self.plan, pending, max.min(room), 0.0, out)
    }

    fn feedback(&mut self, _drafted: &[Token], _accepted: usize) {}

    fn prefill(&mut self, context: &[Token]) -> Result<()> {
        if context.len() < self.session.config().n_ctx { self.sync(context) } else { Ok(()) }
    }
}
