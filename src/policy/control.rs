//! Control vectors: per-layer steering vectors added to the residual stream (representation
//! engineering / activation addition), stored in bundles as `control/<name>.safetensors`
//! (FORMAT.md §10.3).
//!
//! - [`train`] computes one from contrastive prompt pairs with the bundle's own model: for each
//!   pair, the residual stream after every layer at the last prompt token, positive minus
//!   negative; per layer the mean difference ([`Method::Mean`]) or the first principal component
//!   of the differences scaled to the mean's projection ([`Method::Pca`]).
//! - [`ControlVector::import_llamacpp`] reads llama.cpp's control-vector GGUF (`direction.N`).
//! - [`steering`] sums a preset's vectors with their strengths into one [`Steering`] the engine
//!   adds at the output of each layer, as llama.cpp does (`direction.N` after layer `N`).
//! - [`answer_nll`] is the measuring tool: the unsteered model's negative log-likelihood of given
//!   answers (the answers themselves come from the runtime's one generation step,
//!   [`crate::runtime::generate::generate_batch`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineError, SeqId, Steering};
use crate::tokenizer::PromptBuilder;

/// Header metadata key holding [`ControlMeta`] as JSON (the only metadata key).
pub const META_KEY: &str = "applianced.control_vector";
/// Largest accepted |value| in a stored vector (hidden states of real models stay far below).
pub const MAX_ABS: f32 = 1.0e4;
/// Most layers a vector may address.
pub const MAX_LAYERS: usize = 1024;
/// Largest hidden size accepted.
pub const MAX_HIDDEN: usize = 65536;
/// Prompt tokens per forward step when prefilling.
const PREFILL_CHUNK: usize = 256;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{what}: {reason}")]
    Format { what: String, reason: String },
    #[error("pairs file {path}, line {line}: {reason}")]
    Pairs { path: PathBuf, line: usize, reason: String },
    #[error("control vector `{name}` does not fit the model: {reason}")]
    Mismatch { name: String, reason: String },
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("prompt: {0}")]
    Prompt(String),
}

fn fmt_err(what: &str, reason: impl ToString) -> ControlError {
    ControlError::Format { what: what.to_string(), reason: reason.to_string() }
}

/// How a vector was made, for `inspect` and audits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlMeta {
    /// Always 1.
    pub format: u32,
    pub hidden_size: usize,
    /// Layers of the model it was made for (vectors address `0..n_layers`).
    pub n_layers: usize,
    /// `mean`, `pca` or `imported`.
    pub method: String,
    /// Free text: what it was made from (e.g. `48 pairs from concise-pairs.jsonl`).
    pub source: String,
}

/// One control vector: for some layers `l`, a vector of `hidden_size` values.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlVector {
    pub meta: ControlMeta,
    pub layers: BTreeMap<usize, Vec<f32>>,
}

impl ControlVector {
    /// Safetensors bytes: tensors `direction.<l>` (F32, shape `[hidden_size]`) in ascending layer
    /// order, one metadata key [`META_KEY`]. Deterministic.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ControlError> {
        use safetensors::tensor::{Dtype, TensorView};
        let data: Vec<(String, Vec<u8>)> =
            self.layers.iter().map(|(l, v)| (format!("direction.{l}"), v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
        let mut views = Vec::with_capacity(data.len());
        for (name, bytes) in &data {
            let v = TensorView::new(Dtype::F32, vec![self.meta.hidden_size], bytes).map_err(|e| fmt_err(name, e))?;
            views.push((name.clone(), v));
        }
        let mut md = std::collections::HashMap::new();
        md.insert(META_KEY.to_string(), serde_json::to_string(&self.meta).map_err(|e| fmt_err("metadata", e))?);
        safetensors::serialize(views, &Some(md)).map_err(|e| fmt_err("safetensors", e))
    }

    /// Parse and validate (`what` names the file or member in errors).
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<ControlVector, ControlError> {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| fmt_err(what, format!("not a safetensors file: {e}")))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| fmt_err(what, e))?;
        let meta: ControlMeta = match header.metadata().as_ref().and_then(|m| m.get(META_KEY)) {
            Some(s) => serde_json::from_str(s).map_err(|e| fmt_err(what, format!("bad {META_KEY} metadata: {e}")))?,
            None => return Err(fmt_err(what, format!("missing header metadata {META_KEY} (llama.cpp GGUF vectors go through `control-vector import`)"))),
        };
        if meta.format != 1 {
            return Err(fmt_err(what, format!("format {} is not supported (only 1)", meta.format)));
        }
        if meta.hidden_size == 0 || meta.hidden_size > MAX_HIDDEN || meta.n_layers == 0 || meta.n_layers > MAX_LAYERS {
            return Err(fmt_err(what, format!("hidden_size {} / n_layers {} out of range", meta.hidden_size, meta.n_layers)));
        }
        let mut layers = BTreeMap::new();
        for (name, t) in st.tensors() {
            let l = parse_direction(&name).ok_or_else(|| fmt_err(what, format!("unexpected tensor {name:?} (only direction.<layer>)")))?;
            if l >= meta.n_layers {
                return Err(fmt_err(what, format!("{name}: layer {l} ≥ n_layers {}", meta.n_layers)));
            }
            if t.dtype() != safetensors::Dtype::F32 || t.shape() != [meta.hidden_size] {
                return Err(fmt_err(what, format!("{name}: expected F32 [{}], got {:?} {:?}", meta.hidden_size, t.dtype(), t.shape())));
            }
            let v = f32s(t.data());
            check_values(&v).map_err(|r| fmt_err(what, format!("{name}: {r}")))?;
            layers.insert(l, v);
        }
        if layers.is_empty() {
            return Err(fmt_err(what, "no direction.<layer> tensors"));
        }
        Ok(ControlVector { meta, layers })
    }

    /// Read llama.cpp's control-vector GGUF: F32 tensors `direction.N` of `n_embd` values, which
    /// llama.cpp adds at the output of layer `N` (N ≥ 1) — the same convention as ours.
    pub fn import_llamacpp(path: &Path, n_layers: usize) -> Result<ControlVector, ControlError> {
        let what = path.display().to_string();
        let g = crate::import::gguf::GgufFile::open(path).map_err(|e| fmt_err(&what, e))?;
        let mut layers = BTreeMap::new();
        let mut dim = None;
        for t in &g.tensors {
            let l = parse_direction(&t.name).ok_or_else(|| fmt_err(&what, format!("unexpected tensor {:?} (a control-vector GGUF holds direction.N)", t.name)))?;
            if t.ty != crate::model::TensorType::F32 || t.ne.len() != 1 {
                return Err(fmt_err(&what, format!("{}: expected a 1-D F32 tensor, got {} {:?}", t.name, t.ty.name(), t.ne)));
            }
            let n = t.ne[0] as usize;
            if *dim.get_or_insert(n) != n {
                return Err(fmt_err(&what, format!("{}: {n} values, other layers have {}", t.name, dim.unwrap_or(0))));
            }
            if l >= n_layers {
                return Err(fmt_err(&what, format!("{}: layer {l}, the model has {n_layers} layers", t.name)));
            }
            let v = f32s(g.tensor_data(t));
            check_values(&v).map_err(|r| fmt_err(&what, format!("{}: {r}", t.name)))?;
            layers.insert(l, v);
        }
        let Some(hidden_size) = dim else { return Err(fmt_err(&what, "no direction.N tensors")) };
        if hidden_size == 0 || hidden_size > MAX_HIDDEN {
            return Err(fmt_err(&what, format!("hidden size {hidden_size} out of range")));
        }
        let hint = g.get("controlvector.model_hint").and_then(|v| v.as_str()).unwrap_or("unknown");
        let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let meta = ControlMeta { format: 1, hidden_size, n_layers, method: "imported".into(), source: format!("llama.cpp control vector {file} (model hint {hint})") };
        Ok(ControlVector { meta, layers })
    }

    /// Checks against a model's shape.
    pub fn check_fits(&self, name: &str, n_layers: usize, hidden_size: usize) -> Result<(), ControlError> {
        let bad = |reason: String| Err(ControlError::Mismatch { name: name.into(), reason });
        if self.meta.hidden_size != hidden_size {
            return bad(format!("hidden size {}, the model's is {hidden_size}", self.meta.hidden_size));
        }
        if let Some((&l, _)) = self.layers.iter().next_back().filter(|(&l, _)| l >= n_layers) {
            return bad(format!("layer {l}, the model has {n_layers} layers"));
        }
        Ok(())
    }

    /// L2 norm per layer, for `inspect`-style summaries.
    pub fn norms(&self) -> BTreeMap<usize, f32> {
        self.layers.iter().map(|(&l, v)| (l, v.iter().map(|x| x * x).sum::<f32>().sqrt())).collect()
    }
}

fn parse_direction(name: &str) -> Option<usize> {
    let n = name.strip_prefix("direction.")?;
    if n.is_empty() || n.len() > 4 || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    n.parse().ok()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn check_values(v: &[f32]) -> Result<(), String> {
    match v.iter().position(|x| !x.is_finite() || x.abs() > MAX_ABS) {
        Some(i) => Err(format!("value {} at {i} is not finite or exceeds {MAX_ABS}", v[i])),
        None => Ok(()),
    }
}

/// Sum `strength × vector` per layer into one [`Steering`] for a model of `n_layers`.
pub fn steering(parts: &[(&ControlVector, f32)], n_layers: usize) -> Steering {
    let mut layers: Vec<Option<Vec<f32>>> = vec![None; n_layers];
    for (cv, s) in parts {
        for (&l, v) in &cv.layers {
            if l >= n_layers {
                continue; // check_fits refused these at load
            }
            let acc = layers[l].get_or_insert_with(|| vec![0.0; v.len()]);
            for (a, x) in acc.iter_mut().zip(v) {
                *a += s * x;
            }
        }
    }
    Steering::new(layers)
}

/// One side of a contrastive pair: a user message, optionally with a system message and the start
/// of the assistant's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PairSide {
    User(String),
    Chat {
        #[serde(default)]
        system: Option<String>,
        user: String,
        #[serde(default)]
        assistant: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub positive: PairSide,
    pub negative: PairSide,
}

/// Read a JSON Lines file of pairs: `{"positive": SIDE, "negative": SIDE}` per line, where SIDE is
/// a string (a user message) or `{"system"?, "user", "assistant"?}`. Blank lines and lines
/// starting with `#` are skipped.
pub fn read_pairs(path: &Path) -> Result<Vec<Pair>, ControlError> {
    let text = std::fs::read_to_string(path).map_err(|source| ControlError::Io { path: path.into(), source })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let p: Pair = serde_json::from_str(t).map_err(|e| ControlError::Pairs { path: path.into(), line: i + 1, reason: e.to_string() })?;
        out.push(p);
    }
    if out.len() < 2 {
        return Err(ControlError::Pairs { path: path.into(), line: 0, reason: format!("{} pairs; at least 2 are needed", out.len()) });
    }
    Ok(out)
}

/// How per-layer differences become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Mean of (positive − negative).
    #[default]
    Mean,
    /// First principal component of the differences (power iteration on DᵀD), signed and scaled
    /// to the mean difference's projection on it.
    Pca,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Mean => "mean",
            Method::Pca => "pca",
        }
    }
}

/// What to train.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    pub method: Method,
    /// Layers to keep (`start..end`); others get no vector. `None` = all but layer 0.
    pub layers: Option<std::ops::Range<usize>>,
    /// Put in the vector's metadata.
    pub source: String,
}

/// A loaded model the training and measuring functions run on.
pub struct ModelRef<'a> {
    pub engine: &'a mut Engine,
    /// The model's prompt builder (the same one the server and `run` use).
    pub prompts: PromptBuilder<'a>,
}

impl ModelRef<'_> {
    /// Render chat messages with the generation prompt, plus an optional answer prefix, to ids.
    pub fn chat_ids(&self, system: Option<&str>, user: &str, assistant_prefix: &str) -> Result<Vec<u32>, ControlError> {
        Ok(self.prompts.user(system, user, Some(assistant_prefix)).map_err(|e| ControlError::Prompt(e.to_string()))?.tokens)
    }

    fn side_ids(&self, s: &PairSide) -> Result<Vec<u32>, ControlError> {
        match s {
            PairSide::User(u) => self.chat_ids(None, u, ""),
            PairSide::Chat { system, user, assistant } => self.chat_ids(system.as_deref(), user, assistant),
        }
    }

    /// Residual stream after every layer at the last token of `ids` (fresh sequence).
    fn hidden(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, ControlError> {
        let seq = self.engine.new_seq()?;
        let r = (|| {
            let (head, last) = ids.split_at(ids.len().saturating_sub(1));
            self.engine.prefill(seq, head, PREFILL_CHUNK)?;
            Ok::<_, ControlError>(self.engine.forward_hidden(seq, last)?.1)
        })();
        self.engine.free_seq(seq);
        r
    }
}

/// Train a control vector from contrastive pairs with the loaded model. `progress(done, total)`
/// is called after each pair.
pub fn train(m: &mut ModelRef<'_>, pairs: &[Pair], opts: &TrainOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<ControlVector, ControlError> {
    let cfg = m.engine.config().clone();
    let (n_layers, dim) = (cfg.n_layers, cfg.hidden_size);
    let range = opts.layers.clone().unwrap_or(1..n_layers);
    if range.start >= range.end || range.end > n_layers {
        return Err(ControlError::Mismatch { name: "training".into(), reason: format!("layers {}..{} outside the model's 0..{n_layers}", range.start, range.end) });
    }
    // diffs[l][i] = positive_i − negative_i at layer l
    let mut diffs: Vec<Vec<Vec<f32>>> = vec![Vec::with_capacity(pairs.len()); n_layers];
    for (i, p) in pairs.iter().enumerate() {
        let pos_ids = m.side_ids(&p.positive)?;
        let neg_ids = m.side_ids(&p.negative)?;
        if pos_ids.is_empty() || neg_ids.is_empty() {
            return Err(ControlError::Prompt(format!("pair {} renders to no tokens", i + 1)));
        }
        let hp = m.hidden(&pos_ids)?;
        let hn = m.hidden(&neg_ids)?;
        for l in 0..n_layers {
            diffs[l].push(hp[l].iter().zip(&hn[l]).map(|(a, b)| a - b).collect());
        }
        progress(i + 1, pairs.len());
    }
    let mut layers = BTreeMap::new();
    for l in range {
        let d = &diffs[l];
        let mean = mean_of(d, dim);
        let v = match opts.method {
            Method::Mean => mean,
            Method::Pca => {
                let dir = first_component(d, dim, &mean);
                let proj: f32 = dir.iter().zip(&mean).map(|(a, b)| a * b).sum();
                dir.iter().map(|x| x * proj).collect()
            }
        };
        check_values(&v).map_err(|r| ControlError::Format { what: format!("trained layer {l}"), reason: r })?;
        layers.insert(l, v);
    }
    let meta = ControlMeta { format: 1, hidden_size: dim, n_layers, method: opts.method.name().into(), source: opts.source.clone() };
    Ok(ControlVector { meta, layers })
}

fn mean_of(d: &[Vec<f32>], dim: usize) -> Vec<f32> {
    let mut m = vec![0f64; dim];
    for v in d {
        for (a, x) in m.iter_mut().zip(v) {
            *a += *x as f64;
        }
    }
    m.iter().map(|x| (x / d.len().max(1) as f64) as f32).collect()
}

/// Unit first principal direction of the rows of `d` (uncentred, so a consistent shift dominates),
/// by power iteration from the mean; sign chosen to agree with the mean.
fn first_component(d: &[Vec<f32>], dim: usize, mean: &[f32]) -> Vec<f32> {
    let norm = |v: &mut Vec<f64>| {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 {
            v.iter_mut().for_each(|x| *x /= n);
        }
        n
    };
    let mut v: Vec<f64> = mean.iter().map(|&x| x as f64).collect();
    if norm(&mut v) == 0.0 {
        v = vec![1.0 / (dim as f64).sqrt(); dim];
    }
    for _ in 0..100 {
        let mut next = vec![0f64; dim];
        for row in d {
            let p: f64 = row.iter().zip(&v).map(|(a, b)| *a as f64 * b).sum();
            for (n, x) in next.iter_mut().zip(row) {
                *n += p * *x as f64;
            }
        }
        if norm(&mut next) == 0.0 {
            break;
        }
        let delta: f64 = next.iter().zip(&v).map(|(a, b)| (a - b).abs()).sum();
        v = next;
        if delta < 1e-9 {
            break;
        }
    }
    let dot: f64 = v.iter().zip(mean).map(|(a, b)| a * *b as f64).sum();
    let sign = if dot < 0.0 { -1.0 } else { 1.0 };
    v.iter().map(|x| (x * sign) as f32).collect()
}

/// The (unsteered) model's mean negative log-likelihood per answer token of each `answer` after
/// its `prompt`; `exp` of it is the answer's perplexity. Empty answers give `None`.
pub fn answer_nll(m: &mut ModelRef<'_>, prompts: &[Vec<u32>], answers: &[Vec<u32>], batch: usize) -> Result<Vec<Option<f64>>, ControlError> {
    let mut out = vec![None; prompts.len()];
    let idx: Vec<usize> = (0..prompts.len()).filter(|&i| !answers[i].is_empty()).collect();
    for chunk in idx.chunks(batch.max(1)) {
        let mut seqs = Vec::new();
        let res = (|| {
            let mut logits = Vec::new();
            for &i in chunk {
                let s = m.engine.new_seq()?;
                seqs.push(s);
                logits.push(m.engine.prefill(s, &prompts[i], PREFILL_CHUNK)?);
            }
            let mut sum = vec![0f64; chunk.len()];
            let longest = chunk.iter().map(|&i| answers[i].len()).max().unwrap_or(0);
            for pos in 0..longest {
                let mut step = Vec::new();
                for (k, &i) in chunk.iter().enumerate() {
                    if let Some(&t) = answers[i].get(pos) {
                        sum[k] -= log_softmax_at(&logits[k], t);
                        if pos + 1 < answers[i].len() {
                            step.push((k, t));
                        }
                    }
                }
                if step.is_empty() {
                    break;
                }
                let toks: Vec<[u32; 1]> = step.iter().map(|&(_, t)| [t]).collect();
                let b: Vec<(SeqId, &[u32])> = step.iter().zip(&toks).map(|(&(k, _), t)| (seqs[k], &t[..])).collect();
                for (&(k, _), l) in step.iter().zip(m.engine.forward(&b)?) {
                    logits[k] = l;
                }
            }
            for (k, &i) in chunk.iter().enumerate() {
                out[i] = Some(sum[k] / answers[i].len() as f64);
            }
            Ok::<_, ControlError>(())
        })();
        for s in seqs {
            m.engine.free_seq(s);
        }
        res?;
    }
    Ok(out)
}

fn log_softmax_at(logits: &[f32], t: u32) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.get(t as usize).map_or(f64::NEG_INFINITY, |&x| x as f64 - lse)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cv() -> ControlVector {
        let mut layers = BTreeMap::new();
        layers.insert(1, vec![0.5, -1.0, 2.0]);
        layers.insert(3, vec![0.0, 0.25, -0.125]);
        ControlVector { meta: ControlMeta { format: 1, hidden_size: 3, n_layers: 4, method: "mean".into(), source: "test".into() }, layers }
    }

    #[test]
    fn round_trip_is_exact_and_deterministic() {
        let v = cv();
        let b = v.to_bytes().unwrap();
        assert_eq!(b, v.to_bytes().unwrap());
        assert_eq!(ControlVector::from_bytes(&b, "t").unwrap(), v);
    }

    #[test]
    fn hostile_files_are_refused() {
        assert!(ControlVector::from_bytes(b"junk", "t").is_err());
        let mut v = cv();
        v.layers.insert(4, vec![0.0; 3]); // layer ≥ n_layers
        assert!(ControlVector::from_bytes(&v.to_bytes().unwrap(), "t").unwrap_err().to_string().contains("layer 4"));
        let mut v = cv();
        v.layers.insert(2, vec![f32::NAN, 0.0, 0.0]);
        assert!(ControlVector::from_bytes(&v.to_bytes().unwrap(), "t").unwrap_err().to_string().contains("not finite"));
        let mut v = cv();
        v.meta.format = 2;
        assert!(ControlVector::from_bytes(&v.to_bytes().unwrap(), "t").is_err());
        for bad in ["direction.", "direction.01", "direction.x", "other.1", "direction.12345"] {
            assert_eq!(parse_direction(bad), None, "{bad}");
        }
        assert_eq!(parse_direction("direction.0"), Some(0));
    }

    #[test]
    fn steering_sums_with_strengths() {
        let v = cv();
        let s = steering(&[(&v, 2.0), (&v, -0.5)], 4);
        assert_eq!(s.layer(0), None);
        assert_eq!(s.layer(1), Some(&[0.75, -1.5, 3.0][..]));
        assert_eq!(s.layer(3), Some(&[0.0, 0.375, -0.1875][..]));
        assert!(v.check_fits("v", 3, 3).is_err());
        assert!(v.check_fits("v", 4, 2).is_err());
        v.check_fits("v", 4, 3).unwrap();
    }

    #[test]
    fn pca_finds_the_shared_direction() {
        // Differences along (1, 1, 0) with noise along z of both signs.
        let d = vec![vec![1.0, 1.0, 0.3], vec![2.0, 2.0, -0.3], vec![1.5, 1.5, 0.1]];
        let mean = mean_of(&d, 3);
        let c = first_component(&d, 3, &mean);
        assert!((c[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-2 && (c[1] - c[0]).abs() < 1e-4 && c[2].abs() < 0.05, "{c:?}");
    }

    #[test]
    fn pairs_parse_both_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        std::fs::write(&p, "# c\n{\"positive\":\"a\",\"negative\":\"b\"}\n\n{\"positive\":{\"system\":\"s\",\"user\":\"u\",\"assistant\":\"x\"},\"negative\":{\"user\":\"u\"}}\n").unwrap();
        let v = read_pairs(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].negative, PairSide::Chat { system: None, user: "u".into(), assistant: String::new() });
        std::fs::write(&p, "{\"positive\":\"a\"}\n").unwrap();
        assert!(read_pairs(&p).unwrap_err().to_string().contains("line 1"));
    }
}
