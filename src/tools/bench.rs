//! `applianced schema tools-bench`: the cold compile time of tool grammars, on random tool sets
//! drawn from a schema corpus' function-call argument schemas (`bfcl-…`) and hand-written
//! application schemas (`handwritten--…`), in each `tool_choice` mode.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::{Choice, Tool, ToolSpec, ToolSyntax};
use crate::schema::corpus::{Case, Percentiles};
use crate::schema::{CompileOptions, CompiledSchema, Vocabulary};

/// What the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Tools the corpus offered.
    pub pool: usize,
    pub sets: usize,
    pub tools_per_set: usize,
    /// Grammars compiled (sets × modes) and refused (by name: the messages).
    pub compiled: usize,
    pub refused: Vec<String>,
    /// Cold compile of one grammar (nothing cached), in ms: all modes, and per mode.
    pub compile_ms: Percentiles,
    pub auto_ms: Percentiles,
    pub required_ms: Percentiles,
    pub named_ms: Percentiles,
    /// Of which lowering (schema → automaton; the rest is the token masks), in ms.
    pub lower_ms: Percentiles,
    /// Automaton states per grammar.
    pub states: Percentiles,
}

/// The corpus' tools: function-call argument schemas and hand-written application schemas that
/// are object schemas.
pub fn pool(cases: &[Case]) -> Vec<Tool> {
    cases
        .iter()
        .filter(|c| c.id.starts_with("bfcl-") || c.id.starts_with("handwritten--"))
        .filter(|c| c.schema.is_object() && c.schema.get("type").is_none_or(|t| t == "object"))
        .enumerate()
        .map(|(i, c)| {
            let stem: String = c.id.rsplit("--").next().unwrap_or(&c.id).chars().map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' }).collect();
            let name: String = format!("t{i}_{stem}").chars().take(super::MAX_NAME).collect();
            Tool { name, description: c.schema.get("description").and_then(|d| d.as_str()).map(str::to_owned), parameters: c.schema.clone() }
        })
        .collect()
}

/// Compiles `sets` random sets of `k` tools from `pool` (seeded), each in `auto`, `required` and
/// named mode in `syntax`, cold (no cache), one after another as requests compile them (the
/// token-mask pass runs on the rayon pool, as in the server).
pub fn run(pool: &[Tool], vocab: &Arc<Vocabulary>, k: usize, sets: usize, seed: u64, syntax: ToolSyntax, progress: &mut dyn FnMut(usize, &str)) -> Report {
    let mut rng = seed | 1;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n.max(1) as u64) as usize
    };
    let (mut all, mut by_mode) = (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]);
    let (mut compiled, mut refused, mut states, mut lower) = (0, Vec::new(), Vec::new(), Vec::new());
    let k = k.min(pool.len());
    for s in 0..sets {
        let mut picked: Vec<Tool> = Vec::new();
        while picked.len() < k {
            let t = &pool[next(pool.len())];
            if !picked.iter().any(|p| p.name == t.name) {
                picked.push(t.clone());
            }
        }
        progress(s, &picked.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(","));
        let named = picked[next(picked.len())].name.clone();
        for (m, choice) in [Choice::Auto, Choice::Required, Choice::Named(named)].into_iter().enumerate() {
            let Ok(mut spec) = ToolSpec::new(picked.clone(), choice, true) else { continue };
            spec.syntax = syntax;
            let Some((schema, frame)) = spec.grammar() else { continue };
            let t0 = Instant::now();
            let r = CompiledSchema::compile_with(&schema, vocab, &CompileOptions { frame: Some(frame), ..Default::default() });
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            match r {
                Ok(c) => {
                    compiled += 1;
                    all.push(ms);
                    by_mode[m].push(ms);
                    states.push(c.stats().states as f64);
                    lower.push(c.stats().lower_time.as_secs_f64() * 1e3);
                }
                Err(e) => refused.push(spec.explain(&e)),
            }
        }
    }
    let [mut a, mut r, mut n] = by_mode;
    Report {
        pool: pool.len(),
        sets,
        tools_per_set: k,
        compiled,
        refused,
        compile_ms: Percentiles::of(&mut all),
        auto_ms: Percentiles::of(&mut a),
        required_ms: Percentiles::of(&mut r),
        named_ms: Percentiles::of(&mut n),
        lower_ms: Percentiles::of(&mut lower),
        states: Percentiles::of(&mut states),
    }
}
