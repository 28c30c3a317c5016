//! Passes that the sessions of one model share (continuous batching).
//!
//! Each session decodes on its own thread, through the same generation loop as ever; what it
//! hands the engine for one forward pass is a [`Job`]: its tokens (the next one, its drafts, a
//! chunk of its prompt), its cache and what rows of logits it wants. Sessions that decode at
//! the same time have their jobs computed as one pass: the rows of all of them go through
//! every matrix product together — the weights are read once — and each session's rows attend
//! over its own cache (see `graph`). A pass of four rows costs about 1.4 steps of one here,
//! against four passes that would otherwise fight for the same cores.
//!
//! No thread of its own: the session whose job has waited longest leads the next pass. It
//! waits a moment for the sessions of the last pass to hand in their next job (they sample
//! between passes), takes what fits, computes, and hands each its logits. A job alone runs on
//! its session's own machinery, exactly as without sharing; a shared pass runs on the model's
//! ([`Compute`], made when first needed and paid for in the model's memory ledger). Sessions
//! join and leave between passes. Every kernel computes a row as it would alone, so each
//! session's logits are what its pass alone gives, bit for bit.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pocket_core::{LayerPlan, PassRecord, SharedPasses, Threads, Token};

use crate::Result;
use crate::compute::Compute;
use crate::graph::inputs::{self, SegmentData};
use crate::graph::{PassShape, Segment};
use crate::kv::KvLayout;
use crate::parts::Parts;

/// Most tokens of a prompt one pass takes from a session while others decode: a long prompt
/// is read in chunks this size, each shared with the others' next tokens, so that they keep
/// going while it is read.
pub(crate) const SHARED_CHUNK: usize = 64;

/// Most rows of a shared pass (its compute buffer is sized for this many).
const SHARED_TOKENS: usize = 128;

/// Rows of prompts that prompts read together put into one shared pass, at most: room is
/// left for the next tokens (and drafts) of sessions that decode.
const PROMPT_ROWS: usize = SHARED_TOKENS - 16;

/// Most sessions in a shared pass (its graph is sized for this many).
const SHARED_JOBS: usize = 8;

/// Most rows of logits of a shared pass: a session's own limit (the logits are most of a
/// compute buffer for a large vocabulary).
const SHARED_LOGITS: usize = pocket_core::DEFAULT_MAX_ROWS;

/// How long the leader of a pass waits for the sessions of the last one, at least and at
/// most; in between, a quarter of the last pass. Sampling and drafting between passes take
/// well under a millisecond; a session that does not come back in time (its request ended,
/// its constraint is slow) is left to the next pass.
const GATHER_MIN: Duration = Duration::from_micros(200);
const GATHER_MAX: Duration = Duration::from_millis(4);

/// After a shared pass's machinery could not be had (the memory budget), passes stay each on
/// their own for this long before it is tried again.
const NO_SHARING_FOR: Duration = Duration::from_secs(5);

/// One session's forward pass, handed to [`Batcher::enter`].
pub(crate) struct Job {
    /// The session's cache: its id names the session.
    pub(crate) kv: Arc<KvLayout>,
    pub(crate) plan: LayerPlan,
    pub(crate) threads: Threads,
    /// Lower goes first into a pass that cannot take every job.
    pub(crate) priority: i32,
    /// The pass's tokens, at positions `pos0..`.
    pub(crate) tokens: Vec<Token>,
    pub(crate) pos0: usize,
    pub(crate) shape: PassShape,
    /// For a tree of drafts, each token's parent in the pass (empty for a sequence).
    pub(crate) parents: Vec<u8>,
    /// The session's logits buffer: the pass's rows go from row `row_off` on.
    pub(crate) logits: Vec<f32>,
    pub(crate) row_off: usize,
    /// Tokens of the session's prompt left to read after this job.
    pub(crate) rest: usize,
}

impl Job {
    /// Whether the job reads a prompt (it wants logits of fewer rows than it has) rather
    /// than decodes a next token and its drafts.
    fn reads_prompt(&self) -> bool {
        self.shape.n_out < self.shape.n_tokens
    }
}

/// What [`Batcher::enter`] gives back.
pub(crate) enum Turn<'a> {
    /// The job is alone in the next pass: compute it on the session's own machinery, then
    /// drop the guard (which lets the next pass start).
    Alone(Job, Lead<'a>),
    /// The job was computed in a shared pass (its logits written), as counted here.
    Shared(Job, PassRecord),
    /// The shared pass the job was in panicked on its leader's thread: the job is lost.
    Failed,
}

/// The model's shared passes.
#[derive(Default)]
pub(crate) struct Batcher {
    state: Mutex<State>,
    /// Woken when a job is handed in and when a pass ends.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Jobs not yet taken into a pass, by ticket, in arrival order.
    queue: VecDeque<(u64, Job)>,
    /// Jobs computed in a shared pass (as counted), until their sessions take them
    /// back.
    done: Vec<(u64, Job, PassRecord)>,
    next_ticket: u64,
    /// A pass is being gathered or computed.
    busy: bool,
    /// The sessions (cache ids) of the last pass: the next leader waits a moment for them.
    expected: Vec<u64>,
    /// How long the last pass took.
    last_pass: Duration,
    /// The machinery of shared passes (taken out while one computes), and where their inputs
    /// are made.
    compute: Option<Compute>,
    scratch: inputs::Scratch,
    /// Shared passes are off until then (their machinery could not be had).
    no_sharing_until: Option<Instant>,
    /// Sessions gone while the machinery was out: it forgets their graphs when it is back.
    gone: Vec<u64>,
    /// Jobs (tickets) of a shared pass that panicked.
    failed: Vec<u64>,
    /// Sessions reading a prompt, with the tokens of it left after the job they handed in.
    reading: Vec<(u64, usize)>,
    stats: SharedPasses,
}

/// The right to compute the next pass alone; dropping it lets the next one start.
pub(crate) struct Lead<'a> {
    batcher: &'a Batcher,
    started: Instant,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut s = self.batcher.lock();
        s.busy = false;
        s.last_pass = self.started.elapsed();
        self.batcher.changed.notify_all();
    }
}

/// A shared pass in flight: if its leader's thread panics, the pass's other jobs are marked
/// failed (their sessions get an error rather than wait for ever) and the next pass may start.
struct InFlight<'a> {
    batcher: &'a Batcher,
    tickets: Vec<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.tickets.is_empty() {
            return;
        }
        let mut s = self.batcher.lock();
        s.busy = false;
        s.failed.append(&mut self.tickets);
        self.batcher.changed.notify_all();
    }
}

impl Batcher {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements; a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The passes so far.
    pub(crate) fn stats(&self) -> SharedPasses {
        self.lock().stats
    }

    /// Most tokens of the next pass of session `id`, which has `rest` tokens of a prompt to
    /// read, while other sessions of the model are at work (`None` when none is: then its
    /// own batch). Tokens that all want logits (a next token and its drafts) are not a
    /// prompt: they go in one pass, in chunks of at most [`SHARED_CHUNK`].
    ///
    /// A prompt read beside others goes in chunks they can share a pass with, at most
    /// [`SHARED_CHUNK`]. Prompts read at the same time are cut so that they end in the same
    /// pass: the passes left are what the longest prompt, and all of them together, need; each
    /// prompt is spread evenly over them. Requests that came together then begin to decode
    /// together, rather than the first to finish its prompt decoding beside the rest of the
    /// others' (llama.cpp's server reads waiting prompts in one batch for the same reason).
    pub(crate) fn prompt_chunk(&self, id: u64, rest: usize, prompt: bool) -> Option<usize> {
        let s = self.lock();
        let others = s.expected.iter().any(|&e| e != id) || s.queue.iter().any(|(_, j)| j.kv.id != id);
        if !others {
            return None;
        }
        if !prompt {
            return Some(SHARED_CHUNK);
        }
        let (mut longest, mut all) = (rest, rest);
        for &(_, left) in s.reading.iter().filter(|r| r.0 != id) {
            longest = longest.max(left);
            all += left;
        }
        Some(even_chunk(rest, longest, all))
    }

    /// The session of cache `id` is gone: nobody waits for it, and no graph keeps its cache.
    pub(crate) fn leave(&self, id: u64) {
        let mut s = self.lock();
        s.expected.retain(|&e| e != id);
        s.reading.retain(|r| r.0 != id);
        match &mut s.compute {
            Some(c) => c.forget(id),
            None => s.gone.push(id),
        }
        self.changed.notify_all();
    }

    /// Hand in `job` and wait for its turn: alone (the caller computes it) or computed in a
    /// shared pass, by this thread or another.
    pub(crate) fn enter(&self, model: &Parts, job: Job) -> Turn<'_> {
        let id = job.kv.id;
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.reading.retain(|r| r.0 != id);
        if job.rest > 0 {
            s.reading.push((id, job.rest));
        }
        s.queue.push_back((ticket, job));
        self.changed.notify_all();
        loop {
            if let Some(i) = s.done.iter().position(|d| d.0 == ticket) {
                let (_, job, record) = s.done.swap_remove(i);
                return Turn::Shared(job, record);
            }
            if let Some(i) = s.failed.iter().position(|&t| t == ticket) {
                s.failed.swap_remove(i);
                return Turn::Failed;
            }
            if !s.busy && s.queue.front().is_some_and(|(t, _)| *t == ticket) {
                s.busy = true;
                s = self.gather(s, id);
                let started = Instant::now();
                let picked = pick(&s.queue, s.no_sharing_until.is_none_or(|t| started >= t));
                s.stats.passes += 1;
                tracing::trace!(
                    jobs = picked.len(),
                    queued = s.queue.len(),
                    rows = ?picked.iter().map(|&i| (s.queue[i].1.kv.id, s.queue[i].1.shape.n_tokens)).collect::<Vec<_>>(),
                    "pass"
                );
                if picked.len() == 1 {
                    let (_, job) = s.queue.pop_front().expect("the leader's job is first");
                    s.expected = vec![id];
                    return Turn::Alone(job, Lead { batcher: self, started });
                }
                let mut jobs = take_out(&mut s.queue, picked);
                // In the order of their caches, not of arrival (which changes from pass to
                // pass as the sessions' threads wake): the same sessions then make the same
                // graph, and consecutive passes reuse it instead of building and allocating
                // one each time.
                jobs.sort_by_key(|(_, j)| j.kv.id);
                s.expected = jobs.iter().map(|(_, j)| j.kv.id).collect();
                let mut compute = s.compute.take();
                let mut scratch = std::mem::take(&mut s.scratch);
                let mut in_flight = InFlight {
                    batcher: self,
                    tickets: jobs.iter().map(|(t, _)| *t).filter(|&t| t != ticket).collect(),
                };
                drop(s);
                let result = shared_pass(model, &mut compute, &mut scratch, &mut jobs);
                s = self.lock();
                in_flight.tickets.clear();
                if let Some(c) = &mut compute {
                    for id in std::mem::take(&mut s.gone) {
                        c.forget(id);
                    }
                }
                (s.compute, s.scratch) = (compute, scratch);
                s.busy = false;
                s.last_pass = started.elapsed();
                let record = match result {
                    Ok(record) => record,
                    Err(e) => {
                        // No shared pass (its machinery or its graph did not fit the budget,
                        // or ggml failed): each job goes back where it was, to run alone in
                        // turn, on memory its session has already paid for.
                        tracing::warn!("passes are not shared for {NO_SHARING_FOR:?}: {e}");
                        s.no_sharing_until = Some(Instant::now() + NO_SHARING_FOR);
                        s.stats.passes -= 1;
                        for job in jobs.into_iter().rev() {
                            s.queue.push_front(job);
                        }
                        self.changed.notify_all();
                        continue;
                    }
                };
                s.stats.shared += 1;
                s.stats.jobs += jobs.len() as u64;
                let mut mine = None;
                for (t, job) in jobs {
                    if t == ticket {
                        mine = Some(job);
                    } else {
                        s.done.push((t, job, record));
                    }
                }
                self.changed.notify_all();
                let job = mine.expect("the leader's job was in its pass");
                return Turn::Shared(job, record);
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wait, up to the gathering window, until every session of the last pass but `id` has a
    /// job in the queue.
    fn gather<'a>(&'a self, mut s: MutexGuard<'a, State>, id: u64) -> MutexGuard<'a, State> {
        let window = (s.last_pass / 4).clamp(GATHER_MIN, GATHER_MAX);
        let deadline = Instant::now() + window;
        loop {
            let missing = s.expected.iter().any(|&e| e != id && !s.queue.iter().any(|(_, j)| j.kv.id == e));
            let now = Instant::now();
            if !missing || now >= deadline {
                return s;
            }
            s = self.changed.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The jobs of the next pass, as indices into `queue`: the first (the one that waited
/// longest), and — where `share` — others with the same plan, by priority, then decoding
/// before reading a prompt (a chunk of prompt never keeps a session's next token out, as in
/// Sarathi-Serve), then arrival, while the pass stays within [`SHARED_TOKENS`] rows,
/// [`SHARED_LOGITS`] rows of logits and [`SHARED_JOBS`] sessions.
fn pick(queue: &VecDeque<(u64, Job)>, share: bool) -> Vec<usize> {
    let head = &queue[0].1;
    let mut picked = vec![0];
    let (mut tokens, mut outs) = (head.shape.n_tokens, head.shape.n_out);
    if !share || tokens > SHARED_TOKENS {
        return picked;
    }
    let mut others: Vec<usize> = (1..queue.len()).collect();
    others.sort_by_key(|&i| (queue[i].1.priority, queue[i].1.reads_prompt(), queue[i].0));
    for i in others {
        let job = &queue[i].1;
        let fits = tokens + job.shape.n_tokens <= SHARED_TOKENS && outs + job.shape.n_out <= SHARED_LOGITS;
        if picked.len() == SHARED_JOBS {
            break;
        }
        if job.plan == head.plan && fits && !picked.iter().any(|&p| queue[p].1.kv.id == job.kv.id) {
            picked.push(i);
            tokens += job.shape.n_tokens;
            outs += job.shape.n_out;
        }
    }
    picked
}

/// Rows of the next chunk of a prompt with `rest` tokens left, read beside others whose
/// prompts leave `longest` tokens at most and `all` in all: spread evenly over the passes
/// that the longest prompt needs in [`SHARED_CHUNK`]s and all of them need in passes of
/// [`PROMPT_ROWS`] — but never thinner than a quarter chunk, so that a short prompt beside a
/// long one is not drawn out over its many passes.
fn even_chunk(rest: usize, longest: usize, all: usize) -> usize {
    let passes = longest.div_ceil(SHARED_CHUNK).max(all.div_ceil(PROMPT_ROWS)).max(1);
    rest.div_ceil(passes).clamp(SHARED_CHUNK / 4, SHARED_CHUNK)
}

/// The entries of `queue` at `indices` (in any order), taken out and returned in queue order.
fn take_out<T>(queue: &mut VecDeque<T>, mut indices: Vec<usize>) -> Vec<T> {
    // From the highest index down, so that the indices still to take stay right.
    indices.sort_unstable_by(|a, b| b.cmp(a));
    let mut taken: Vec<T> = indices.iter().filter_map(|&i| queue.remove(i)).collect();
    taken.reverse();
    taken
}

/// Compute `jobs` as one pass on the model's shared machinery (made now if there is none),
/// writing each job's logits: returns what it was.
fn shared_pass(
    model: &Parts,
    compute: &mut Option<Compute>,
    scratch: &mut inputs::Scratch,
    jobs: &mut [(u64, Job)],
) -> Result<PassRecord> {
    let started = Instant::now();
    let compute = match compute {
        Some(c) => c,
        None => compute.insert(shared_compute(model, &jobs[0].1)?),
    };
    let plan = jobs[0].1.plan;
    let (threads, graph, logits) = {
        let segments: Vec<Segment<'_>> =
            jobs.iter().map(|(_, j)| Segment { kv: &j.kv, shape: j.shape }).collect();
        let (g, sched) = compute.graph(model, &plan, &segments)?;
        let data: Vec<SegmentData<'_>> = jobs
            .iter()
            .map(|(_, j)| SegmentData {
                tokens: &j.tokens,
                pos0: j.pos0,
                shape: j.shape,
                parents: &j.parents,
            })
            .collect();
        inputs::set(g, &model.hp, &data, scratch)?;
        let t0 = Instant::now();
        (sched.compute(&g.ctx)?, t0.elapsed(), g.logits)
    };
    let splits = compute.splits();
    if let Some(out) = logits {
        let n_vocab = model.hp.n_vocab;
        let mut row = 0;
        for (_, j) in jobs.iter_mut() {
            let (n, off) = (j.shape.n_out, j.row_off);
            if n > 0 {
                out.get_data_from(row * n_vocab, &mut j.logits[off * n_vocab..(off + n) * n_vocab])?;
            }
            row += n;
        }
    }
    Ok(PassRecord { threads, splits, pass: started.elapsed(), graph })
}

/// The machinery of shared passes of `model`, reserved for a pass of [`SHARED_TOKENS`] rows
/// and [`SHARED_LOGITS`] of logits at the end of `job`'s context, in the model's ledger.
fn shared_compute(model: &Parts, job: &Job) -> Result<Compute> {
    let kv = &job.kv;
    let n_tokens = SHARED_TOKENS.min(kv.n_ctx());
    let shape = PassShape::new(
        kv.n_ctx() - n_tokens,
        n_tokens,
        SHARED_LOGITS.min(n_tokens),
        kv,
        &model.hp,
        model.attention,
    );
    let what = format!("the compute buffer of {}'s shared passes", model.info.name);
    Compute::new(model, job.threads, SHARED_JOBS, &[Segment { kv, shape }], Some(&model.ledger), &what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_picked_out_of_queue_order_are_taken_out_in_queue_order() {
        // A pass picks the head, then others by priority: their indices come in any order.
        let mut queue: VecDeque<char> = "abcde".chars().collect();
        assert_eq!(take_out(&mut queue, vec![0, 3, 1]), vec!['a', 'b', 'd']);
        assert_eq!(queue, VecDeque::from(vec!['c', 'e']));
        assert_eq!(take_out(&mut queue, vec![1, 0]), vec!['c', 'e']);
        assert!(queue.is_empty());
    }

    #[test]
    fn prompts_read_together_are_cut_to_end_in_the_same_pass() {
        // Four prompts of 152, 183, 187 and 237 tokens: seven passes of at most 112 rows.
        let prompts = [152, 183, 187, 237];
        let (longest, all) = (237, prompts.iter().sum::<usize>());
        let chunks: Vec<usize> = prompts.iter().map(|&p| even_chunk(p, longest, all)).collect();
        assert_eq!(chunks, vec![22, 27, 27, 34]);
        assert!(chunks.iter().sum::<usize>() <= PROMPT_ROWS);
        for (p, c) in prompts.iter().zip(&chunks) {
            assert_eq!(p.div_ceil(*c), 7, "{p} tokens in chunks of {c}");
        }
        // Alone beside decoding sessions: chunks of SHARED_CHUNK.
        assert_eq!(even_chunk(640, 640, 640), SHARED_CHUNK);
        assert_eq!(even_chunk(1000, 1000, 1000), 63);
        assert_eq!(even_chunk(5, 5, 5), SHARED_CHUNK / 4, "the pass takes what is left");
        // A short prompt beside a long one: a quarter chunk at least.
        assert_eq!(even_chunk(30, 2000, 2030), SHARED_CHUNK / 4);
    }
}
