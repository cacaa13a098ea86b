//! `applianced build`: recipe → import the model into the bundle layout → manifest → signatures →
//! deterministic `.zlb`.

use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::manifest::{Manifest, Member, FORMAT_V1};
use super::recipe::ResolvedRecipe;
use super::{writer, BundleError};
use crate::trust::{sign_manifest, SecretKey};

/// Progress events for the CLI to print.
pub enum Progress<'a> {
    Step(&'a str),
    Bytes { done: u64, total: u64 },
}

/// What `build` produced.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    pub identity: String,
    pub manifest: Manifest,
    pub bytes: u64,
}

/// Hash a file (streaming).
pub fn sha256_file(path: &Path) -> Result<String, BundleError> {
    let mut f = std::fs::File::open(path).map_err(BundleError::io(path))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(BundleError::io(path))?;
    Ok(hex::encode(h.finalize()))
}

/// Build a bundle from a resolved recipe, signed by every key in `keys`.
pub fn build(r: &ResolvedRecipe, keys: &[SecretKey], out: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<BuildOutput, BundleError> {
    if keys.is_empty() {
        return Err(BundleError::Recipe { path: out.into(), msg: "at least one --key is required".into() });
    }
    if !r.source.exists() {
        return Err(BundleError::Import(format!(
            "model source {} does not exist (run scripts/fetch-model.sh for the default model, or pass --model PATH)",
            r.source.display()
        )));
    }
    if let Some(pin) = &r.recipe.model.sha256 {
        progress(Progress::Step("checking model source sha256"));
        let got = sha256_file(&r.source)?;
        if !got.eq_ignore_ascii_case(pin) {
            return Err(BundleError::Import(format!("model source {}: sha256 {got} does not match the recipe's pin {pin}", r.source.display())));
        }
    }
    let staging_parent = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(staging_parent).map_err(BundleError::io(staging_parent))?;
    let staging = tempfile::Builder::new().prefix(".zlb-staging-").tempdir_in(staging_parent).map_err(BundleError::io(staging_parent))?;

    progress(Progress::Step("importing model"));
    let opts = crate::import::ImportOptions {
        quantize: match r.recipe.model.quantize.as_deref() {
            Some("q8_0") => Some(crate::model::TensorType::Q8_0),
            _ => None,
        },
    };
    let summary = crate::import::import_model(&r.source, &opts, staging.path(), &mut |s| progress(Progress::Step(s)))
        .map_err(|e| BundleError::Import(e.to_string()))?;

    compile_schemas(r, staging.path(), progress)?;
    compile_policy(r, staging.path(), progress)?;
    write_probe(r, staging.path())?;
    write_tools(r, staging.path())?;
    make_control_vectors(r, staging.path(), progress)?;
    let kernels = build_kernels(r, staging.path(), progress)?;
    let meta = BundleMeta {
        name: r.recipe.bundle.name.clone(),
        version: r.recipe.bundle.version,
        created: r.created.clone(),
        expires: r.expires.clone(),
        min_runtime: r.min_runtime.clone(),
        model: serde_json::to_value(&summary).map_err(|e| BundleError::Import(e.to_string()))?,
        kernels,
    };
    pack_dir(staging.path(), &meta, keys, out, progress)
}

/// `[kernels]`: compile the CUDA kernels to PTX per target (NVRTC) into `kernels/cuda/`, copy the
/// WGSL shaders into `kernels/wgsl/`; returns the manifest's `kernels` summary.
fn build_kernels(r: &ResolvedRecipe, staging: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Option<serde_json::Value>, BundleError> {
    let Some(k) = &r.recipe.kernels else { return Ok(None) };
    let err = |msg: String| BundleError::Kernels(msg);
    let mut summary = serde_json::Map::new();
    if let Some(t) = &k.cuda {
        let targets: Vec<String> = match t {
            super::recipe::CudaTargets::Named(n) if n == "default" => {
                crate::backend::cuda_targets_default().iter().map(|s| s.to_string()).collect()
            }
            super::recipe::CudaTargets::Named(n) => return Err(err(format!("kernels.cuda = {n:?}: give a list of targets or \"default\""))),
            super::recipe::CudaTargets::List(l) => l.clone(),
        };
        let cfg_path = staging.join(crate::model::CONFIG_PATH);
        let text = std::fs::read_to_string(&cfg_path).map_err(BundleError::io(&cfg_path))?;
        let cfg: crate::model::ModelConfig = serde_json::from_str(&text).map_err(|e| err(format!("model config: {e}")))?;
        let dir = staging.join(crate::backend::CUDA_DIR);
        let meta = crate::backend::compile_cuda_kernels(&cfg, &targets, &dir, &mut |s| progress(Progress::Step(s))).map_err(err)?;
        summary.insert("cuda".into(), meta);
    }
    if k.wgsl {
        progress(Progress::Step("adding WGSL shaders"));
        let dir = staging.join(crate::backend::WGSL_DIR);
        std::fs::create_dir_all(&dir).map_err(BundleError::io(&dir))?;
        let mut names = Vec::new();
        for (name, text) in crate::backend::wgsl_shaders() {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(BundleError::io(&p))?;
            names.push(serde_json::Value::from(*name));
        }
        if names.is_empty() {
            return Err(err("kernels.wgsl = true, but this build of applianced has no WGSL shaders (built without the `wgpu` feature)".into()));
        }
        summary.insert("wgsl".into(), serde_json::json!({ "files": names }));
    }
    Ok(Some(serde_json::Value::Object(summary)))
}

/// The recipe's `[probe]` as the member `probe.json` (canonical JSON), checked first.
fn write_probe(r: &ResolvedRecipe, staging: &Path) -> Result<(), BundleError> {
    let Some(p) = &r.recipe.probe else { return Ok(()) };
    let err = |msg: String| BundleError::Recipe { path: PathBuf::from("[probe]"), msg };
    p.check().map_err(err)?;
    let v = serde_json::to_value(p).map_err(|e| err(e.to_string()))?;
    let bytes = super::canonical::to_canonical(&v).map_err(err)?;
    let path = staging.join(crate::runtime::probe::PROBE_PATH);
    std::fs::write(&path, bytes).map_err(BundleError::io(&path))
}

/// The recipe's `[tools]` as the member `tools.json` (canonical JSON): a syntax this runtime knows,
/// for a chat template without a tool syntax of its own (or naming that one).
fn write_tools(r: &ResolvedRecipe, staging: &Path) -> Result<(), BundleError> {
    let Some(t) = &r.recipe.tools else { return Ok(()) };
    let err = |msg: String| BundleError::Recipe { path: PathBuf::from("[tools]"), msg };
    let Some(syntax) = crate::tools::ToolSyntax::from_name(&t.syntax) else {
        return Err(err(format!("syntax = {:?} is not one of {}", t.syntax, crate::tools::ToolSyntax::NAMES.map(|n| format!("{n:?}")).join(", "))));
    };
    let template = crate::tokenizer::ChatTemplate::load(&staging.join(crate::model::CHAT_TEMPLATE_PATH)).map_err(|e| err(e.to_string()))?;
    if !template.is_chat() {
        return Err(err("the model has no chat template (a base model): it answers completions only and takes no tools; remove [tools]".into()));
    }
    if let Some(own) = template.native_tools().filter(|&own| own != syntax) {
        return Err(err(format!("the model's {} chat template has its own tool syntax, {:?}: name that one or remove [tools]", template.family(), own.name())));
    }
    let bytes = super::canonical::to_canonical(&serde_json::json!({ "syntax": syntax.name() })).map_err(err)?;
    let path = staging.join(crate::tools::TOOLS_PATH);
    std::fs::write(&path, bytes).map_err(BundleError::io(&path))
}

/// Compile the recipe's `[policy]` and `[presets]` into `policy/` (FORMAT.md §10).
fn compile_policy(r: &ResolvedRecipe, staging: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<(), BundleError> {
    let (policy, presets) = (&r.recipe.policy, &r.recipe.presets);
    if policy.is_none() && presets.is_none() {
        return Ok(());
    }
    let err = |msg: String| BundleError::Recipe { path: PathBuf::from("[policy]"), msg };
    let empty = crate::policy::PolicySpec::default();
    let spec = policy.as_ref().unwrap_or(&empty);
    let dir = staging.join("policy");
    std::fs::create_dir_all(&dir).map_err(BundleError::io(&dir))?;
    if !spec.safety.levels.is_empty() {
        let tok = crate::tokenizer::Tokenizer::load(&staging.join(crate::model::TOKENIZER_PATH)).map_err(|e| BundleError::Import(e.to_string()))?;
        let vocab = std::sync::Arc::new(crate::policy::SafetyVocab::new(&tok.all_token_bytes(), tok.special_ids()).map_err(|e| err(e.to_string()))?);
        for (level, l) in &spec.safety.levels {
            progress(Progress::Step(&format!("compiling safety level {level}")));
            let m = crate::policy::SafetyMask::compile(level, l, &vocab).map_err(|e| err(e.to_string()))?;
            let p = staging.join(crate::policy::PolicySpec::safety_member(level));
            std::fs::write(&p, m.to_bytes()).map_err(BundleError::io(&p))?;
        }
    }
    let red = serde_json::to_value(&spec.redaction).map_err(|e| err(e.to_string()))?;
    let red = super::canonical::to_canonical(&red).map_err(err)?;
    std::fs::write(dir.join("redaction.json"), red).map_err(BundleError::io(&dir))?;
    if let Some(ps) = presets {
        let table = crate::policy::PresetTable::resolve(ps, spec).map_err(|e| err(e.to_string()))?;
        std::fs::write(dir.join("presets.json"), table.to_json()).map_err(BundleError::io(&dir))?;
    }
    Ok(())
}

/// Train (with the just-imported model) or import the recipe's control vectors into `control/`
/// (FORMAT.md §10.3). A trained vector ships with its pairs file, `control/NAME.pairs.jsonl`, so
/// an auditor can see what it was made from.
fn make_control_vectors(r: &ResolvedRecipe, staging: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<(), BundleError> {
    use crate::policy::control::{self, ControlVector, ModelRef, TrainOptions};
    if r.control.is_empty() {
        return Ok(());
    }
    let err = |name: &str, msg: String| BundleError::Recipe { path: PathBuf::from(format!("control.{name}")), msg };
    let dir = staging.join("control");
    std::fs::create_dir_all(&dir).map_err(BundleError::io(&dir))?;
    let mut loaded: Option<(crate::engine::Engine, crate::tokenizer::Tokenizer, crate::tokenizer::template::ChatTemplate)> = None;
    for (name, src) in &r.control {
        let cv = match src {
            super::recipe::ControlSource::Train { pairs, method, layers } => {
                progress(Progress::Step(&format!("training control vector {name}")));
                let list = control::read_pairs(pairs).map_err(|e| err(name, e.to_string()))?;
                if loaded.is_none() {
                    let engine = crate::engine::Engine::load(staging, &crate::engine::EngineOptions { threads: 0, max_seqs: 1, max_context: 0 }).map_err(|e| BundleError::Import(e.to_string()))?;
                    let tok = crate::tokenizer::Tokenizer::load(&staging.join(crate::model::TOKENIZER_PATH)).map_err(|e| BundleError::Import(e.to_string()))?;
                    let tpl = crate::tokenizer::template::ChatTemplate::load(&staging.join(crate::model::CHAT_TEMPLATE_PATH)).map_err(|e| BundleError::Import(e.to_string()))?;
                    loaded = Some((engine, tok, tpl));
                }
                let Some((engine, tok, tpl)) = loaded.as_mut() else { unreachable!("just loaded") };
                let file = pairs.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                let opts = TrainOptions { method: *method, layers: layers.clone(), source: format!("{} pairs from {file} (control/{name}.pairs.jsonl)", list.len()) };
                let cfg = engine.config().clone();
                let mut m = ModelRef { engine, prompts: crate::tokenizer::PromptBuilder::new(tok, tpl, &cfg) };
                let cv = control::train(&mut m, &list, &opts, &mut |_, _| {}).map_err(|e| err(name, e.to_string()))?;
                let p = dir.join(format!("{name}.pairs.jsonl"));
                std::fs::copy(pairs, &p).map_err(BundleError::io(pairs))?;
                cv
            }
            super::recipe::ControlSource::File(f) => {
                progress(Progress::Step(&format!("importing control vector {name}")));
                let cfg: crate::model::ModelConfig = serde_json::from_slice(
                    &std::fs::read(staging.join(crate::model::CONFIG_PATH)).map_err(BundleError::io(staging.join(crate::model::CONFIG_PATH)))?,
                )
                .map_err(|e| BundleError::Import(e.to_string()))?;
                let is_gguf = std::fs::read(f).map_err(BundleError::io(f))?.starts_with(b"GGUF");
                let cv = if is_gguf {
                    ControlVector::import_llamacpp(f, cfg.n_layers).map_err(|e| err(name, e.to_string()))?
                } else {
                    let bytes = std::fs::read(f).map_err(BundleError::io(f))?;
                    ControlVector::from_bytes(&bytes, &f.display().to_string()).map_err(|e| err(name, e.to_string()))?
                };
                cv.check_fits(name, cfg.n_layers, cfg.hidden_size).map_err(|e| err(name, e.to_string()))?;
                cv
            }
        };
        let p = dir.join(format!("{name}.safetensors"));
        std::fs::write(&p, cv.to_bytes().map_err(|e| err(name, e.to_string()))?).map_err(BundleError::io(&p))?;
    }
    Ok(())
}

/// Compile the recipe's named schemas against the imported tokenizer into `schemas/`.
fn compile_schemas(r: &ResolvedRecipe, staging: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<(), BundleError> {
    if r.schemas.is_empty() {
        return Ok(());
    }
    let err = |name: &str, msg: String| BundleError::Recipe { path: PathBuf::from(format!("schemas.{name}")), msg };
    let tok = crate::tokenizer::Tokenizer::load(&staging.join(crate::model::TOKENIZER_PATH)).map_err(|e| BundleError::Import(e.to_string()))?;
    let cfg: crate::model::ModelConfig = serde_json::from_slice(
        &std::fs::read(staging.join(crate::model::CONFIG_PATH)).map_err(BundleError::io(staging.join(crate::model::CONFIG_PATH)))?,
    )
    .map_err(|e| BundleError::Import(e.to_string()))?;
    let vocab = tok.generation_vocab(cfg.vocab_size);
    let vocab = std::sync::Arc::new(crate::schema::Vocabulary::new(&vocab, &cfg.eog_token_ids));
    let dir = staging.join("schemas");
    std::fs::create_dir_all(&dir).map_err(BundleError::io(&dir))?;
    let mut res = crate::schema::resources::Resources::new();
    for (uri, d) in &r.schema_resources {
        let n = res.load_dir(d, uri).map_err(|e| BundleError::Recipe { path: PathBuf::from(format!("schema_resources.{uri:?}")), msg: e.to_string() })?;
        progress(Progress::Step(&format!("{n} schema resources at {uri} from {}", d.display())));
    }
    for (name, path) in &r.schemas {
        progress(Progress::Step(&format!("compiling schema {name}")));
        let text = std::fs::read(path).map_err(BundleError::io(path))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| err(name, format!("{}: not JSON: {e}", path.display())))?;
        // The documents it references by URI are embedded: the stored source is what was
        // compiled, self-contained for an auditor.
        let bundled = crate::schema::resources::bundle(&v, &res).map_err(|e| err(name, format!("{}: {e}", path.display())))?;
        let text = match &bundled {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(b) => serde_json::to_vec_pretty(b).map_err(|e| err(name, e.to_string()))?,
        };
        let v = bundled.into_owned();
        // Build time has a long budget: the automaton then depends only on the schema and the
        // deterministic size caps, never on this machine's speed (reproducible builds).
        let opts = crate::schema::CompileOptions { max_compile_time: std::time::Duration::from_secs(600), ..Default::default() };
        let c = crate::schema::CompiledSchema::compile_with(&v, &vocab, &opts).map_err(|e| err(name, format!("{}: {e}", path.display())))?;
        std::fs::write(dir.join(format!("{name}.bin")), c.to_bytes()).map_err(BundleError::io(&dir))?;
        std::fs::write(dir.join(format!("{name}.json")), &text).map_err(BundleError::io(&dir))?;
    }
    Ok(())
}

/// The manifest fields that do not come from the members.
#[derive(Debug, Clone)]
pub struct BundleMeta {
    pub name: String,
    pub version: u64,
    pub created: String,
    pub expires: String,
    pub min_runtime: String,
    pub model: serde_json::Value,
    /// The manifest's `kernels` summary (FORMAT.md §11), when the bundle carries GPU kernels.
    pub kernels: Option<serde_json::Value>,
}

/// Package every file below `dir` (member paths relative to it) into a signed bundle at `out`.
pub fn pack_dir(dir: &Path, meta: &BundleMeta, keys: &[SecretKey], out: &Path, progress: &mut dyn FnMut(Progress<'_>)) -> Result<BuildOutput, BundleError> {
    if keys.is_empty() {
        return Err(BundleError::Recipe { path: out.into(), msg: "at least one --key is required".into() });
    }
    progress(Progress::Step("hashing members"));
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    let mut members = Vec::with_capacity(files.len());
    for rel in &files {
        let p = dir.join(rel);
        let path = rel.to_str().ok_or_else(|| BundleError::Import(format!("non-UTF-8 member path {}", rel.display())))?.replace('\\', "/");
        super::manifest::validate_path(&path).map_err(|msg| BundleError::Import(format!("member {path}: {msg}")))?;
        let size = std::fs::metadata(&p).map_err(BundleError::io(&p))?.len();
        members.push((Member { path, size, sha256: sha256_file(&p)? }, p));
    }
    members.sort_by(|a, b| a.0.path.as_bytes().cmp(b.0.path.as_bytes()));
    let manifest = Manifest {
        format: FORMAT_V1.into(),
        name: meta.name.clone(),
        version: meta.version,
        created: meta.created.clone(),
        expires: meta.expires.clone(),
        min_runtime: meta.min_runtime.clone(),
        model: meta.model.clone(),
        members: members.iter().map(|(m, _)| m.clone()).collect(),
        extra: meta.kernels.iter().map(|k| ("kernels".to_string(), k.clone())).collect(),
    };
    manifest.validate()?;
    let manifest_bytes = manifest.to_bytes()?;
    let mut sigs: Vec<_> = keys.iter().map(|k| sign_manifest(k, &manifest_bytes)).collect();
    sigs.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    sigs.dedup_by(|a, b| a.key_id == b.key_id);
    let sig_value = serde_json::json!({ "signatures": sigs });
    let signatures_bytes = super::canonical::to_canonical(&sig_value).map_err(super::FormatError::Signatures)?;

    progress(Progress::Step("writing bundle"));
    let refs: Vec<(Member, &Path)> = members.iter().map(|(m, p)| (m.clone(), p.as_path())).collect();
    writer::write_bundle(out, &manifest_bytes, &signatures_bytes, &refs, &mut |d, t| progress(Progress::Bytes { done: d, total: t }))?;
    let bytes = std::fs::metadata(out).map_err(BundleError::io(out))?.len();
    Ok(BuildOutput { identity: super::identity_of(&manifest_bytes), manifest, bytes })
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BundleError> {
    for e in std::fs::read_dir(dir).map_err(BundleError::io(dir))? {
        let e = e.map_err(BundleError::io(dir))?;
        let ft = e.file_type().map_err(BundleError::io(e.path()))?;
        if ft.is_dir() {
            collect(root, &e.path(), out)?;
        } else if ft.is_file() {
            out.push(e.path().strip_prefix(root).map(Path::to_path_buf).unwrap_or_else(|_| e.path()));
        } else {
            return Err(BundleError::Import(format!("{}: importer produced a non-regular file", e.path().display())));
        }
    }
    Ok(())
}
