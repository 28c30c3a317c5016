//! Turns to generate: `parallel` requests at once; the others wait, the highest priority first
//! and, within a priority, in arrival order — whichever transport they came by.
//!
//! Priorities follow vLLM's `priority`: a lower number is served sooner, 0 by default. The
//! number of turns can change while requests hold them (`parallel = "auto"` follows the
//! model's measured cost curve): more turns are handed out at once, fewer take effect as turns
//! come back.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The gate.
pub struct Turns {
    state: Mutex<State>,
}

struct State {
    capacity: usize,
    held: usize,
    waiting: BinaryHeap<Waiter>,
    next_arrival: u64,
}

/// A request waiting for a turn: the most urgent is the greatest.
struct Waiter {
    priority: i32,
    arrival: u64,
    grant: oneshot::Sender<Turn>,
}

impl Waiter {
    fn key(&self) -> (Reverse<i32>, Reverse<u64>) {
        (Reverse(self.priority), Reverse(self.arrival))
    }
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Waiter {}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// A turn, held until dropped.
pub struct Turn {
    turns: Option<Arc<Turns>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(turns) = self.turns.take() {
            let mut s = turns.lock();
            s.held -= 1;
            Turns::grant(&turns, &mut s);
        }
    }
}

impl Turns {
    /// `capacity` turns (at least 1).
    pub fn new(capacity: usize) -> Arc<Turns> {
        Arc::new(Turns {
            state: Mutex::new(State {
                capacity: capacity.max(1),
                held: 0,
                waiting: BinaryHeap::new(),
                next_arrival: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters and a heap, consistent between statements.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many turns there are.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }

    /// Turns held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// Requests waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Make it `capacity` turns (at least 1); waiters get the ones this frees at once.
    pub fn set_capacity(self: &Arc<Self>, capacity: usize) {
        let mut s = self.lock();
        s.capacity = capacity.max(1);
        Turns::grant(self, &mut s);
    }

    /// Wait for a turn with `priority` (lower is sooner). Dropping the future gives up its
    /// place, or the turn if it was already granted.
    pub async fn acquire(self: &Arc<Self>, priority: i32) -> Turn {
        let rx = {
            let mut s = self.lock();
            if s.held < s.capacity && s.waiting.is_empty() {
                s.held += 1;
                return Turn { turns: Some(self.clone()) };
            }
            let (grant, rx) = oneshot::channel();
            let arrival = s.next_arrival;
            s.next_arrival += 1;
            s.waiting.push(Waiter { priority, arrival, grant });
            rx
        };
        // The sender lives in the heap until it grants; the gate outlives every waiter.
        rx.await.expect("a waiter is granted a turn before the gate drops it")
    }

    /// Hand free turns to the most urgent waiters still waiting.
    fn grant(this: &Arc<Turns>, s: &mut State) {
        while s.held < s.capacity {
            let Some(w) = s.waiting.pop() else { return };
            s.held += 1;
            if let Err(mut turn) = w.grant.send(Turn { turns: Some(this.clone()) }) {
                // It stopped waiting: the turn is not taken (disarmed, so that its drop does
                // not lock the gate again).
                turn.turns = None;
                s.held -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The turn, if the task gets one within 50 ms.
    async fn granted(task: &mut tokio::task::JoinHandle<Turn>) -> Option<Turn> {
        tokio::time::timeout(Duration::from_millis(50), task).await.ok().map(|t| t.unwrap())
    }

    #[tokio::test]
    async fn waiters_get_turns_by_priority_then_arrival() {
        let gate = Turns::new(1);
        let first = gate.acquire(0).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, priority) in [("low-a", 5), ("normal", 0), ("urgent", -3), ("low-b", 5)] {
            let (gate, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = gate.acquire(priority).await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(turn);
            }));
            // Arrival order is the order they start waiting.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gate.waiting(), 4);
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["urgent", "normal", "low-a", "low-b"]);
        assert_eq!(gate.held(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_nothing_and_more_turns_free_waiters() {
        let gate = Turns::new(1);
        let held = gate.acquire(0).await;
        let quitter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(0).await }
        });
        let mut patient = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(0).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        quitter.abort();
        let _ = quitter.await;
        assert!(granted(&mut patient).await.is_none(), "one turn, held");
        // A second turn goes to the one still waiting; the quitter's place is skipped.
        gate.set_capacity(2);
        let second = granted(&mut patient).await.expect("the new turn");
        assert_eq!(gate.held(), 2);
        drop(held);
        assert_eq!(gate.held(), 1);
        // Fewer turns take effect as they come back.
        gate.set_capacity(1);
        let mut next = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(0).await }
        });
        assert!(granted(&mut next).await.is_none());
        drop(second);
        assert!(granted(&mut next).await.is_some());
    }
}
