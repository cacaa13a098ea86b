//! Bundle recipes (`bundles/*.toml`), the input of `applianced build`. See `bundles/README.md`.
//!
//! ```toml
//! [bundle]
//! name = "smollm2-135m-instruct"     # [a-z0-9._-], also the rollback-state key
//! version = 1                        # u64, must grow with every release of this name
//! created = "2026-11-30T00:00:00Z"   # optional; else SOURCE_DATE_EPOCH; else now (not reproducible)
//! expires = "2027-11-30T00:00:00Z"   # or: expires_days = 365 (counted from created)
//! min_runtime = "0.1.0"              # optional; default: this runtime's version
//!
//! [model]
//! source = "../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"   # relative to the recipe file
//! sha256 = "b179c9..."               # optional pin of the source file
//! quantize = "q8_0"                  # optional requantization at build
//!
//! [schemas]                          # optional: JSON Schemas compiled to token automata at build
//! invoice = "schemas/invoice.json"
//! [schema_resources]                 # optional: documents those schemas `$ref` by URI
//! "https://example.com/schemas/" = "schemas/shared"   # each *.json below, at URI + its path
//!
//! [policy.safety.levels]             # optional: see docs/policy.md
//! strict = { phrases = ["guaranteed returns"], case_insensitive = true }
//! [policy.redaction]
//! kinds = ["email", "phone", "card"]
//! [control.concise]                 # optional: control vectors (docs/policy.md)
//! pairs = "control/concise-pairs.jsonl"   # trained at build with the bundle's own model
//! method = "mean"                    # or "pca"; layers = [1, 30] (start, end exclusive)
//! # or: file = "vectors/x.gguf"      # a llama.cpp control vector (or our .safetensors)
//! [tools]                            # optional: how calls are written where the chat template
//! syntax = "llama3-json"             # has no tool syntax of its own ("hermes", the default)
//! [presets]
//! default = "balanced"
//! [presets.balanced]
//! temperature = 0.7
//! redact_output = true
//! ```
//! Unknown sections or keys are errors: a recipe option this build does not implement must never
//! be silently ignored.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::manifest::{format_time, parse_semver, parse_time, valid_name};
use super::BundleError;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub bundle: BundleSection,
    pub model: ModelSection,
    /// Named JSON Schemas compiled at build time: `NAME = "path/to/schema.json"` (relative to the
    /// recipe). Each becomes `schemas/NAME.bin` (the automaton) and `schemas/NAME.json` (its source).
    #[serde(default)]
    pub schemas: std::collections::BTreeMap<String, PathBuf>,
    /// Documents the schemas reference by URI: `"BASE-URI" = "dir"` registers every `*.json`
    /// below `dir` at `BASE-URI` + its relative path, and at its own `$id`. Each schema is stored
    /// with the documents it references embedded (`crate::schema::resources::bundle`).
    #[serde(default)]
    pub schema_resources: std::collections::BTreeMap<String, PathBuf>,
    /// Safety levels and redaction rules (see docs/policy.md), compiled into `policy/`.
    #[serde(default)]
    pub policy: Option<crate::policy::PolicySpec>,
    /// Named presets (see docs/policy.md), stored as `policy/presets.json`.
    #[serde(default)]
    pub presets: Option<crate::policy::PresetsSpec>,
    /// Named control vectors, each trained at build from contrastive pairs or read from a file;
    /// stored as `control/NAME.safetensors`.
    #[serde(default)]
    pub control: std::collections::BTreeMap<String, ControlSection>,
    /// GPU kernels compiled at build time for this model's shapes (FORMAT.md §11).
    #[serde(default)]
    pub kernels: Option<KernelsSection>,
    /// The health probe `bundle pull --activate` runs before switching to the bundle: a fixed
    /// prompt, an optional pattern the answer must match, a deadline. Stored as `probe.json`.
    #[serde(default)]
    pub probe: Option<crate::runtime::probe::ProbeSpec>,
    /// The tool-call syntax for a chat template that has none of its own. Stored as `tools.json`.
    #[serde(default)]
    pub tools: Option<ToolsSection>,
}

/// `[tools]`: `syntax` names how the model writes tool calls (`crate::tools::ToolSyntax::NAMES`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsSection {
    pub syntax: String,
}

/// `[kernels]`: `cuda = ["sm_80", ...]` compiles the CUDA kernels to PTX for each target with NVRTC
/// (`cuda = "default"` is the default target list); `wgsl = true` ships the WGSL shaders.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelsSection {
    pub cuda: Option<CudaTargets>,
    #[serde(default)]
    pub wgsl: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CudaTargets {
    Named(String),
    List(Vec<String>),
}

/// One `[control.NAME]` table: `pairs` (train at build) or `file` (import), not both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    pub pairs: Option<PathBuf>,
    pub file: Option<PathBuf>,
    /// For `pairs`: `mean` (default) or `pca`.
    pub method: Option<crate::policy::control::Method>,
    /// For `pairs`: `[start, end)` layers that get a vector; default all but layer 0.
    pub layers: Option<[usize; 2]>,
}

/// Where a control vector comes from, paths resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlSource {
    Train { pairs: PathBuf, method: crate::policy::control::Method, layers: Option<std::ops::Range<usize>> },
    File(PathBuf),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleSection {
    pub name: String,
    pub version: u64,
    pub created: Option<String>,
    pub expires: Option<String>,
    pub expires_days: Option<u32>,
    pub min_runtime: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub source: PathBuf,
    pub sha256: Option<String>,
    pub quantize: Option<String>,
}

/// A recipe with paths and times resolved.
#[derive(Debug, Clone)]
pub struct ResolvedRecipe {
    pub recipe: Recipe,
    pub source: PathBuf,
    /// Schema files with paths resolved against the recipe's directory.
    pub schemas: Vec<(String, PathBuf)>,
    /// Schema resource directories by base URI, paths resolved.
    pub schema_resources: Vec<(String, PathBuf)>,
    /// Control vectors to make, in name order.
    pub control: Vec<(String, ControlSource)>,
    pub created: String,
    pub expires: String,
    pub min_runtime: String,
    /// Whether `created` came from the clock (the bundle will not be reproducible).
    pub created_from_clock: bool,
}

impl Recipe {
    pub fn load(path: &Path) -> Result<Recipe, BundleError> {
        let text = std::fs::read_to_string(path).map_err(BundleError::io(path))?;
        toml::from_str(&text).map_err(|e| BundleError::Recipe { path: path.into(), msg: e.to_string().trim().replace('\n', " ") })
    }

    /// Resolve relative paths against the recipe's directory and fill in times.
    pub fn resolve(self, path: &Path, model_override: Option<&Path>, now: i64) -> Result<ResolvedRecipe, BundleError> {
        let bad = |msg: String| BundleError::Recipe { path: path.into(), msg };
        if !valid_name(&self.bundle.name) {
            return Err(bad(format!("bundle.name {:?}: use 1-64 of [a-z0-9._-]", self.bundle.name)));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let source = match model_override {
            Some(p) => p.to_path_buf(),
            None if self.model.source.is_absolute() => self.model.source.clone(),
            None => base.join(&self.model.source),
        };
        let (created_unix, from_clock) = match (&self.bundle.created, std::env::var("SOURCE_DATE_EPOCH").ok()) {
            (Some(c), _) => (parse_time(c).ok_or_else(|| bad(format!("bundle.created {c:?} is not YYYY-MM-DDTHH:MM:SSZ")))?, false),
            (None, Some(e)) => (e.trim().parse::<i64>().map_err(|_| bad("SOURCE_DATE_EPOCH is not an integer".into()))?, false),
            (None, None) => (now, true),
        };
        let expires_unix = match (&self.bundle.expires, self.bundle.expires_days) {
            (Some(_), Some(_)) => return Err(bad("give bundle.expires or bundle.expires_days, not both".into())),
            (Some(e), None) => parse_time(e).ok_or_else(|| bad(format!("bundle.expires {e:?} is not YYYY-MM-DDTHH:MM:SSZ")))?,
            (None, Some(d)) => created_unix + i64::from(d) * 86_400,
            (None, None) => return Err(bad("bundle.expires (or expires_days) is required: bundles must expire".into())),
        };
        if expires_unix <= created_unix {
            return Err(bad("bundle.expires must be after bundle.created".into()));
        }
        let min_runtime = self.bundle.min_runtime.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
        if parse_semver(&min_runtime).is_none() {
            return Err(bad(format!("bundle.min_runtime {min_runtime:?} is not MAJOR.MINOR.PATCH")));
        }
        if !self.schema_resources.is_empty() && self.schemas.is_empty() {
            return Err(bad("[schema_resources] is set but [schemas] is empty: the resources serve the schemas' references".into()));
        }
        for uri in self.schema_resources.keys() {
            if !uri.contains(':') || uri.contains('#') {
                return Err(bad(format!("schema_resources {uri:?}: give an absolute base URI without a fragment, as \"https://example.com/schemas/\"")));
            }
        }
        for name in self.schemas.keys() {
            if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') {
                return Err(bad(format!("schemas.{name}: schema names use 1-64 of [a-z0-9_-]")));
            }
        }
        if let Some(p) = &self.policy {
            p.validate().map_err(|e| bad(format!("policy: {e}")))?;
        }
        if let Some(ps) = &self.presets {
            let empty = crate::policy::PolicySpec::default();
            let table = crate::policy::PresetTable::resolve(ps, self.policy.as_ref().unwrap_or(&empty)).map_err(|e| bad(format!("presets: {e}")))?;
            for name in ps.presets.keys() {
                let p = table.get(Some(name)).map_err(|e| bad(format!("presets: {e}")))?;
                if let Some(s) = &p.schema {
                    if !self.schemas.contains_key(s) {
                        return Err(bad(format!("presets.{name}.schema = {s:?}: no such schema in [schemas]")));
                    }
                }
                for c in &p.control {
                    if !self.control.contains_key(&c.vector) {
                        return Err(bad(format!("presets.{name}.control: vector {:?} is not defined in [control]", c.vector)));
                    }
                }
            }
        }
        if let Some(q) = &self.model.quantize {
            if q != "q8_0" {
                return Err(bad(format!("model.quantize {q:?}: supported values: \"q8_0\"")));
            }
        }
        let rel = |p: &PathBuf| if p.is_absolute() { p.clone() } else { base.join(p) };
        let mut control = Vec::new();
        for (name, c) in &self.control {
            if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') {
                return Err(bad(format!("control.{name}: vector names use 1-64 of [a-z0-9_-]")));
            }
            let src = match (&c.pairs, &c.file) {
                (Some(p), None) => {
                    let layers = match c.layers {
                        Some([a, b]) if a < b => Some(a..b),
                        Some([a, b]) => return Err(bad(format!("control.{name}.layers = [{a}, {b}]: start must be below end"))),
                        None => None,
                    };
                    ControlSource::Train { pairs: rel(p), method: c.method.unwrap_or_default(), layers }
                }
                (None, Some(f)) => {
                    if c.method.is_some() || c.layers.is_some() {
                        return Err(bad(format!("control.{name}: method and layers apply to `pairs` training, not to `file`")));
                    }
                    ControlSource::File(rel(f))
                }
                _ => return Err(bad(format!("control.{name}: give exactly one of `pairs` (train at build) or `file` (import)"))),
            };
            control.push((name.clone(), src));
        }
        Ok(ResolvedRecipe {
            control,
            created: format_time(created_unix),
            expires: format_time(expires_unix),
            min_runtime,
            created_from_clock: from_clock,
            schemas: self.schemas.iter().map(|(n, p)| (n.clone(), if p.is_absolute() { p.clone() } else { base.join(p) })).collect(),
            schema_resources: self.schema_resources.iter().map(|(u, p)| (u.clone(), if p.is_absolute() { p.clone() } else { base.join(p) })).collect(),
            source,
            recipe: self,
        })
    }
}
