//! Samplers and token masks.
//!
//! Order of operations (llama.cpp's common default chain, restricted to what we support):
//! mask → penalties (repetition, frequency, presence) → greedy if `temperature == 0`, else
//! top-k → top-p → min-p → temperature → seeded draw. Greedy ties break to the lowest id.
//! Same params and seed, same inputs → same output.

use serde::Deserialize;

/// Sampling settings. `Default` is greedy with no penalties.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p`; 1 = off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top probability; 0 = off.
    pub min_p: f32,
    /// CTRL-style: logits of tokens in the history divided (if > 0) or multiplied (if < 0); 1 = off.
    pub repetition_penalty: f32,
    /// Subtract `frequency_penalty × count` of each token in the history; 0 = off.
    pub frequency_penalty: f32,
    /// Subtract `presence_penalty` once for each token present in the history; 0 = off.
    pub presence_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

/// `w[i] = exp((l_i − max) · scale)` over the candidates' logits, with the CPU's vector exp
/// (a 49k-token vocabulary per token per sequence is too many calls to libm); returns `Σ w`.
fn exps(cand: &[(u32, f32)], scale: f32, max: f32, w: &mut Vec<f32>) -> f64 {
    w.clear();
    w.extend(cand.iter().map(|&(_, l)| l * scale));
    exp_sum(w, max * scale)
}

/// The largest finite value (−∞ when there is none), vectorisable: 16 independent lanes.
fn finite_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..16 {
            let v = if c[j].is_finite() { c[j] } else { f32::NEG_INFINITY };
            m[j] = if v > m[j] { v } else { m[j] };
        }
    }
    rest.iter().copied().filter(|v| v.is_finite()).fold(m.iter().copied().fold(f32::NEG_INFINITY, f32::max), f32::max)
}

/// `x[i] = exp(x[i] − max)` in place with the CPU's vector exp; returns `Σ x` (f64).
fn exp_sum(x: &mut [f32], max: f32) -> f64 {
    static KERNELS: std::sync::OnceLock<crate::backend::cpu::kernels::Kernels> = std::sync::OnceLock::new();
    let k = KERNELS.get_or_init(crate::backend::cpu::kernels::Kernels::detect);
    (k.exp_sum)(x, max) as f64
}

/// Allowed-token bitset over a vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u64>,
    vocab: usize,
}

impl TokenMask {
    /// Every token allowed.
    pub fn new_all(vocab: usize) -> Self {
        let mut bits = vec![u64::MAX; vocab.div_ceil(64)];
        if vocab % 64 != 0 {
            if let Some(last) = bits.last_mut() {
                *last = (1u64 << (vocab % 64)) - 1;
            }
        }
        TokenMask { bits, vocab }
    }

    /// No token allowed.
    pub fn new_none(vocab: usize) -> Self {
        TokenMask { bits: vec![0; vocab.div_ceil(64)], vocab }
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Allow `token` (ignored when out of range).
    pub fn allow(&mut self, token: u32) {
        let t = token as usize;
        if t < self.vocab {
            self.bits[t / 64] |= 1 << (t % 64);
        }
    }

    /// Disallow `token` (ignored when out of range).
    pub fn disallow(&mut self, token: u32) {
        let t = token as usize;
        if t < self.vocab {
            self.bits[t / 64] &= !(1 << (t % 64));
        }
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        let t = token as usize;
        t < self.vocab && self.bits[t / 64] >> (t % 64) & 1 == 1
    }

    /// Keep only tokens allowed by both (vocabularies may differ: the result has ours).
    pub fn intersect_with(&mut self, other: &TokenMask) {
        for (i, b) in self.bits.iter_mut().enumerate() {
            *b &= other.bits.get(i).copied().unwrap_or(0);
        }
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|b| b.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&b| b == 0)
    }

    /// Set the logits of disallowed tokens to -inf (logits beyond the mask's vocab too).
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(64).enumerate() {
            let word = self.bits.get(i).copied().unwrap_or(0);
            if word == u64::MAX {
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if word >> j & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// A small, seedable PRNG (xoshiro256**, seeded through splitmix64).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A sampler: its parameters plus the RNG state.
#[derive(Debug, Clone)]
pub struct Sampler {
    p: SamplingParams,
    rng: Rng,
    /// Scratch: (token, logit) candidates and their temperature weights.
    cand: Vec<(u32, f32)>,
    weights: Vec<f32>,
}

impl Sampler {
    pub fn new(p: SamplingParams) -> Self {
        let rng = Rng::new(p.seed);
        Sampler { p, rng, cand: Vec::new(), weights: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.p
    }

    /// Pick the next token. `logits` are modified in place (mask, penalties). `history` holds the
    /// tokens penalties look at (prompt and generated so far). None when the mask allows nothing.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32], mask: Option<&TokenMask>) -> Option<u32> {
        if let Some(m) = mask {
            m.apply(logits);
        }
        self.apply_penalties(logits, history);
        if self.p.temperature <= 0.0 {
            return greedy(logits);
        }
        // Candidates: the finite logits, cut by top-k, top-p and min-p as llama.cpp's default
        // chain does (on probabilities at temperature 1, before temperature). Everything here is
        // O(vocab) except sorting what the cuts keep: a 49k-token vocabulary is never sorted
        // whole (that alone cost milliseconds per token, per sequence).
        let max = finite_max(logits);
        if !max.is_finite() {
            return None;
        }
        if self.p.top_k == 0 && self.p.top_p >= 1.0 && self.p.min_p <= 0.0 {
            return Some(self.draw_uncut(logits, max));
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)));
        let mut sorted = false;
        if self.p.top_k > 0 && self.p.top_k < cand.len() {
            cand.select_nth_unstable_by(self.p.top_k - 1, by_logit);
            cand.truncate(self.p.top_k);
        }
        if self.p.top_p < 1.0 {
            // The nucleus: the shortest prefix (in logit order) whose probability, normalised
            // over the candidates, reaches top_p. When the candidates within e^-16 of the top
            // already hold that mass (almost always), the nucleus is among them and the rest is
            // dropped unsorted; then only a growing head of what is left gets sorted.
            let total = exps(cand, 1.0, max, &mut self.weights);
            let target = self.p.top_p as f64 * total;
            const FLOOR: f32 = 1.125_351_7e-7; // e^-16
            let head: f64 = self.weights.iter().filter(|&&e| e >= FLOOR).map(|&e| e as f64).sum();
            if head >= target {
                let mut w = self.weights.iter();
                cand.retain(|_| w.next().is_some_and(|&e| e >= FLOOR));
            }
            let mut m = cand.len().min(64);
            loop {
                if m < cand.len() {
                    cand.select_nth_unstable_by(m - 1, by_logit);
                }
                cand[..m].sort_unstable_by(by_logit);
                let mut acc = 0.0f64;
                let cut = cand[..m].iter().position(|&(_, l)| {
                    acc += ((l - max) as f64).exp();
                    acc >= target
                });
                match cut {
                    Some(i) => {
                        cand.truncate(i + 1);
                        break;
                    }
                    None if m == cand.len() => break,
                    None => m = cand.len().min(m * 4),
                }
            }
            sorted = true;
        }
        if self.p.min_p > 0.0 {
            // p_i ≥ min_p · p_max  ⟺  exp(l_i − max) ≥ min_p (capped at 1: the top token stays)
            let min_p = (self.p.min_p as f64).min(1.0);
            cand.retain(|&(_, l)| ((l - max) as f64).exp() >= min_p);
        }
        if !sorted && cand.len() <= 4096 {
            cand.sort_unstable_by(by_logit); // a cut kept few: draw in logit order, as before
        }
        if cand.is_empty() {
            return None;
        }
        // Temperature, then draw (in logit order for cut lists, in id order for the whole
        // vocabulary: the same distribution either way).
        let total = exps(cand, 1.0 / self.p.temperature, max, &mut self.weights);
        let w = &self.weights;
        let mut r = self.rng.next_f64() * total;
        for (&(id, _), &wi) in cand.iter().zip(w.iter()) {
            if r < wi as f64 {
                return Some(id);
            }
            r -= wi as f64;
        }
        cand.iter().rev().zip(w.iter().rev()).find(|(_, &wi)| wi > 0.0).map(|(c, _)| c.0)
    }

    /// No cut: draw from the whole vocabulary at the temperature, in id order, straight from
    /// the logits (one vector exp pass; masked tokens, −∞, are never drawn).
    fn draw_uncut(&mut self, logits: &[f32], max: f32) -> u32 {
        let scale = 1.0 / self.p.temperature;
        let w = &mut self.weights;
        w.clear();
        w.extend(logits.iter().map(|&l| if l.is_finite() { l * scale } else { f32::NEG_INFINITY }));
        let total = exp_sum(w, max * scale);
        for (wi, &l) in w.iter_mut().zip(logits) {
            if !l.is_finite() {
                *wi = 0.0; // the vector exp floors at e^-87; a masked token gets exactly nothing
            }
        }
        // Walk 64-token blocks by their sums, then the block the draw falls in.
        let mut r = self.rng.next_f64() * total;
        const B: usize = 64;
        for (b, blk) in w.chunks(B).enumerate() {
            let sum: f32 = blk.iter().sum();
            if r >= sum as f64 {
                r -= sum as f64;
                continue;
            }
            for (j, &wi) in blk.iter().enumerate() {
                if r < wi as f64 {
                    return (b * B + j) as u32;
                }
                r -= wi as f64;
            }
        }
        // Rounding left r past the end: the last token with any weight.
        w.iter().rposition(|&x| x > 0.0).unwrap_or(0) as u32
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.p;
        if history.is_empty() || (p.repetition_penalty == 1.0 && p.frequency_penalty == 0.0 && p.presence_penalty == 0.0) {
            return;
        }
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in history {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if !l.is_finite() {
                continue;
            }
            if p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0 {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
            *l -= n as f32 * p.frequency_penalty + if n > 0 { p.presence_penalty } else { 0.0 };
        }
    }
}

/// Index of the largest logit that is neither NaN nor -inf, ties to the lowest id; None if there
/// is none. Two passes the compiler vectorizes: the maximum in 16 lanes (`v > m` is false for
/// NaN, so NaN never wins), then the first position holding it.
pub fn greedy(logits: &[f32]) -> Option<u32> {
    let pick = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = pick(*m, v);
        }
    }
    let max = chunks.remainder().iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |m, &v| pick(m, v)), |m, &v| pick(m, v));
    if max == f32::NEG_INFINITY {
        return None;
    }
    logits.iter().position(|&v| v == max).map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, ..Default::default() }
    }

    #[test]
    fn greedy_matches_a_plain_scan() {
        // The first index of the strict maximum over values other than NaN and -inf.
        let plain = |l: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &v) in l.iter().enumerate() {
                if !v.is_nan() && v != f32::NEG_INFINITY && best.map_or(true, |(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            best.map(|(i, _)| i as u32)
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in [0usize, 1, 15, 16, 17, 33, 100, 1000] {
            for _ in 0..50 {
                let l: Vec<f32> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        match state % 23 {
                            0 => f32::NAN,
                            1 => f32::NEG_INFINITY,
                            2 => f32::INFINITY,
                            r => (r % 7) as f32 - 3.0, // many ties
                        }
                    })
                    .collect();
                assert_eq!(greedy(&l), plain(&l), "{l:?}");
            }
        }
        assert_eq!(greedy(&[f32::NAN, f32::NEG_INFINITY]), None);
    }

    #[test]
    fn greedy_ties_break_low() {
        let mut l = vec![1.0, 3.0, 3.0, 2.0];
        assert_eq!(Sampler::new(params(0.0)).sample(&mut l, &[], None), Some(1));
    }

    #[test]
    fn mask_restricts_and_empty_mask_gives_none() {
        let mut m = TokenMask::new_none(70);
        m.allow(66);
        m.allow(3);
        let mut l: Vec<f32> = (0..70).map(|i| i as f32).collect();
        assert_eq!(Sampler::new(params(0.0)).sample(&mut l.clone(), &[], Some(&m)), Some(66));
        let mut other = TokenMask::new_all(70);
        other.disallow(66);
        m.intersect_with(&other);
        assert!(m.is_allowed(3) && !m.is_allowed(66) && m.count() == 1);
        assert_eq!(Sampler::new(params(0.7)).sample(&mut l, &[], Some(&m)), Some(3));
        let none = TokenMask::new_none(70);
        let mut l2 = vec![0.0; 70];
        assert_eq!(Sampler::new(params(1.0)).sample(&mut l2, &[], Some(&none)), None);
        assert_eq!(Sampler::new(params(0.0)).sample(&mut vec![0.0; 70], &[], Some(&none)), None);
    }

    #[test]
    fn new_all_covers_exactly_vocab() {
        let m = TokenMask::new_all(65);
        assert_eq!(m.count(), 65);
        assert!(m.is_allowed(64) && !m.is_allowed(65));
        let mut l = vec![0.0f32; 66];
        m.apply(&mut l);
        assert_eq!(l[65], f32::NEG_INFINITY);
        assert_eq!(l[64], 0.0);
    }

    #[test]
    fn same_seed_same_draws_and_distribution_follows_probs() {
        let logits: Vec<f32> = vec![0.0, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        let p = SamplingParams { temperature: 1.0, seed: 42, ..Default::default() };
        let run = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..3000).map(|_| s.sample(&mut logits.clone(), &[], None).unwrap_or(99)).collect::<Vec<_>>()
        };
        let a = run(&p);
        assert_eq!(a, run(&p));
        let mut counts = [0usize; 4];
        a.iter().for_each(|&t| counts[t as usize] += 1);
        assert_eq!(counts[3], 0);
        let f = |i: usize| counts[i] as f64 / 3000.0;
        assert!((f(0) - 1.0 / 6.0).abs() < 0.03 && (f(2) - 0.5).abs() < 0.03, "{counts:?}");
        let other = run(&SamplingParams { seed: 43, ..p });
        assert_ne!(a, other);
    }

    #[test]
    fn top_k_top_p_min_p_cut_the_tail() {
        let logits: Vec<f32> = vec![5.0, 4.0, 3.0, 0.0, -1.0];
        let draws = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..500 {
                seen.insert(s.sample(&mut logits.clone(), &[], None).unwrap_or(99));
            }
            seen.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(draws(SamplingParams { temperature: 5.0, top_k: 2, ..Default::default() }), vec![0, 1]);
        // p(0) ≈ 0.66, p(0)+p(1) ≈ 0.90
        assert_eq!(draws(SamplingParams { temperature: 5.0, top_p: 0.8, ..Default::default() }), vec![0, 1]);
        // min_p 0.2: p(2)/p(0) = e^-2 ≈ 0.135 is cut
        assert_eq!(draws(SamplingParams { temperature: 5.0, min_p: 0.2, ..Default::default() }), vec![0, 1]);
    }

    #[test]
    fn top_p_over_a_large_vocabulary_keeps_exactly_the_nucleus() {
        // Flat-ish logits, so the nucleus (hundreds of tokens) is found only after the sorted
        // head grows past its first 64.
        let n = 5000;
        let mut x = 12345u64;
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 * 3.0
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let max = logits[order[0]];
        let total: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let mut acc = 0.0;
        let k = order.iter().position(|&i| {
            acc += ((logits[i] - max) as f64).exp();
            acc >= 0.5 * total
        });
        let nucleus: std::collections::BTreeSet<u32> = order[..k.unwrap() + 1].iter().map(|&i| i as u32).collect();
        assert!(nucleus.len() > 256, "the test needs a large nucleus ({})", nucleus.len());
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, seed: 3, ..Default::default() });
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4000 {
            let t = s.sample(&mut logits.clone(), &[], None).unwrap();
            assert!(nucleus.contains(&t), "{t} is outside the nucleus");
            seen.insert(t);
        }
        assert!(seen.len() > nucleus.len() / 2, "draws cover the nucleus ({} of {})", seen.len(), nucleus.len());
        // min_p above 1 still keeps the top token
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, min_p: 1.5, seed: 5, ..Default::default() });
        assert_eq!(s.sample(&mut logits.clone(), &[], None), Some(order[0] as u32));
        // no cut at all: every token can come out
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: 4, ..Default::default() });
        let draws: std::collections::BTreeSet<u32> = (0..4000).map(|_| s.sample(&mut logits.clone(), &[], None).unwrap()).collect();
        assert!(draws.iter().any(|t| !nucleus.contains(t)));
    }

    #[test]
    fn penalties() {
        let p = SamplingParams { repetition_penalty: 2.0, frequency_penalty: 0.5, presence_penalty: 0.25, ..Default::default() };
        let s = Sampler::new(p);
        let mut l = vec![4.0, -2.0, 1.0];
        s.apply_penalties(&mut l, &[0, 0, 1]);
        assert_eq!(l, vec![4.0 / 2.0 - 1.0 - 0.25, -4.0 - 0.5 - 0.25, 1.0]);
        // greedy honours penalties: token 0 would win without them
        let mut s = Sampler::new(SamplingParams { presence_penalty: 10.0, ..Default::default() });
        assert_eq!(s.sample(&mut vec![4.0, 3.0], &[0], None), Some(1));
    }

    #[test]
    fn params_deserialize_with_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature":0.7,"top_k":40}"#).unwrap_or_default();
        assert_eq!(p.temperature, 0.7);
        assert_eq!(p.top_p, 1.0);
    }
}
