//! Prometheus metrics, rendered in the text exposition format (version 0.0.4) by hand: a few
//! counters, gauges and fixed-bucket histograms behind one mutex (updates are per request or per
//! engine step, never per byte).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// A fixed-bucket histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }
    pub fn observe(&mut self, v: f64) {
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
    fn render(&self, out: &mut String, name: &str) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const LATENCY_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const OVERHEAD_BUCKETS: &[f64] = &[0.000025, 0.00005, 0.000075, 0.0001, 0.00015, 0.0002, 0.00025, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

#[derive(Debug)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    tokens_in: u64,
    tokens_cached: u64,
    tokens_out: u64,
    refused_peers: u64,
    queue_depth: i64,
    active_seqs: i64,
    open_connections: i64,
    connections_evicted: u64,
    connections_refused: u64,
    ttft: Histogram,
    itl: Histogram,
    request_duration: Histogram,
    overhead: Histogram,
    audit_write: Histogram,
    batch_size: Histogram,
    batch_tokens: Histogram,
    steps: u64,
    bundle: Option<BundleGauge>,
    reloads: BTreeMap<&'static str, u64>,
    last_reload_seconds: f64,
    last_switch_seconds: f64,
    retiring: i64,
}

/// The bundle being served, for the info and expiry metrics.
#[derive(Debug, Clone)]
struct BundleGauge {
    name: String,
    version: u64,
    identity: String,
    expires_unix: i64,
    warn_secs: u64,
}

/// All server metrics.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                requests: BTreeMap::new(),
                tokens_in: 0,
                tokens_cached: 0,
                tokens_out: 0,
                refused_peers: 0,
                queue_depth: 0,
                active_seqs: 0,
                open_connections: 0,
                connections_evicted: 0,
                connections_refused: 0,
                ttft: Histogram::new(LATENCY_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                request_duration: Histogram::new(LATENCY_BUCKETS),
                overhead: Histogram::new(OVERHEAD_BUCKETS),
                audit_write: Histogram::new(OVERHEAD_BUCKETS),
                batch_size: Histogram::new(BATCH_BUCKETS),
                batch_tokens: Histogram::new(&[1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0]),
                steps: 0,
                bundle: None,
                reloads: BTreeMap::new(),
                last_reload_seconds: 0.0,
                last_switch_seconds: 0.0,
                retiring: 0,
            }),
        }
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Inner)) {
        if let Ok(mut g) = self.inner.lock() {
            f(&mut g);
        }
    }
    pub fn request(&self, endpoint: &str, status: u16, seconds: f64) {
        self.with(|m| {
            *m.requests.entry((endpoint.to_string(), status)).or_default() += 1;
            m.request_duration.observe(seconds);
        });
    }
    pub fn tokens(&self, input: u64, output: u64) {
        self.with(|m| {
            m.tokens_in += input;
            m.tokens_out += output;
        });
    }
    pub fn refused_peer(&self) {
        self.with(|m| m.refused_peers += 1);
    }
    pub fn queue_depth_add(&self, d: i64) {
        self.with(|m| m.queue_depth += d);
    }
    /// Sequences started (+) or ended (−) on one engine; during a hot reload two engines report.
    pub fn active_add(&self, d: i64) {
        self.with(|m| m.active_seqs += d);
    }
    /// The bundle now serving new requests.
    pub fn set_bundle(&self, name: &str, version: u64, identity: &str, expires_unix: i64, warn_secs: u64) {
        self.with(|m| m.bundle = Some(BundleGauge { name: name.into(), version, identity: identity.into(), expires_unix, warn_secs }));
    }
    /// One SIGHUP handled: `result` is "ok", "unchanged" or "failed"; for "ok", the time from the
    /// signal to new requests going to the new bundle, and the pointer swap alone.
    pub fn reload(&self, result: &'static str, seconds: Option<(f64, f64)>) {
        self.with(|m| {
            *m.reloads.entry(result).or_default() += 1;
            if let Some((total, switch)) = seconds {
                m.last_reload_seconds = total;
                m.last_switch_seconds = switch;
            }
        });
    }
    /// Bundles replaced by a reload whose in-flight requests are still finishing.
    pub fn retiring_add(&self, d: i64) {
        self.with(|m| m.retiring += d);
    }
    pub fn connections_add(&self, d: i64) {
        self.with(|m| m.open_connections += d);
    }
    /// An idle connection closed to make room for a new one at `limits.max_connections`.
    pub fn connection_evicted(&self) {
        self.with(|m| m.connections_evicted += 1);
    }
    /// A new connection closed at once: every slot was busy.
    pub fn connection_refused(&self) {
        self.with(|m| m.connections_refused += 1);
    }
    /// One generation request's server-side work outside the engine (see
    /// `applianced_request_overhead_seconds`).
    pub fn overhead(&self, s: f64) {
        self.with(|m| m.overhead.observe(s));
    }
    /// One generation request's audit append (see `applianced_audit_write_seconds`).
    pub fn audit_write(&self, s: f64) {
        self.with(|m| m.audit_write.observe(s));
    }
    pub fn ttft(&self, s: f64) {
        self.with(|m| m.ttft.observe(s));
    }
    pub fn inter_token(&self, s: f64) {
        self.with(|m| m.itl.observe(s));
    }
    /// Prompt tokens taken from the prefix cache instead of computed.
    pub fn prompt_cached(&self, n: usize) {
        self.with(|m| m.tokens_cached += n as u64);
    }
    pub fn step(&self, seqs: usize, tokens: usize) {
        self.with(|m| {
            m.steps += 1;
            m.batch_size.observe(seqs as f64);
            m.batch_tokens.observe(tokens as f64);
        });
    }

    /// Prometheus text format.
    /// `audit_writable`: None without an audit log.
    pub fn render(&self, ready: bool, audit_writable: Option<bool>) -> String {
        let Ok(m) = self.inner.lock() else { return String::new() };
        let mut o = String::new();
        let head = |o: &mut String, name: &str, ty: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {ty}");
        };
        head(&mut o, "applianced_requests_total", "counter", "HTTP requests by endpoint and status code.");
        for ((ep, st), n) in &m.requests {
            let _ = writeln!(o, "applianced_requests_total{{endpoint=\"{}\",status=\"{st}\"}} {n}", escape(ep));
        }
        head(&mut o, "applianced_request_duration_seconds", "histogram", "Time from request to the end of its response.");
        m.request_duration.render(&mut o, "applianced_request_duration_seconds");
        head(&mut o, "applianced_request_overhead_seconds", "histogram", "Server work per completed generation request outside the engine, in CPU time of the threads doing it: JSON parse, checks, template and tokenize up to the submission to the scheduler, building every response event or the body, and the audit record's fields; the audit append itself is applianced_audit_write_seconds.");
        m.overhead.render(&mut o, "applianced_request_overhead_seconds");
        head(&mut o, "applianced_audit_write_seconds", "histogram", "CPU time of appending one generation request's audit record: serialize, hash, lock, write and (fsync = \"always\") fdatasync; the wait for the disk is not CPU time.");
        m.audit_write.render(&mut o, "applianced_audit_write_seconds");
        head(&mut o, "applianced_prompt_tokens_total", "counter", "Prompt tokens processed.");
        let _ = writeln!(o, "applianced_prompt_tokens_total {}", m.tokens_in);
        head(&mut o, "applianced_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV cache was taken or copied from the prefix cache (limits.prefix_cache_tokens) instead of computed; included in applianced_prompt_tokens_total.");
        let _ = writeln!(o, "applianced_prompt_tokens_cached_total {}", m.tokens_cached);
        head(&mut o, "applianced_generated_tokens_total", "counter", "Tokens generated.");
        let _ = writeln!(o, "applianced_generated_tokens_total {}", m.tokens_out);
        head(&mut o, "applianced_refused_peers_total", "counter", "Requests refused by the peer-credential allowlist.");
        let _ = writeln!(o, "applianced_refused_peers_total {}", m.refused_peers);
        head(&mut o, "applianced_queue_depth", "gauge", "Requests waiting for a sequence slot.");
        let _ = writeln!(o, "applianced_queue_depth {}", m.queue_depth.max(0));
        head(&mut o, "applianced_active_sequences", "gauge", "Sequences being prefilled or decoded.");
        let _ = writeln!(o, "applianced_active_sequences {}", m.active_seqs);
        head(&mut o, "applianced_open_connections", "gauge", "Open client connections.");
        let _ = writeln!(o, "applianced_open_connections {}", m.open_connections.max(0));
        head(&mut o, "applianced_connections_evicted_total", "counter", "Idle connections closed to make room for new ones at limits.max_connections.");
        let _ = writeln!(o, "applianced_connections_evicted_total {}", m.connections_evicted);
        head(&mut o, "applianced_connections_refused_total", "counter", "New connections closed at once because every connection slot was busy.");
        let _ = writeln!(o, "applianced_connections_refused_total {}", m.connections_refused);
        head(&mut o, "applianced_ready", "gauge", "1 when the model is loaded and requests are accepted (0 while loading, draining, expired, or while the audit log cannot be written).");
        let _ = writeln!(o, "applianced_ready {}", u8::from(ready));
        if let Some(w) = audit_writable {
            head(&mut o, "applianced_audit_writable", "gauge", "1 when the last audit append succeeded; 0 after a failed (rolled-back) write until a retry succeeds.");
            let _ = writeln!(o, "applianced_audit_writable {}", u8::from(w));
        }
        head(&mut o, "applianced_engine_steps_total", "counter", "Engine forward steps.");
        let _ = writeln!(o, "applianced_engine_steps_total {}", m.steps);
        head(&mut o, "applianced_batch_size", "histogram", "Sequences per engine step.");
        m.batch_size.render(&mut o, "applianced_batch_size");
        head(&mut o, "applianced_batch_tokens", "histogram", "Tokens per engine step (decode tokens plus prefill chunk).");
        m.batch_tokens.render(&mut o, "applianced_batch_tokens");
        if let Some(b) = &m.bundle {
            let now = time::OffsetDateTime::now_utc().unix_timestamp();
            head(&mut o, "applianced_bundle_info", "gauge", "The bundle serving new requests (always 1; the labels carry its name, version and identity).");
            let _ = writeln!(o, "applianced_bundle_info{{name=\"{}\",version=\"{}\",identity=\"{}\"}} 1", escape(&b.name), b.version, escape(&b.identity));
            head(&mut o, "applianced_bundle_expiry_timestamp_seconds", "gauge", "Signed expiry time of the serving bundle (Unix seconds).");
            let _ = writeln!(o, "applianced_bundle_expiry_timestamp_seconds {}", b.expires_unix);
            head(&mut o, "applianced_bundle_expiring", "gauge", "1 from [expiry] warn_secs before the serving bundle expires.");
            let _ = writeln!(o, "applianced_bundle_expiring {}", u8::from(now >= b.expires_unix.saturating_sub(b.warn_secs as i64)));
            head(&mut o, "applianced_bundle_expired", "gauge", "1 once the serving bundle has expired.");
            let _ = writeln!(o, "applianced_bundle_expired {}", u8::from(now >= b.expires_unix));
        }
        head(&mut o, "applianced_reloads_total", "counter", "SIGHUP reloads by result: ok (switched), unchanged (already serving the active bundle), failed (old bundle kept).");
        for r in ["ok", "unchanged", "failed"] {
            let _ = writeln!(o, "applianced_reloads_total{{result=\"{r}\"}} {}", m.reloads.get(r).copied().unwrap_or(0));
        }
        head(&mut o, "applianced_last_reload_seconds", "gauge", "Last successful reload: from SIGHUP to new requests going to the new bundle (verify + load + switch).");
        let _ = writeln!(o, "applianced_last_reload_seconds {}", m.last_reload_seconds);
        head(&mut o, "applianced_last_reload_switch_seconds", "gauge", "Last successful reload: the switch of new requests to the loaded bundle alone.");
        let _ = writeln!(o, "applianced_last_reload_switch_seconds {}", m.last_switch_seconds);
        head(&mut o, "applianced_retiring_bundles", "gauge", "Replaced bundles still finishing in-flight requests (unmapped when they are done).");
        let _ = writeln!(o, "applianced_retiring_bundles {}", m.retiring.max(0));
        head(&mut o, "applianced_time_to_first_token_seconds", "histogram", "Time from request admission to the first generated token.");
        m.ttft.render(&mut o, "applianced_time_to_first_token_seconds");
        head(&mut o, "applianced_inter_token_seconds", "histogram", "Time between consecutive generated tokens of a sequence.");
        m.itl.render(&mut o, "applianced_inter_token_seconds");
        o
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn renders() {
        let m = Metrics::default();
        m.request("/v1/messages", 200, 0.3);
        m.ttft(0.02);
        m.step(3, 40);
        m.set_bundle("x", 2, "sha256:ab", 0, 60);
        m.reload("ok", Some((1.5, 0.000002)));
        let t = m.render(true, Some(true));
        assert!(t.contains("applianced_bundle_info{name=\"x\",version=\"2\",identity=\"sha256:ab\"} 1"));
        assert!(t.contains("applianced_bundle_expired 1"));
        assert!(t.contains("applianced_reloads_total{result=\"ok\"} 1"));
        assert!(t.contains("applianced_last_reload_seconds 1.5"));
        assert!(t.contains("applianced_requests_total{endpoint=\"/v1/messages\",status=\"200\"} 1"));
        assert!(t.contains("applianced_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
        assert!(t.contains("applianced_batch_size_count 1"));
    }
}
