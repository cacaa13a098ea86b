//! The engine thread and its continuous-batching scheduler.
//!
//! One OS thread owns the [`Engine`]. Requests arrive through a bounded queue ([`Scheduler::submit`]
//! fails with [`SubmitError::Full`] → 429). Each loop iteration is one engine step:
//!
//! 1. admit queued requests while sequence slots are free (requests whose client is gone are
//!    dropped here), and drop active sequences whose client went away (their KV cache is freed);
//! 2. build ONE batch: the pending decode token of every decoding sequence, plus up to
//!    `prefill_chunk` prompt tokens of the sequences still prefilling (oldest first), so a long
//!    prompt never stalls running streams for more than one chunk;
//! 3. one [`Engine::forward`]; for every sequence whose input ended at a generated position, one
//!    [`SeqGen::step`] (the runtime's generation step: constraints, sampling, detokenizing, stop
//!    sequences, the text pipeline) and its text streamed to the request's channel.
//!
//! A sequence finishes on an end-of-generation id (`end_turn`), a stop sequence (`stop_sequence`,
//! whose text is never sent), `max_tokens`, or a full context (reported as `max_tokens`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use crate::engine::{same_steering, Engine, Logits, SeqId};
pub use crate::runtime::StopReason;
use crate::runtime::{End, SeqGen};

/// The end of a successful generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: StopReason,
    /// The stop sequence that matched (for `StopSequence`).
    pub stop_sequence: Option<String>,
    pub output_tokens: usize,
    /// Prompt tokens taken from the prefix cache (included in the prompt's count).
    pub cached_tokens: usize,
    /// Admission to first token.
    pub ttft: Option<Duration>,
}

/// Why generation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenError {
    /// Cancelled by server shutdown after the drain deadline.
    Shutdown,
    Engine(String),
}

/// What the engine thread sends back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Text(String),
    Done(Finish),
    Error(GenError),
}

/// One generation request, typed and checked by the HTTP layer.
pub struct GenRequest {
    /// The prompt and everything the answer is held to ([`crate::runtime::LoadedBundle::generation`]).
    pub gen: SeqGen,
    pub events: UnboundedSender<Event>,
    pub admitted: Instant,
    /// Tokens of mandatory text, counted in usage as output.
    pub extra_output_tokens: usize,
    /// The preset's control vectors, added to this sequence's residual stream.
    pub steering: Option<Arc<crate::engine::Steering>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    Full,
    Closed,
}

/// What the loaded model offers the HTTP layer.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub max_context: usize,
    pub backend: String,
}

#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    pub max_seqs: usize,
    pub queue_size: usize,
    pub prefill_chunk: usize,
    /// Longest prompt prefix kept for reuse in one extra engine sequence (0 = off).
    pub prefix_cache_tokens: usize,
}

/// Prompts shorter than this are not worth a cache entry or a copy.
const MIN_PREFIX: usize = 8;

/// The prefix cache: one engine sequence whose KV holds `tokens` at positions `0..tokens.len()`
/// (the last completed prompt's first tokens).
///
/// The sequence is either idle (the cache's own) or **lent**: it is an active request's own
/// sequence. Nothing is copied to fill the cache: the sequence that has just computed a prompt
/// becomes the cache while it goes on generating, since it only writes after its prompt. A new
/// request whose prompt shares the cached start takes an idle cache's sequence as its own,
/// truncated to the shared part, again without a copy (an agent's next turn sends the same tools
/// and history). Only a request that arrives while the cache is lent copies the shared part. A
/// lent sequence comes back as the idle cache when its request ends, truncated to `tokens`.
struct Prefix {
    seq: SeqId,
    tokens: Vec<u32>,
    steering: Option<Arc<crate::engine::Steering>>,
    /// `seq` is an active request's (see above).
    lent: bool,
}

/// Prompt tokens of one sequence to feed in a step with `budget` left, `rest` still to feed.
/// Never a chunk of one token out of a longer rest, nor a rest of one left behind: the engine
/// takes its single-row (decode) attention path for a one-token chunk, whose rounding differs
/// slightly from the prompt path's, and an answer must not depend on how the prompt happened to
/// be split (by the other requests in the batch, or by the prefix cache). May exceed a budget
/// under three by up to two tokens.
fn prompt_chunk(budget: usize, rest: usize) -> usize {
    let mut n = budget.min(rest);
    if n == 0 || n == rest {
        return n;
    }
    n = n.max(2);
    if rest - n == 1 {
        n = if n >= 3 { n - 1 } else { rest };
    }
    n
}

/// Whether the engine's backend copies KV prefixes (probed on two empty sequences).
fn can_copy_prefix(engine: &mut Engine) -> bool {
    let Ok(a) = engine.new_seq() else { return false };
    let ok = match engine.new_seq() {
        Ok(b) => {
            let ok = matches!(engine.copy_prefix(a, b, 0), Ok(true));
            engine.free_seq(b);
            ok
        }
        Err(_) => false,
    };
    engine.free_seq(a);
    ok
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Handle to the engine thread.
#[derive(Clone)]
pub struct Scheduler {
    tx: SyncSender<GenRequest>,
    cancel_all: Arc<AtomicBool>,
    heartbeat: Arc<AtomicU64>,
    started: Instant,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// Start the engine thread; `load` runs on it. `on_loaded` gets the load result.
    pub fn spawn(
        opts: SchedulerOptions,
        metrics: Arc<Metrics>,
        load: Box<dyn FnOnce() -> Result<Engine, String> + Send>,
        on_loaded: Box<dyn FnOnce(Result<EngineInfo, String>) + Send>,
    ) -> std::io::Result<(Scheduler, std::thread::JoinHandle<()>)> {
        let (tx, rx) = std::sync::mpsc::sync_channel(opts.queue_size.max(1));
        let cancel_all = Arc::new(AtomicBool::new(false));
        let heartbeat = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let sched = Scheduler { tx, cancel_all: cancel_all.clone(), heartbeat: heartbeat.clone(), started, metrics: metrics.clone() };
        let beat = sched.clone();
        let handle = std::thread::Builder::new().name("applianced-engine".into()).spawn(move || {
            let engine = match load() {
                Ok(e) => e,
                Err(msg) => {
                    on_loaded(Err(msg));
                    return;
                }
            };
            on_loaded(Ok(EngineInfo { max_context: engine.max_context(), backend: engine.backend_description() }));
            let mut l = Loop::new(engine, opts, metrics, cancel_all, rx);
            l.run(&beat);
        })?;
        Ok((sched, handle))
    }

    /// Queue a request; never blocks.
    pub fn submit(&self, r: GenRequest) -> Result<(), SubmitError> {
        self.metrics.queue_depth_add(1);
        match self.tx.try_send(r) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queue_depth_add(-1);
                Err(match e {
                    TrySendError::Full(_) => SubmitError::Full,
                    TrySendError::Disconnected(_) => SubmitError::Closed,
                })
            }
        }
    }

    /// Cancel every active and queued request (final event: `GenError::Shutdown`) and stop.
    pub fn cancel_all(&self) {
        self.cancel_all.store(true, Ordering::SeqCst);
    }

    /// Time since the engine loop last went round (None before the model is loaded).
    pub fn heartbeat_age(&self) -> Option<Duration> {
        let b = self.heartbeat.load(Ordering::Relaxed);
        if b == 0 {
            return None;
        }
        Some(self.started.elapsed().saturating_sub(Duration::from_millis(b)))
    }

    fn beat(&self) {
        self.heartbeat.store((self.started.elapsed().as_millis() as u64).max(1), Ordering::Relaxed);
    }
}

enum Phase {
    /// Next prompt position to feed.
    Prefill(usize),
    /// Token sampled last, to feed next.
    Decode(u32),
}

struct Seq {
    id: SeqId,
    req: GenRequest,
    phase: Phase,
    last_token_at: Option<Instant>,
    ttft: Option<Duration>,
    /// Prompt tokens copied from the prefix cache.
    cached: usize,
}

struct Loop {
    engine: Engine,
    opts: SchedulerOptions,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    rx: Receiver<GenRequest>,
    max_context: usize,
    active: Vec<Seq>,
    /// The step's logits, one buffer reused by every step.
    logits: Logits,
    /// What this engine last added to the shared active-sequences gauge.
    reported_active: usize,
    /// The prefix cache (`None` until a prompt fills it, or when it is off or the backend has no
    /// KV copy).
    prefix: Option<Prefix>,
    prefix_on: bool,
}

impl Loop {
    fn new(mut engine: Engine, opts: SchedulerOptions, metrics: Arc<Metrics>, cancel_all: Arc<AtomicBool>, rx: Receiver<GenRequest>) -> Loop {
        let max_context = engine.max_context();
        // The cache only runs on a backend that can also copy a prefix (the CPU's): there a
        // reused prefix is the same numbers as a recomputed one (batch-invariant kernels, test
        // `copied_prefix_equals_recomputed`). CUDA and WebGPU have no copy, and that sameness
        // is not established there: no cache, as before the cache lent its sequences.
        let prefix_on = opts.prefix_cache_tokens >= MIN_PREFIX && can_copy_prefix(&mut engine);
        Loop { engine, opts, metrics, cancel_all, rx, max_context, active: Vec::new(), reported_active: 0, logits: Logits::default(), prefix: None, prefix_on }
    }

    fn run(&mut self, beat: &Scheduler) {
        loop {
            beat.beat();
            if self.cancel_all.load(Ordering::SeqCst) {
                self.shutdown();
                return;
            }
            if !self.admit() {
                // Queue closed (server gone) and nothing active.
                return;
            }
            self.drop_cancelled();
            self.report_active(self.active.len());
            if self.active.is_empty() {
                continue;
            }
            self.step();
        }
    }

    fn report_active(&mut self, n: usize) {
        if n != self.reported_active {
            self.metrics.active_add(n as i64 - self.reported_active as i64);
            self.reported_active = n;
        }
    }

    fn shutdown(&mut self) {
        for s in self.active.drain(..) {
            let _ = s.req.events.send(Event::Error(GenError::Shutdown));
            self.engine.free_seq(s.id);
        }
        while let Ok(r) = self.rx.try_recv() {
            self.metrics.queue_depth_add(-1);
            let _ = r.events.send(Event::Error(GenError::Shutdown));
        }
        self.report_active(0);
    }

    /// Take queued requests while slots are free. Waits briefly when idle. False when the queue is
    /// closed and nothing is left to do.
    fn admit(&mut self) -> bool {
        while self.active.len() < self.opts.max_seqs {
            let r = if self.active.is_empty() {
                match self.rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(r) => r,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return true,
                }
            };
            self.metrics.queue_depth_add(-1);
            if r.events.is_closed() {
                continue;
            }
            let n = r.gen.prompt().len();
            if n == 0 || n + 1 > self.max_context {
                let _ = r.events.send(Event::Error(GenError::Engine(format!(
                    "prompt of {n} tokens does not fit the context of {}",
                    self.max_context
                ))));
                continue;
            }
            if let Some((id, start)) = self.take_prefix(&r) {
                self.active.push(Seq { id, req: r, phase: Phase::Prefill(start), last_token_at: None, ttft: None, cached: start });
                continue;
            }
            let seq = self.engine.new_seq().and_then(|id| match self.engine.set_steering(id, r.steering.clone()) {
                Ok(()) => Ok(id),
                Err(e) => {
                    self.engine.free_seq(id);
                    Err(e)
                }
            });
            match seq {
                Ok(id) => {
                    let start = self.reuse_prefix(id, &r);
                    self.active.push(Seq {
                        id,
                        req: r,
                        phase: Phase::Prefill(start),
                        last_token_at: None,
                        ttft: None,
                        cached: start,
                    });
                }
                Err(e) => {
                    let _ = r.events.send(Event::Error(GenError::Engine(e.to_string())));
                }
            }
        }
        true
    }

    /// Positions of the cached prefix a prompt can reuse (at least two prompt tokens are left
    /// to compute, see `prompt_chunk`); 0 when too few to be worth it.
    fn shared(p: &Prefix, prompt: &[u32]) -> usize {
        let n = common_prefix(&p.tokens, prompt).min(prompt.len().saturating_sub(2));
        if n < MIN_PREFIX {
            0
        } else {
            n
        }
    }

    /// Take an idle cache's sequence for a new request whose prompt shares its start (no copy):
    /// the sequence is truncated to the shared part and lent. Returns it and the first position
    /// to prefill.
    fn take_prefix(&mut self, r: &GenRequest) -> Option<(SeqId, usize)> {
        let p = self.prefix.as_mut().filter(|p| !p.lent && same_steering(&p.steering, &r.steering))?;
        let n = Self::shared(p, r.gen.prompt());
        if n == 0 {
            return None;
        }
        if self.engine.truncate_seq(p.seq, n).is_err() {
            // A sliding-window layer no longer holds what position `n` sees: the cache is spent.
            self.engine.free_seq(p.seq);
            self.prefix = None;
            return None;
        }
        p.tokens.truncate(n);
        p.lent = true;
        self.metrics.prompt_cached(n);
        Some((p.seq, n))
    }

    /// The end of an active request's sequence: back to the idle cache if it is lent, freed
    /// otherwise.
    fn release(&mut self, id: SeqId) {
        if let Some(p) = self.prefix.as_mut().filter(|p| p.lent && p.seq == id) {
            if self.engine.truncate_seq(id, p.tokens.len()).is_ok() {
                p.lent = false;
                return;
            }
            self.prefix = None;
        }
        self.engine.free_seq(id);
    }

    /// Copy the cached prefix a new sequence's prompt shares (the cache is lent, or has other
    /// control vectors); returns the first position to prefill.
    fn reuse_prefix(&mut self, id: SeqId, r: &GenRequest) -> usize {
        // `copy_prefix` itself refuses (Ok(false)) a cache with other control vectors than `id`'s.
        let Some(p) = self.prefix.as_ref() else { return 0 };
        let n = Self::shared(p, r.gen.prompt());
        if n == 0 {
            return 0;
        }
        match self.engine.copy_prefix(p.seq, id, n) {
            Ok(true) => {
                self.metrics.prompt_cached(n);
                n
            }
            _ => 0,
        }
    }

    /// After a step: the first prompt that completed in it becomes the cached prefix (unless
    /// the cache already holds all of it). Its sequence is lent to the cache as it is: no copy.
    fn keep_prefix(&mut self, prompt_done: Option<usize>) {
        let Some(i) = prompt_done else { return };
        let s = &self.active[i];
        let prompt = s.req.gen.prompt();
        let n = prompt.len().min(self.opts.prefix_cache_tokens);
        if n < MIN_PREFIX {
            return;
        }
        if let Some(p) = self.prefix.as_mut() {
            if p.lent && p.seq == s.id {
                // The cache was lent to this request at its shared start: it now holds the rest.
                p.tokens = prompt[..n].to_vec();
                return;
            }
            if same_steering(&p.steering, &s.req.steering) && common_prefix(&p.tokens, &prompt[..n]) == n {
                return;
            }
        }
        // An idle cache's sequence is freed; a lent one stays its request's.
        if let Some(p) = self.prefix.take().filter(|p| !p.lent) {
            self.engine.free_seq(p.seq);
        }
        let s = &self.active[i];
        self.prefix = Some(Prefix { seq: s.id, tokens: prompt[..n].to_vec(), steering: s.req.steering.clone(), lent: true });
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].req.events.is_closed() {
                let s = self.active.remove(i);
                self.release(s.id);
            } else {
                i += 1;
            }
        }
    }

    fn step(&mut self) {
        // (active index, tokens, ends at a position we sample from)
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::with_capacity(self.active.len());
        let mut budget = self.opts.prefill_chunk;
        for (i, s) in self.active.iter().enumerate() {
            if let Phase::Decode(t) = s.phase {
                plan.push((i, vec![t], true));
            }
        }
        for (i, s) in self.active.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if let Phase::Prefill(pos) = s.phase {
                let prompt = s.req.gen.prompt();
                let n = prompt_chunk(budget, prompt.len() - pos);
                plan.push((i, prompt[pos..pos + n].to_vec(), pos + n == prompt.len()));
                budget = budget.saturating_sub(n);
            }
        }
        // A sequence whose prompt ends in this step: its KV then holds the whole prompt.
        let prompt_done = plan.iter().find(|(i, _, end)| *end && matches!(self.active[*i].phase, Phase::Prefill(_))).map(|p| p.0).filter(|_| self.prefix_on);
        let batch: Vec<(SeqId, &[u32])> = plan.iter().map(|(i, t, _)| (self.active[*i].id, t.as_slice())).collect();
        let n_tokens: usize = plan.iter().map(|p| p.1.len()).sum();
        self.metrics.step(plan.len(), n_tokens);
        if let Err(e) = self.engine.forward_into(&batch, &mut self.logits) {
            let msg = e.to_string();
            let mut failed: Vec<usize> = plan.iter().map(|p| p.0).collect();
            failed.sort_unstable();
            for i in failed.into_iter().rev() {
                let s = self.active.remove(i);
                let _ = s.req.events.send(Event::Error(GenError::Engine(msg.clone())));
                self.release(s.id);
            }
            return;
        }
        self.keep_prefix(prompt_done);
        // Per-sequence work after the step (masks, sampling, detokenizing, stop strings, events)
        // runs on the engine's pool, whose compute threads would otherwise wait for it.
        let mut slots: Vec<Option<&mut Seq>> = self.active.iter_mut().map(Some).collect();
        let work: Vec<(usize, &mut Seq, usize, bool, &mut [f32])> = plan
            .iter()
            .zip(self.logits.rows_mut())
            .filter_map(|((i, toks, sample), lg)| Some((*i, slots[*i].take()?, toks.len(), *sample, lg)))
            .collect();
        let ctx = After { metrics: &self.metrics };
        let mut finished: Vec<usize> = self.engine.install(|| {
            work.into_par_iter().filter_map(|(i, s, n, sample, lg)| ctx.seq(s, n, sample, lg).then_some(i)).collect()
        });
        finished.sort_unstable();
        finished.dedup();
        for i in finished.into_iter().rev() {
            let s = self.active.remove(i);
            self.release(s.id);
        }
    }
}

/// What the per-sequence work after a step reads (shared by the pool's threads).
struct After<'a> {
    metrics: &'a Metrics,
}

impl After<'_> {
    /// Consume one sequence's logits after a step that fed it `n` tokens (`sample`: they end
    /// where a token is drawn). `true` when the sequence is finished.
    fn seq(&self, s: &mut Seq, n: usize, sample: bool, lg: &mut [f32]) -> bool {
        if let Phase::Prefill(pos) = s.phase {
            if !sample {
                s.phase = Phase::Prefill(pos + n);
                return false;
            }
        }
        let now = Instant::now();
        let step = s.req.gen.step(lg);
        if step.sampled.is_some() {
            match s.last_token_at {
                None => {
                    let t = now.duration_since(s.req.admitted);
                    s.ttft = Some(t);
                    self.metrics.ttft(t.as_secs_f64());
                }
                Some(prev) => self.metrics.inter_token(now.duration_since(prev).as_secs_f64()),
            }
            s.last_token_at = Some(now);
        }
        if !step.text.is_empty() && s.req.events.send(Event::Text(step.text)).is_err() {
            return true; // client gone: free at once
        }
        match (step.end, step.sampled) {
            (None, Some(tok)) => {
                s.phase = Phase::Decode(tok);
                false
            }
            (end, _) => {
                let end = end.unwrap_or(End { reason: StopReason::EndTurn, stop_sequence: None });
                finish(s, end, self.metrics);
                true
            }
        }
    }
}

/// Report a finished sequence: usage counts and the final event.
fn finish(s: &mut Seq, end: End, metrics: &Metrics) {
    let out = s.req.gen.generated().len() + s.req.extra_output_tokens;
    metrics.tokens(s.req.gen.prompt().len() as u64, out as u64);
    let _ = s.req.events.send(Event::Done(Finish { reason: end.reason, stop_sequence: end.stop_sequence, output_tokens: out, cached_tokens: s.cached, ttft: s.ttft }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_chunks_never_split_off_one_token() {
        for rest in 1..40usize {
            for budget in 0..40usize {
                let n = prompt_chunk(budget, rest);
                assert!(n <= rest && n <= budget.max(3), "budget {budget} rest {rest}: {n}");
                if rest > 1 && n > 0 {
                    assert!(n >= 2 && rest - n != 1, "budget {budget} rest {rest}: {n}");
                }
                if budget >= 2 {
                    assert!(n > 0, "budget {budget} rest {rest}: no progress");
                }
            }
        }
    }
}
