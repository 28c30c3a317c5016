//! What a request's drafter did, typed for code and written as one line for people.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Choice;

/// What a drafter did during one request: its [`fmt::Display`] is the line reports show
/// (`suffix`, `auto (suffix 62%, plain 38%)`, `auto (plain: not measured on this device yet)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DrafterReport {
    /// One drafter throughout, by its name (`suffix`, `layerskip`, `draft`, `inputcopy`).
    Single(String),
    /// `auto`, with the share (0 to 1) of its steps each choice took, choices never taken left out.
    Auto(Vec<(Choice, f64)>),
    /// `auto` on a model with no measured cost curve on this device: it decodes plainly.
    AutoUnmeasured,
}

impl DrafterReport {
    /// The share of `auto`'s steps that `choice` took (0 for another drafter).
    pub fn share(&self, choice: Choice) -> f64 {
        match self {
            DrafterReport::Auto(shares) => shares.iter().find(|(c, _)| *c == choice).map_or(0.0, |&(_, s)| s),
            _ => 0.0,
        }
    }
}

impl fmt::Display for DrafterReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrafterReport::Single(name) => f.write_str(name),
            DrafterReport::Auto(shares) => {
                let parts: Vec<String> =
                    shares.iter().map(|(c, share)| format!("{c} {:.0}%", 100.0 * share)).collect();
                write!(f, "auto ({})", parts.join(", "))
            }
            DrafterReport::AutoUnmeasured => f.write_str("auto (plain: not measured on this device yet)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_read_as_the_lines_they_replace() {
        assert_eq!(DrafterReport::Single("suffix".into()).to_string(), "suffix");
        let auto = DrafterReport::Auto(vec![(Choice::Suffix, 0.625), (Choice::Plain, 0.375)]);
        assert_eq!(auto.to_string(), "auto (suffix 62%, plain 38%)");
        assert_eq!(auto.share(Choice::Suffix), 0.625);
        assert_eq!(auto.share(Choice::LayerSkip), 0.0);
        assert!(DrafterReport::AutoUnmeasured.to_string().contains("not measured"));
    }
}
