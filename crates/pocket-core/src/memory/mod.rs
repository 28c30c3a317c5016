//! Memory: the budget a process may use, the ledger every allocation reserves against, the
//! planner that fits a session into what is free, and sizes as people write them.
//!
//! The budget is never exceeded by planning, not by luck: an engine reserves what it is about
//! to allocate (weights, each block of KV cache, compute buffers) and gives it back when it is
//! freed, and a request that cannot fit fails with [`crate::Error::OverBudget`] naming the
//! bytes needed and free instead of being killed by the kernel.

mod ledger;
mod plan;
mod size;

pub use ledger::{Ledger, Place, Reservation};
pub use plan::{
    Degradation, DraftModelCosts, MIN_PREFILL_BATCH, ModelCosts, Plan, PlanRequest, SUFFIX_BYTES_PER_TOKEN,
    SessionCosts, kv_ladder, plan, prefill_batches,
};
pub use size::{BudgetSpec, MemoryLimits, format_size, parse_size, proc_field};
