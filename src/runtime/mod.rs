//! The runtime layer: the one way from a verified bundle to generation, shared by `applianced
//! serve`, `run`, `bench`, `doctor`, `schema` and `control-vector`.
//!
//! - [`LoadedBundle::open`] takes a [`VerifiedBundle`] (nothing else: a served model is always a
//!   verified store entry), reads `model/config.json` once and loads the tokenizer, the chat
//!   template, the policy members (presets, safety masks, redaction, named schemas, control
//!   vectors) and the schema vocabulary; the engine is loaded from the same parsed config, on
//!   the calling thread ([`LoadedBundle::engine`]) or on another ([`EngineLoader`]).
//! - [`LoadedBundle::prompts`] is the injection-safe prompt builder
//!   ([`crate::tokenizer::PromptBuilder`]).
//! - [`LoadedBundle::generation`] turns a preset and a request into one sequence's
//!   [`SeqGen`], the per-sequence generation step every caller drives ([`generate`]).

pub mod generate;
pub mod probe;

use std::path::PathBuf;
use std::sync::Arc;

pub use generate::{End, GenSpec, SeqGen, Step, StopMatcher, StopReason};

use crate::backend::BackendPref;
use crate::bundle::VerifiedBundle;
use crate::engine::{Engine, EngineError, EngineOptions};
use crate::model::{ModelConfig, CHAT_TEMPLATE_PATH, TOKENIZER_PATH};
use crate::policy::runtime::BundlePolicy;
use crate::policy::{PolicyError, Preset};
use crate::sampling::SamplingParams;
use crate::schema::{CompileOptions, CompiledSchema, SchemaError, Vocabulary};
use crate::tokenizer::{ChatTemplate, PromptBuilder, Tokenizer, TokenizerError};

/// Why a verified bundle could not be made ready to generate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("bundle policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("bundle tool syntax: {0}")]
    Tools(String),
}

impl RuntimeError {
    /// Whether the cause is the file system (not the bundle's content).
    pub fn is_io(&self) -> bool {
        matches!(self, RuntimeError::Engine(EngineError::Io { .. }) | RuntimeError::Tokenizer(TokenizerError::Io { .. }))
    }
}

/// A verified bundle, loaded for generation (everything but the engine, which is loaded from it).
pub struct LoadedBundle {
    bundle: VerifiedBundle,
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// Presets, safety masks, redaction rules, named schemas and control vectors.
    pub policy: Arc<BundlePolicy>,
    /// The vocabulary as schema masks see it (special tokens empty; the end-of-generation ids).
    pub vocabulary: Arc<Vocabulary>,
    eog: Arc<[u32]>,
    tool_format: crate::tools::ToolFormat,
}

impl LoadedBundle {
    pub fn open(vb: &VerifiedBundle) -> Result<LoadedBundle, RuntimeError> {
        let root = &vb.root;
        let config = crate::engine::read_config(root)?;
        let tokenizer = Tokenizer::load(&root.join(TOKENIZER_PATH))?;
        let template = ChatTemplate::load(&root.join(CHAT_TEMPLATE_PATH))?;
        let policy = BundlePolicy::load(root, &tokenizer, &config)?;
        let vocabulary = Arc::new(Vocabulary::new(&tokenizer.generation_vocab(config.vocab_size), &config.eog_token_ids));
        let eog = generate::eog_ids(&config);
        let tool_format = crate::tools::ToolFormat::for_bundle(&template, root).map_err(RuntimeError::Tools)?;
        Ok(LoadedBundle { bundle: vb.clone(), config, tokenizer: Arc::new(tokenizer), template, policy: Arc::new(policy), vocabulary, eog, tool_format })
    }

    pub fn bundle(&self) -> &VerifiedBundle {
        &self.bundle
    }

    /// How this model writes tool calls and reads results ([`crate::tools::ToolFormat::for_bundle`]).
    pub fn tool_format(&self) -> crate::tools::ToolFormat {
        self.tool_format
    }

    /// The injection-safe prompt builder for this model.
    pub fn prompts(&self) -> PromptBuilder<'_> {
        PromptBuilder::new(&self.tokenizer, &self.template, &self.config)
    }

    /// End-of-generation ids (`eog_token_ids` and EOS).
    pub fn eog(&self) -> Arc<[u32]> {
        self.eog.clone()
    }

    /// Load the engine here; returns it and why its backend was chosen.
    pub fn engine(&self, opts: &EngineOptions, backend: BackendPref) -> Result<(Engine, String), RuntimeError> {
        self.engine_loader(opts, backend).load()
    }

    /// What loads the engine on another thread (the server's engine thread).
    pub fn engine_loader(&self, opts: &EngineOptions, backend: BackendPref) -> EngineLoader {
        EngineLoader { root: self.bundle.root.clone(), config: self.config.clone(), opts: opts.clone(), backend }
    }

    /// Compile a JSON Schema against this model's vocabulary.
    pub fn compile_schema(&self, schema: &serde_json::Value, opts: &CompileOptions) -> Result<CompiledSchema, SchemaError> {
        CompiledSchema::compile_with(schema, &self.vocabulary, opts)
    }

    /// What one answer under `preset` is held to: the preset's safety mask and schema (or the
    /// request's `adhoc` schema in its place) with the mandatory prefix already read, and its
    /// output pipeline (redaction, mandatory text).
    pub fn spec(&self, preset: Option<&Preset>, adhoc: Option<Arc<CompiledSchema>>, params: SamplingParams, max_tokens: usize, stop: Vec<String>) -> GenSpec {
        let constraints = self.policy.constraints(preset, adhoc, self.config.vocab_size);
        let pipeline = preset.map(|p| self.policy.pipeline(Some(p)));
        GenSpec { params, max_tokens, stop, constraints: Some(constraints), pipeline, thinking: None }
    }

    /// A cap of `tokens` on the reasoning block of a model that reasons (see
    /// [`generate::ThinkingBudget`]); `None` for a model that does not.
    pub fn thinking_budget(&self, tokens: usize) -> Option<generate::ThinkingBudget> {
        if !self.template.reasons() {
            return None;
        }
        let close = format!("\n{}\n\n", crate::tokenizer::reasoning::CLOSE);
        let close = self.tokenizer.encode(&close, true).ok().filter(|c| !c.is_empty())?;
        Some(generate::ThinkingBudget { tokens, close })
    }

    /// One sequence's generation state for `prompt` (see [`SeqGen`]).
    pub fn generation(&self, prompt: Vec<u32>, spec: GenSpec, max_context: usize) -> SeqGen {
        SeqGen::new(prompt, spec, self.tokenizer.stream_decoder(), self.eog(), max_context)
    }

    /// Tokens of the mandatory text a preset adds (counted in usage as output).
    pub fn mandatory_tokens(&self, preset: Option<&Preset>) -> usize {
        let Some(p) = preset else { return 0 };
        [&p.mandatory.prefix, &p.mandatory.suffix].iter().filter(|t| !t.is_empty()).map(|t| self.tokenizer.encode(t, false).map_or(0, |v| v.len())).sum()
    }
}

/// Loads a bundle's engine from its already-read config, on whatever thread calls [`load`].
///
/// [`load`]: EngineLoader::load
pub struct EngineLoader {
    root: PathBuf,
    config: ModelConfig,
    opts: EngineOptions,
    backend: BackendPref,
}

impl EngineLoader {
    pub fn load(self) -> Result<(Engine, String), RuntimeError> {
        Ok(Engine::open_with(&self.root, self.config, &self.opts, self.backend)?)
    }
}
