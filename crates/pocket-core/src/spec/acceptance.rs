//! Acceptance per drafted token, estimated online: what the suffix and auto drafters size
//! their drafts from.

/// Acceptance per drafted token, estimated from decayed counts with a prior.
#[derive(Debug, Clone, Copy)]
pub(super) struct AcceptanceEstimate {
    accepted: f64,
    rejected: f64,
}

impl AcceptanceEstimate {
    const DECAY: f64 = 0.95;

    pub(super) fn prior(alpha: f64, weight: f64) -> Self {
        AcceptanceEstimate { accepted: alpha * weight, rejected: (1.0 - alpha) * weight }
    }

    /// The decayed accepted and rejected counts.
    pub(super) fn counts(&self) -> [f64; 2] {
        [self.accepted, self.rejected]
    }

    pub(super) fn from_counts(accepted: f64, rejected: f64) -> Self {
        AcceptanceEstimate { accepted, rejected }
    }

    pub(super) fn alpha(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected).max(1e-9)
    }

    /// A draft of `drafted` tokens of which `accepted` were kept: under independent
    /// acceptance, `accepted` successes and one failure unless all were kept.
    pub(super) fn update(&mut self, drafted: usize, accepted: usize) {
        self.accepted = self.accepted * Self::DECAY + accepted as f64;
        self.rejected = self.rejected * Self::DECAY + f64::from(accepted < drafted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_move_the_estimate_from_its_prior_and_old_ones_fade() {
        let mut e = AcceptanceEstimate::prior(0.5, 4.0);
        assert!((e.alpha() - 0.5).abs() < 1e-12);
        for _ in 0..40 {
            e.update(4, 4);
        }
        assert!(e.alpha() > 0.95, "{}", e.alpha());
        // A draft rejected at its first token is one failure (no successes): forty of them
        // outweigh the faded earlier successes.
        for _ in 0..40 {
            e.update(4, 0);
        }
        assert!(e.alpha() < 0.4, "{}", e.alpha());
    }
}
