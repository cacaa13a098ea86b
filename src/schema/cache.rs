//! The cache of compiled ad-hoc schemas (request `response_format` / `output_config`), shared by
//! every request of one loaded bundle.
//!
//! A compile runs **outside** the cache lock: the lock is held only to look a key up and to
//! record a result, so one slow compile never holds up a request whose schema is cached or being
//! compiled by someone else. Concurrent requests for the same schema share one compile (the
//! later ones wait for the first one's result, never longer than the compile deadline plus a
//! margin). Refusals are remembered too (a bounded list), so a client that resends a schema the
//! compiler refused after its full deadline costs a lookup, not another deadline. At most
//! [`SchemaCache::max_running`] compiles run at once; a compile that cannot start within the
//! compile deadline is refused as busy.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{CompileOptions, CompiledSchema, SchemaError, Vocabulary};

/// Refusals remembered (most recent first out last).
const REFUSALS_KEPT: usize = 256;
/// How long past the compile deadline a waiter waits for another request's compile of the same
/// schema before giving up (the compile itself stops at its deadline; this only covers
/// scheduling delays).
const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// One compile in progress: its result once done.
#[derive(Default)]
struct Pending {
    result: Mutex<Option<Result<Arc<CompiledSchema>, SchemaError>>>,
    done: Condvar,
}

struct Inner {
    used: usize,
    tick: u64,
    ready: HashMap<[u8; 32], (Arc<CompiledSchema>, u64)>,
    pending: HashMap<[u8; 32], Arc<Pending>>,
    refused: VecDeque<([u8; 32], SchemaError)>,
    running: usize,
}

/// Bounded LRU of compiled ad-hoc schemas for one vocabulary, keyed by the SHA-256 of the
/// schema's compact JSON text (key order preserved: it is part of the output policy) and the
/// compile options. Shared by reference (`&self`): see the module docs for the locking.
pub struct SchemaCache {
    vocab: Arc<Vocabulary>,
    cap_bytes: usize,
    max_running: usize,
    inner: Mutex<Inner>,
    slot_free: Condvar,
}

/// What a lookup found without compiling.
pub enum Lookup {
    Hit(Arc<CompiledSchema>),
    Refused(SchemaError),
    Miss,
}

impl SchemaCache {
    /// A cache of at most `cap_bytes` of compiled schemas, running at most two compiles at once.
    pub fn new(vocab: Arc<Vocabulary>, cap_bytes: usize) -> SchemaCache {
        SchemaCache::with_concurrency(vocab, cap_bytes, 2)
    }

    /// As [`SchemaCache::new`], running at most `max_running` (≥ 1) compiles at once.
    pub fn with_concurrency(vocab: Arc<Vocabulary>, cap_bytes: usize, max_running: usize) -> SchemaCache {
        let inner = Inner { used: 0, tick: 0, ready: HashMap::new(), pending: HashMap::new(), refused: VecDeque::new(), running: 0 };
        SchemaCache { vocab, cap_bytes, max_running: max_running.max(1), inner: Mutex::new(inner), slot_free: Condvar::new() }
    }

    /// The cache key of a schema under `opts`.
    pub fn key(schema: &Value, opts: &CompileOptions) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(serde_json::to_vec(schema).unwrap_or_default());
        h.update(format!("{opts:?}").as_bytes());
        h.finalize().into()
    }

    /// Compiles running at most at once.
    pub fn max_running(&self) -> usize {
        self.max_running
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps (every update is one insert or
        // remove): keep using them.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached result for `schema`, without compiling or waiting.
    pub fn lookup(&self, schema: &Value, opts: &CompileOptions) -> Lookup {
        let key = Self::key(schema, opts);
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some((c, t)) = g.ready.get_mut(&key) {
            *t = tick;
            return Lookup::Hit(c.clone());
        }
        match g.refused.iter().find(|(k, _)| *k == key) {
            Some((_, e)) => Lookup::Refused(e.clone()),
            None => Lookup::Miss,
        }
    }

    /// Returns the cached compilation, waits for a compile of the same schema already running,
    /// or compiles (and caches) it. The compile runs on the calling thread, without the lock.
    pub fn get_or_compile(&self, schema: &Value, opts: &CompileOptions) -> Result<Arc<CompiledSchema>, SchemaError> {
        let key = Self::key(schema, opts);
        let deadline = Instant::now() + opts.max_compile_time;
        let busy = || SchemaError::TooLarge {
            pointer: String::new(),
            what: format!("time in ms waiting for one of the {} schema compiles already running", self.max_running),
            limit: opts.max_compile_time.as_millis() as usize,
        };
        let mut g = self.lock();
        loop {
            g.tick += 1;
            let tick = g.tick;
            if let Some((c, t)) = g.ready.get_mut(&key) {
                *t = tick;
                return Ok(c.clone());
            }
            if let Some((_, e)) = g.refused.iter().find(|(k, _)| *k == key) {
                return Err(e.clone());
            }
            if let Some(p) = g.pending.get(&key).cloned() {
                drop(g);
                return wait_for(&p, deadline + WAIT_MARGIN).ok_or_else(busy)?;
            }
            if g.running < self.max_running {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(busy());
            }
            g = self.slot_free.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        let pending = Arc::new(Pending::default());
        g.pending.insert(key, pending.clone());
        g.running += 1;
        drop(g);

        // Whatever happens in the compile (a panic included), the slot and the waiters are
        // released.
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| CompiledSchema::compile_with(schema, &self.vocab, opts)))
            .unwrap_or_else(|_| Err(SchemaError::Invalid { keyword: "schema".into(), pointer: String::new(), reason: "the compiler failed on this schema".into() }))
            .map(Arc::new);

        let mut g = self.lock();
        g.running -= 1;
        g.pending.remove(&key);
        match &res {
            Ok(c) => {
                let size = c.stats.bytes;
                if size <= self.cap_bytes {
                    while g.used + size > self.cap_bytes {
                        let Some(oldest) = g.ready.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) else { break };
                        if let Some((old, _)) = g.ready.remove(&oldest) {
                            g.used -= old.stats.bytes;
                        }
                    }
                    g.used += size;
                    let tick = g.tick;
                    g.ready.insert(key, (c.clone(), tick));
                }
            }
            Err(e) => {
                if g.refused.len() >= REFUSALS_KEPT {
                    g.refused.pop_front();
                }
                g.refused.push_back((key, e.clone()));
            }
        }
        drop(g);
        self.slot_free.notify_one();
        *pending.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(res.clone());
        pending.done.notify_all();
        res
    }

    /// Compiled schemas held.
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lock().used
    }

    /// Compiles running now.
    pub fn running(&self) -> usize {
        self.lock().running
    }
}

/// The result of another thread's compile, or None when it did not come by `until`.
fn wait_for(p: &Pending, until: Instant) -> Option<Result<Arc<CompiledSchema>, SchemaError>> {
    let mut r = p.result.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(res) = r.as_ref() {
            return Some(res.clone());
        }
        let now = Instant::now();
        if now >= until {
            return None;
        }
        r = p.done.wait_timeout(r, until - now).unwrap_or_else(|e| e.into_inner()).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vocab() -> Arc<Vocabulary> {
        let v = super::super::tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        Arc::new(Vocabulary::new(&v, &[eos]))
    }

    #[test]
    fn lru_by_bytes() {
        let vocab = vocab();
        let opts = CompileOptions::default();
        let one = CompiledSchema::compile_with(&json!({"type": "integer"}), &vocab, &opts).unwrap().stats().bytes;
        let cache = SchemaCache::new(vocab, one * 2 + one / 2);
        let a = cache.get_or_compile(&json!({"type": "integer"}), &opts).unwrap();
        let a2 = cache.get_or_compile(&json!({"type": "integer"}), &opts).unwrap();
        assert!(Arc::ptr_eq(&a, &a2));
        cache.get_or_compile(&json!({"type": "integer", "minimum": 1}), &opts).unwrap();
        cache.get_or_compile(&json!({"type": "integer"}), &opts).unwrap(); // touch
        cache.get_or_compile(&json!({"type": "integer", "maximum": 9}), &opts).unwrap(); // evicts minimum:1
        assert!(cache.bytes() <= one * 2 + one / 2);
        let a3 = cache.get_or_compile(&json!({"type": "integer"}), &opts).unwrap();
        assert!(Arc::ptr_eq(&a, &a3), "recently used entry kept");
        assert!(matches!(cache.lookup(&json!({"type": "integer"}), &opts), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&json!({"type": "string"}), &opts), Lookup::Miss));
        assert_ne!(SchemaCache::key(&json!({"a": 1, "b": 2}), &opts), SchemaCache::key(&json!({"b": 2, "a": 1}), &opts));
    }

    /// A `$ref` chain of `n` links: `d0 → d1 → … → d(n-1)`, the last an integer.
    pub(crate) fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let d = if i + 1 < n { json!({"$ref": format!("#/$defs/d{}", i + 1)}) } else { json!({"type": "integer"}) };
            defs.insert(format!("d{i}"), d);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// Refusals are remembered: the second request for a refused schema does not compile again.
    #[test]
    fn refusals_are_cached() {
        let cache = SchemaCache::new(vocab(), 1 << 30);
        let opts = CompileOptions::default();
        let bad = json!({"type": "string", "pattern": "(a)\\1"});
        let e1 = cache.get_or_compile(&bad, &opts).unwrap_err();
        assert!(matches!(cache.lookup(&bad, &opts), Lookup::Refused(ref e) if *e == e1));
        assert_eq!(cache.get_or_compile(&bad, &opts).unwrap_err(), e1);
    }

    /// The red-team case: a 30 000-link `$ref` chain (about 1 MiB of JSON) is refused within the
    /// deadline, naming the limit, while another thread's compiles of other schemas go on.
    #[test]
    fn long_ref_chain_is_refused_fast_and_does_not_block_other_schemas() {
        let cache = Arc::new(SchemaCache::with_concurrency(vocab(), 1 << 30, 2));
        let opts = CompileOptions { max_compile_time: Duration::from_secs(5), ..Default::default() };
        let chain = ref_chain(30_000);
        assert!(serde_json::to_vec(&chain).unwrap().len() < 1 << 20);
        let (c2, o2) = (cache.clone(), opts.clone());
        let slow = std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                let t = Instant::now();
                (c2.get_or_compile(&chain, &o2), t.elapsed())
            })
            .unwrap();
        // Meanwhile other schemas compile and are answered from the cache.
        for i in 0..20 {
            let t = Instant::now();
            cache.get_or_compile(&json!({"type": "integer", "maximum": i}), &opts).unwrap();
            assert!(t.elapsed() < Duration::from_secs(4), "schema {i} waited {:?}", t.elapsed());
        }
        let (res, took) = slow.join().unwrap();
        let e = res.unwrap_err();
        assert!(took < opts.max_compile_time + Duration::from_secs(2), "refused after {took:?}");
        let msg = e.to_string();
        assert!(matches!(e, SchemaError::TooLarge { limit, .. } if limit > 0), "{msg}");
        assert!(!msg.contains("limit 0"), "{msg}");
    }

    /// Chains the compiler accepts still compile, and fast.
    #[test]
    fn moderate_ref_chain_compiles() {
        let cache = SchemaCache::new(vocab(), 1 << 30);
        let opts = CompileOptions::default();
        let t = Instant::now();
        let c = cache.get_or_compile(&ref_chain(1000), &opts).unwrap();
        assert!(c.stats().states > 0);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// Concurrent requests for one schema share one compile.
    #[test]
    fn concurrent_requests_share_one_compile() {
        let cache = Arc::new(SchemaCache::with_concurrency(vocab(), 1 << 30, 4));
        let opts = CompileOptions::default();
        let s = json!({"type": "object", "properties": {"a": {"type": "string", "maxLength": 40}, "b": {"type": "array", "items": {"type": "integer"}}}});
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (c, s, o) = (cache.clone(), s.clone(), opts.clone());
                std::thread::spawn(move || c.get_or_compile(&s, &o).unwrap())
            })
            .collect();
        let got: Vec<Arc<CompiledSchema>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(got.iter().all(|g| Arc::ptr_eq(g, &got[0])), "one compile, one result");
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.running(), 0);
    }
}
