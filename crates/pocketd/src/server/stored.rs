//! Responses kept for the Responses API (`store`, the default): what `GET
//! /v1/responses/{id}` returns, and the conversation `previous_response_id` continues.
//!
//! The store is bounded twice: by count (`stored_responses` in the configuration, the oldest
//! going first) and by the memory budget, which pays for it as for parked conversations —
//! a response that does not fit beside the rest pushes the oldest out, and one that does not
//! fit at all is not kept (the request is still answered). What a continued conversation
//! saves is its prompt: the prompt cache parked it under its tokens, so the follow-up's
//! prompt, rebuilt here as messages, is continued from there rather than read again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use pocket_api::responses::ResponseObject;
use pocket_core::ChatMessage;
use pocket_core::memory::{Ledger, Reservation};

/// A kept response.
#[derive(Debug)]
pub struct Stored {
    /// The response as it was returned.
    pub response: ResponseObject,
    /// Its conversation without the instructions (which `previous_response_id` does not carry
    /// over): the input, earlier turns included, then the answer.
    pub conversation: Vec<ChatMessage>,
    bytes: u64,
}

/// The kept responses, oldest first.
pub struct ResponseStore {
    capacity: usize,
    ledger: Ledger,
    inner: Mutex<Inner>,
}

struct Inner {
    order: VecDeque<String>,
    entries: HashMap<String, Arc<Stored>>,
    /// What the budget pays for the store; `None` when the budget refused even an empty one.
    reservation: Option<Reservation>,
}

/// What a message costs beyond its text (the struct, the strings' headers, the map's entry).
const MESSAGE_OVERHEAD: u64 = 160;

impl ResponseStore {
    /// A store of at most `capacity` responses (0: none is kept), paid for in `ledger`.
    pub fn new(ledger: &Ledger, capacity: usize) -> ResponseStore {
        let reservation = ledger.reserve(0, "stored responses").ok();
        ResponseStore {
            capacity,
            ledger: ledger.clone(),
            inner: Mutex::new(Inner { order: VecDeque::new(), entries: HashMap::new(), reservation }),
        }
    }

    // Each update leaves the map, the order and the reservation consistent before it can
    // fail, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `response` with its `conversation`; `false` when it could not be (the store is
    /// off, or the budget has no room for it even with the others gone).
    pub fn put(&self, response: ResponseObject, conversation: Vec<ChatMessage>) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let bytes = cost(&response, &conversation);
        let id = response.id.clone();
        let stored = Arc::new(Stored { response, conversation, bytes });
        let mut inner = self.lock();
        inner.remove(&id);
        // One that cannot fit with every other gone pushes none out.
        if bytes > inner.used() + self.ledger.available() {
            tracing::warn!("response {id} is not stored: it needs more than the memory budget has free");
            return false;
        }
        while inner.entries.len() >= self.capacity && inner.evict_oldest() {}
        loop {
            let total = inner.used() + bytes;
            let Some(reservation) = inner.reservation.as_mut() else { return false };
            if reservation.resize(total).is_ok() {
                break;
            }
            if !inner.evict_oldest() {
                tracing::warn!("response {id} is not stored: the memory budget has no room for it");
                return false;
            }
        }
        inner.order.push_back(id.clone());
        inner.entries.insert(id, stored);
        true
    }

    /// The response kept under `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().entries.get(id).cloned()
    }

    /// Forget the response kept under `id`; `false` if none was.
    pub fn delete(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    /// How many responses are kept, and the bytes the budget pays for them.
    pub fn usage(&self) -> (usize, u64) {
        let inner = self.lock();
        (inner.entries.len(), inner.used())
    }
}

impl Inner {
    fn used(&self) -> u64 {
        self.reservation.as_ref().map_or(0, Reservation::bytes)
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(stored) = self.entries.remove(id) else { return false };
        self.order.retain(|kept| kept != id);
        let left = self.used().saturating_sub(stored.bytes);
        if let Some(r) = self.reservation.as_mut() {
            // Shrinking always succeeds.
            let _ = r.resize(left);
        }
        true
    }

    fn evict_oldest(&mut self) -> bool {
        match self.order.front().cloned() {
            Some(id) => self.remove(&id),
            None => false,
        }
    }
}

/// The bytes a kept response holds: its JSON's size stands for the response, its messages'
/// texts and arguments for the conversation.
fn cost(response: &ResponseObject, conversation: &[ChatMessage]) -> u64 {
    let response = serde_json::to_vec(response).map_or(0, |v| v.len() as u64);
    let messages: u64 = conversation
        .iter()
        .map(|m| {
            let calls: usize = m
                .tool_calls
                .iter()
                .map(|c| c.id.len() + c.function.name.len() + c.function.arguments.len())
                .sum();
            MESSAGE_OVERHEAD + (m.content.len() + calls) as u64
        })
        .sum();
    response + messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use pocket_core::Role;

    fn response(id: &str, text: &str) -> ResponseObject {
        serde_json::from_value(serde_json::json!({
            "id": id, "object": "response", "created_at": 0, "status": "completed", "error": null,
            "incomplete_details": null, "instructions": null, "max_output_tokens": null, "model": "m",
            "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}],
            "parallel_tool_calls": true, "previous_response_id": null, "reasoning": {}, "store": true,
            "temperature": 0.0, "text": {}, "tool_choice": "auto", "tools": [], "top_p": 1.0,
            "truncation": "disabled", "usage": null, "user": null, "metadata": {},
        }))
        .unwrap()
    }

    fn turn(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::new(Role::User, "q"), ChatMessage::new(Role::Assistant, text)]
    }

    #[test]
    fn the_oldest_goes_past_the_count_and_the_budget_pays_for_what_is_kept() {
        let ledger = Ledger::new(1 << 20);
        let store = ResponseStore::new(&ledger, 2);
        assert!(store.put(response("a", "1"), turn("1")));
        assert!(store.put(response("b", "2"), turn("2")));
        assert!(store.put(response("c", "3"), turn("3")));
        assert!(store.get("a").is_none() && store.get("b").is_some() && store.get("c").is_some());
        let (count, bytes) = store.usage();
        assert_eq!(count, 2);
        assert_eq!(ledger.used(), bytes);
        assert!(store.delete("b") && !store.delete("b"));
        assert_eq!(ledger.used(), store.usage().1);
        drop(store);
        assert_eq!(ledger.used(), 0);
    }

    #[test]
    fn a_full_budget_pushes_the_oldest_out_and_refuses_what_never_fits() {
        let one = cost(&response("a", &"x".repeat(1000)), &turn(&"x".repeat(1000)));
        let ledger = Ledger::new(one * 2 + one / 2);
        let store = ResponseStore::new(&ledger, 100);
        for id in ["a", "b", "c"] {
            assert!(store.put(response(id, &"x".repeat(1000)), turn(&"x".repeat(1000))));
        }
        assert!(store.get("a").is_none() && store.get("c").is_some(), "the oldest made room");
        assert!(!store.put(response("huge", &"x".repeat(10_000)), turn(&"x".repeat(10_000))));
        assert!(store.get("c").is_some(), "what never fits pushes nothing out");
        assert!(store.usage().1 <= ledger.budget());
    }

    #[test]
    fn a_store_of_none_keeps_nothing() {
        let store = ResponseStore::new(&Ledger::unlimited(), 0);
        assert!(!store.put(response("a", "1"), turn("1")));
        assert!(store.get("a").is_none());
    }
}
