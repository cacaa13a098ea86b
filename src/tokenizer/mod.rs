//! Tokenizer and chat templates.
//!
//! At build time ([`crate::import`]) the GGUF tokenizer metadata (`tokenizer.ggml.*`, see the GGUF
//! spec, github.com/ggml-org/ggml/blob/master/docs/gguf.md#tokenizer) is converted by
//! [`tokenizer_json_from_gguf`] into a Hugging Face `tokenizer.json` that reproduces llama.cpp's
//! tokenization: the BPE vocabulary and merges, the pre-tokenizer named by `tokenizer.ggml.pre`
//! (llama.cpp's `llama_vocab::impl::load` regexes), and control tokens as added special tokens.
//!
//! At run time [`Tokenizer`] wraps the `tokenizers` crate for encoding and precomputes the raw bytes
//! of every token ([`Tokenizer::token_bytes`]) for decoding, streaming ([`StreamDecoder`]), the
//! schema compiler and the safety masks. ASCII text through a GPT-2 style byte-level BPE (the
//! default model's) takes a fast path (`fast.rs`) that gives the same ids in a twentieth of the
//! time: a request's prompt is tokenized on the serving path.
//!
//! Special tokens follow llama.cpp: with `parse_special = true` control tokens in the text become
//! their single ids; with `false` they are tokenized as plain text. User-defined (non-control) added
//! tokens are always matched, as llama.cpp does.

mod fast;
pub mod template;
pub mod prompt;
pub mod reasoning;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};

pub use prompt::{Prompt, PromptBuilder, PromptError};
pub use template::{py_json, ChatMessage, ChatTemplate, PromptTools};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("tokenizer conversion: {0}")]
    Convert(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("chat template: unknown role {0:?}")]
    UnknownRole(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("this model has no chat template: it is a completion (base) model; send text to POST /v1/completions, or use `applianced run --raw`")]
    NoChatTemplate,
}

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
pub mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

/// The GGUF tokenizer metadata needed to build a `tokenizer.json`.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model` ("gpt2" for byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer name.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Option<Vec<i64>>,
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece models: a piece's merge priority).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece models; llama.cpp's default is true).
    pub add_space_prefix: Option<bool>,
}

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Json {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(regex: &str) -> Json {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// The pre-tokenizer (and BPE `ignore_merges`) for a llama.cpp `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: &str) -> Result<(Json, bool), TokenizerError> {
    Ok(match pre {
        "default" | "gpt2" | "gpt-2" => (byte_level(true), false),
        // llama.cpp: "\p{N}" then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => (
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]}),
            false,
        ),
        "llama3" | "llama-bpe" | "llama-v3" => (
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]}),
            true,
        ),
        "qwen2" => (json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]}), false),
        other => {
            return Err(TokenizerError::Convert(format!(
                "tokenizer.ggml.pre {other:?} is not supported (supported: default, gpt2, smollm, starcoder, llama-bpe, llama3, qwen2)"
            )))
        }
    })
}

/// Convert GGUF tokenizer metadata to a `tokenizer.json` (deterministic text).
pub fn tokenizer_json_from_gguf(v: &GgufVocab) -> Result<String, TokenizerError> {
    match v.model.as_str() {
        "gpt2" => {}
        "llama" => return spm_tokenizer_json(v),
        other => {
            return Err(TokenizerError::Convert(format!(
                "tokenizer.ggml.model {other:?} is not supported yet (supported: gpt2 byte-level BPE, llama SentencePiece)"
            )))
        }
    }
    check_vocab_lists(v)?;
    let (pre, ignore_merges) = pre_tokenizer(v.pre.as_deref().unwrap_or("default"))?;
    let (vocab, added) = vocab_and_added(v)?;
    let vocab_set: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
    for (i, m) in v.merges.iter().enumerate() {
        let ok = m.split_once(' ').is_some_and(|(a, b)| {
            !b.contains(' ') && vocab_set.contains(a) && vocab_set.contains(b) && vocab_set.contains(format!("{a}{b}").as_str())
        });
        if !ok {
            return Err(TokenizerError::Convert(format!("merge {i} {m:?} is not two known tokens forming a known token")));
        }
    }
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": byte_level(true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": v.merges,
        },
    });
    serde_json::to_string(&doc).map_err(|e| TokenizerError::Convert(e.to_string()))
}

/// The lists' lengths agree and there is a token.
fn check_vocab_lists(v: &GgufVocab) -> Result<(), TokenizerError> {
    if v.tokens.is_empty() {
        return Err(TokenizerError::Convert("tokenizer.ggml.tokens is empty".into()));
    }
    if let Some(tt) = &v.token_types {
        if tt.len() != v.tokens.len() {
            return Err(TokenizerError::Convert(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                tt.len(),
                v.tokens.len()
            )));
        }
    }
    if let Some(sc) = &v.scores {
        if sc.len() != v.tokens.len() {
            return Err(TokenizerError::Convert(format!("tokenizer.ggml.scores has {} entries for {} tokens", sc.len(), v.tokens.len())));
        }
    }
    Ok(())
}

/// The model vocabulary (every token, by id) and the added-token entries: control and unknown
/// tokens as special, user-defined ones as plain added tokens (always matched, as llama.cpp does).
fn vocab_and_added(v: &GgufVocab) -> Result<(Map<String, Json>, Vec<Json>), TokenizerError> {
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, tok) in v.tokens.iter().enumerate() {
        if vocab.insert(tok.clone(), json!(id)).is_some() {
            return Err(TokenizerError::Convert(format!("token {tok:?} (id {id}) appears twice in tokenizer.ggml.tokens")));
        }
        let ty = v.token_types.as_ref().map_or(token_type::NORMAL, |t| t[id]);
        let special = match ty {
            token_type::CONTROL | token_type::UNKNOWN => true,
            token_type::USER_DEFINED => false,
            _ => continue,
        };
        added.push(json!({
            "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": special,
        }));
    }
    Ok((vocab, added))
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma) as a
/// `tokenizer.json` BPE with byte fallback, reproducing llama.cpp's `llm_tokenizer_spm`.
///
/// llama.cpp splits the text into UTF-8 characters (spaces written `▁`, with a leading `▁` when
/// `add_space_prefix`), then repeatedly joins the adjacent pair whose concatenation is a token
/// with the highest score (the leftmost on a tie); characters left outside the vocabulary become
/// their `<0xNN>` byte tokens. The leading `▁` is added to the text and after every added token. A BPE whose merges are every split `a + b` of every token `ab`
/// (both halves tokens), ranked by the score of `ab`, does the same (Hugging Face's
/// `SentencePieceExtractor` builds Gemma's `tokenizer.json` that way). The one difference: two
/// different pieces with equal scores are joined in rank order where llama.cpp takes the leftmost
/// pair; SentencePiece scores are distinct (Gemma 3's normal pieces have no tie), and control
/// tokens, which share a score, are split out of the text before. Merges are written as pairs,
/// since SentencePiece pieces may contain spaces.
fn spm_tokenizer_json(v: &GgufVocab) -> Result<String, TokenizerError> {
    check_vocab_lists(v)?;
    let scores = v.scores.as_ref().ok_or_else(|| TokenizerError::Convert("tokenizer.ggml.scores is missing (a SentencePiece vocabulary needs them)".into()))?;
    if scores.iter().any(|s| !s.is_finite()) {
        return Err(TokenizerError::Convert("tokenizer.ggml.scores holds a value that is not finite".into()));
    }
    let (vocab, added) = vocab_and_added(v)?;
    let unk = v.token_types.as_ref().and_then(|tt| tt.iter().position(|&t| t == token_type::UNKNOWN)).map(|i| v.tokens[i].clone());
    // Merges: (score of the joined token, its id, left id, right id), best score first; ties keep
    // the joined token's id order, then the halves' ids (as SentencePieceExtractor's stable sorts).
    let id_of: std::collections::HashMap<&str, usize> = v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, tok) in v.tokens.iter().enumerate() {
        let mut local = Vec::new();
        for (cut, _) in tok.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (id_of.get(&tok[..cut]), id_of.get(&tok[cut..])) {
                local.push((l, r));
            }
        }
        local.sort_unstable();
        merges.extend(local.into_iter().map(|(l, r)| (scores[id], id, l, r)));
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
    let merges: Vec<Json> = merges.iter().map(|&(_, _, l, r)| json!([v.tokens[l], v.tokens[r]])).collect();
    let mut normalizers = Vec::new();
    if v.add_space_prefix.unwrap_or(true) {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    serde_json::to_string(&doc).map_err(|e| TokenizerError::Convert(e.to_string()))
}

/// GPT-2's byte ↔ unicode table (`bytes_to_unicode`): the char each byte is spelled with.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        // c < 256 + 256, always a valid scalar value.
        table[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    table
}

/// How token strings map to bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2 byte-level (`Ġ` = space, ...).
    ByteLevel,
    /// SentencePiece (`▁` = space, `<0xAB>` = byte).
    SentencePiece,
    /// Token text is the text.
    Plain,
}

/// All tokens' bytes in one buffer.
struct TokenTable {
    data: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]`.
    offsets: Vec<usize>,
}

impl TokenTable {
    fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// A loaded tokenizer.
pub struct Tokenizer {
    /// Splits control tokens out of the text (parse_special = true).
    parse_special: tokenizers::Tokenizer,
    /// Treats control tokens as plain text (parse_special = false).
    plain: tokenizers::Tokenizer,
    table: Arc<TokenTable>,
    special: Vec<bool>,
    special_ids: Vec<u32>,
    vocab_size: usize,
    /// The byte-level BPE fast path, when this tokenizer is one it reproduces.
    fast: Option<fast::FastBpe>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size).field("fast_path", &self.fast.is_some()).finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.into(), source })?;
        let t = Self::from_json(&text).map_err(|e| match e {
            TokenizerError::Convert(msg) => TokenizerError::Format { path: path.into(), msg },
            e => e,
        });
        drop(text);
        crate::model::release_freed_heap(); // the parse's transient JSON trees
        t
    }

    /// Build from `tokenizer.json` text.
    pub fn from_json(text: &str) -> Result<Tokenizer, TokenizerError> {
        let bad = |m: String| TokenizerError::Convert(m);
        // Malformed JSON is refused here; the tokenizers crate panics on some of it (an
        // `expect` in its decoder deserializer), and any panic left in it is an error too.
        // A repeated key would let this view and the tokenizers crate's disagree on the document.
        let doc: Json = crate::json::parse_unique(text.as_bytes()).map_err(|e| bad(format!("not a tokenizer.json: {e}")))?;
        check_bpe_merges(&doc).map_err(bad)?;
        let parse_special: tokenizers::Tokenizer = std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>())
            .map_err(|_| bad("not a tokenizer.json: the tokenizers library failed on it".into()))?
            .map_err(|e| bad(format!("not a tokenizer.json: {e}")))?;
        let mut plain = parse_special.clone();
        plain.set_encode_special_tokens(true);
        let spelling = detect_spelling(&doc);

        let vocab = parse_special.get_vocab(true);
        let vocab_size = vocab.values().max().map_or(0, |m| *m as usize + 1);
        // Ids are dense in real vocabularies; a sparse one would make the tables below huge.
        if vocab_size > 2 * vocab.len() + 4096 {
            return Err(bad(format!("token ids run up to {} for {} tokens: the ids must be dense", vocab_size - 1, vocab.len())));
        }
        let mut names: Vec<Option<String>> = vec![None; vocab_size];
        for (tok, id) in vocab {
            names[id as usize] = Some(tok);
        }
        let mut special = vec![false; vocab_size];
        let mut special_ids = Vec::new();
        for (id, tok) in parse_special.get_added_tokens_decoder() {
            if tok.special && (id as usize) < vocab_size {
                special[id as usize] = true;
                special_ids.push(id);
            }
        }
        special_ids.sort_unstable();
        let b2c = byte_to_char_table();
        let mut c2b = std::collections::HashMap::new();
        for (b, c) in b2c.iter().enumerate() {
            c2b.insert(*c, b as u8);
        }
        let added: HashSet<u32> = parse_special.get_added_tokens_decoder().keys().copied().collect();
        let mut data = Vec::new();
        let mut offsets = Vec::with_capacity(vocab_size + 1);
        for (id, name) in names.iter().enumerate() {
            offsets.push(data.len());
            let Some(name) = name else { continue };
            if added.contains(&(id as u32)) {
                data.extend_from_slice(name.as_bytes());
                continue;
            }
            match spelling {
                Spelling::ByteLevel => {
                    for ch in name.chars() {
                        match c2b.get(&ch) {
                            Some(b) => data.push(*b),
                            None => data.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                Spelling::SentencePiece => {
                    if let Some(b) = sp_byte_token(name) {
                        data.push(b);
                    } else {
                        data.extend_from_slice(name.replace('\u{2581}', " ").as_bytes());
                    }
                }
                Spelling::Plain => data.extend_from_slice(name.as_bytes()),
            }
        }
        offsets.push(data.len());
        // The fast path takes an added token's id from its `added_tokens` entry; the `tokenizers`
        // crate gives the token the model vocabulary's id for its content (or the next free one),
        // so the two agree only when the entry's id is that id. A file where they differ (a
        // hand-edited or damaged tokenizer.json) is left to the crate alone.
        let fast = fast::FastBpe::from_doc(&doc)
            .filter(|f| f.specials().iter().all(|(s, id)| std::str::from_utf8(s).ok().and_then(|s| parse_special.token_to_id(s)) == Some(*id)));
        Ok(Tokenizer {
            parse_special,
            plain,
            table: Arc::new(TokenTable { data, offsets }),
            special,
            special_ids,
            vocab_size,
            fast,
        })
    }

    /// Tokenize `text` (no BOS is added: see `ModelConfig::add_bos_token`). With `parse_special`,
    /// control tokens written in the text become their ids; without, they are plain text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        if let Some(ids) = self.fast.as_ref().and_then(|f| f.encode(text, parse_special)) {
            return Ok(ids);
        }
        self.encode_general(text, parse_special)
    }

    /// [`Tokenizer::encode`] through the `tokenizers` crate only (the reference of the fast path).
    pub fn encode_general(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let tk = if parse_special { &self.parse_special } else { &self.plain };
        let enc = tk.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Concatenated token bytes, invalid UTF-8 replaced by U+FFFD. Special tokens are spelled out.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes token `id` spells (a special token's text for special tokens; empty for an
    /// unknown id).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.table.get(id)
    }

    /// Whether ASCII text is encoded by the byte-level BPE fast path (`fast.rs`) rather than the
    /// `tokenizers` crate (same ids either way).
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Whether `text` would be encoded by the fast path (tests and benchmarks).
    pub fn takes_fast_path(&self, text: &str) -> bool {
        self.fast.as_ref().is_some_and(|f| f.encode(text, true).is_some())
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// All special (control) token ids, ascending.
    pub fn special_ids(&self) -> &[u32] {
        &self.special_ids
    }

    /// Every token's bytes, ids `0..vocab_size()` (special tokens spelled as their text): the
    /// input of the safety-mask compiler and its vocabulary digest.
    pub fn all_token_bytes(&self) -> Vec<Vec<u8>> {
        (0..self.vocab_size() as u32).map(|id| self.token_bytes(id).to_vec()).collect()
    }

    /// Token bytes for ids `0..n` as the schema compiler and structured-output masks see them:
    /// special (control) tokens and ids past the tokenizer's vocabulary are empty, so no mask
    /// ever allows them. `n` is the model's vocabulary size (the logits' length).
    pub fn generation_vocab(&self, n: usize) -> Vec<Vec<u8>> {
        (0..n as u32)
            .map(|id| if self.is_special(id) || id as usize >= self.vocab_size() { Vec::new() } else { self.token_bytes(id).to_vec() })
            .collect()
    }

    /// The id of a token by its vocabulary string (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.parse_special.token_to_id(token)
    }

    /// An incremental decoder sharing this tokenizer's byte table.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder { table: Arc::clone(&self.table), pending: Vec::new() }
    }
}

fn sp_byte_token(name: &str) -> Option<u8> {
    let hex = name.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The BPE model's merges against its `continuing_subword_prefix`: the tokenizers crate slices the
/// prefix's length off each merge's second part (and panics where that part is shorter or the cut
/// falls inside a character), so such a merge is refused here first.
fn check_bpe_merges(doc: &Json) -> Result<(), String> {
    let model = &doc["model"];
    let Some(prefix) = model["continuing_subword_prefix"].as_str() else { return Ok(()) };
    if model["type"].as_str().is_some_and(|t| t != "BPE") || prefix.is_empty() {
        return Ok(());
    }
    let Some(merges) = model["merges"].as_array() else { return Ok(()) };
    for (i, m) in merges.iter().enumerate() {
        let second = match m {
            Json::String(line) => line.split(' ').nth(1),
            Json::Array(pair) => pair.get(1).and_then(Json::as_str),
            _ => None,
        };
        if let Some(b) = second {
            if b.get(prefix.len()..).is_none() {
                let shown: String = b.chars().take(32).collect();
                return Err(format!(
                    "not a tokenizer.json: merge {}: its second part {shown:?} does not start with the {}-byte continuing_subword_prefix",
                    i + 1,
                    prefix.len()
                ));
            }
        }
    }
    Ok(())
}

fn detect_spelling(doc: &Json) -> Spelling {
    let s = doc.get("decoder").map(|d| d.to_string()).unwrap_or_default()
        + &doc.get("pre_tokenizer").map(|d| d.to_string()).unwrap_or_default();
    if s.contains("\"ByteLevel\"") {
        Spelling::ByteLevel
    } else if s.contains("Metaspace") || s.contains('\u{2581}') || doc.pointer("/model/byte_fallback") == Some(&Json::Bool(true)) {
        Spelling::SentencePiece
    } else {
        Spelling::Plain
    }
}

/// Incremental detokenizer: [`push`](Self::push) returns only text whose UTF-8 is complete, holding
/// back the bytes of a character split across tokens. Bytes that can never become valid UTF-8 are
/// emitted as U+FFFD.
#[derive(Clone)]
pub struct StreamDecoder {
    table: Arc<TokenTable>,
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Add one token; returns the newly complete text (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.table.get(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 by `valid_up_to`'s contract.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            rest = bad;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Flush held-back bytes (as U+FFFD if they never completed a character).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small SentencePiece vocabulary: control tokens, the 256 byte tokens, pieces with scores
    /// (several joining to one token, a piece with a space in it), a user-defined token. Scores
    /// are distinct, as in real SentencePiece models (Gemma 3's 255 474 normal pieces have 0 ties).
    fn spm_vocab(add_space_prefix: bool) -> GgufVocab {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..256 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
            scores.push(0.0);
        }
        let pieces: &[(&str, f32)] = &[
            ("\u{2581}", -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("ab", -5.0), ("bc", -5.2), ("abc", -6.0),
            ("\u{2581}a", -7.0), ("\u{2581}ab", -8.0), ("ca", -9.0), ("cab", -10.0), ("é", -11.0), ("\u{2581}\u{2581}", -12.0),
            ("a b", -13.0), ("bb", -5.1), ("bbb", -14.0),
        ];
        for &(p, sc) in pieces {
            tokens.push(p.into());
            types.push(token_type::NORMAL);
            scores.push(sc);
        }
        tokens.push("<tag>".into());
        types.push(token_type::USER_DEFINED);
        scores.push(-1000.0);
        GgufVocab { model: "llama".into(), tokens, token_types: Some(types), scores: Some(scores), add_space_prefix: Some(add_space_prefix), ..Default::default() }
    }

    /// llama.cpp's `llm_tokenizer_spm`, written out plainly: the reference for the conversion.
    fn spm_reference(v: &GgufVocab, text: &str) -> Vec<u32> {
        let id_of: std::collections::HashMap<&str, usize> = v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        let scores = v.scores.as_ref().unwrap();
        let mut out = Vec::new();
        // User-defined tokens are split out first (parse_special = false leaves control tokens as text).
        let mut rest = text;
        let mut first = true; // the fragment starts the text or follows an added token
        while !rest.is_empty() {
            let (chunk, tag) = match rest.find("<tag>") {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            if !chunk.is_empty() {
                let mut s = chunk.replace(' ', "\u{2581}");
                // llama.cpp prefixes the first fragment and every fragment after an added token.
                if first && v.add_space_prefix.unwrap_or(true) {
                    s.insert(0, '\u{2581}');
                }
                let mut syms: Vec<String> = s.chars().map(String::from).collect();
                loop {
                    let mut best: Option<(f32, usize)> = None;
                    for i in 0..syms.len().saturating_sub(1) {
                        if let Some(&id) = id_of.get(format!("{}{}", syms[i], syms[i + 1]).as_str()) {
                            if best.map_or(true, |(b, _)| scores[id] > b) {
                                best = Some((scores[id], i));
                            }
                        }
                    }
                    let Some((_, i)) = best else { break };
                    let r = syms.remove(i + 1);
                    syms[i].push_str(&r);
                }
                for sym in syms {
                    match id_of.get(sym.as_str()) {
                        Some(&id) => out.push(id as u32),
                        None => out.extend(sym.bytes().map(|b| id_of[format!("<0x{b:02X}>").as_str()] as u32)),
                    }
                }
            }
            if !tag {
                break;
            }
            first = true;
            out.push(id_of["<tag>"] as u32);
            rest = &rest[chunk.len() + "<tag>".len()..];
        }
        out
    }

    #[test]
    fn sentencepiece_conversion_matches_llamacpp_algorithm() {
        for prefix in [false, true] {
            let v = spm_vocab(prefix);
            let t = Tokenizer::from_json(&tokenizer_json_from_gguf(&v).unwrap()).unwrap();
            let cases = ["abc", "cabc", "a b", "ab ab  abc", " a", "bbbb", "bbbbb", "é€x", "", "a<tag>b", "<tag>", "<s>ab", "a  b ccab bc"];
            for c in cases {
                assert_eq!(t.encode(c, false).unwrap(), spm_reference(&v, c), "{c:?} prefix={prefix}");
            }
            // Bytes and pieces decode back to the text (a leading prefix space aside).
            let ids = t.encode("ab €c", false).unwrap();
            assert_eq!(t.decode(&ids).trim_start(), "ab €c");
            assert!(t.is_special(1) && !t.is_special(v.tokens.len() as u32 - 1));
        }
    }

    proptest::proptest! {
        #[test]
        fn sentencepiece_conversion_matches_on_random_text(text in "([abc é€]|<tag>|a b){0,24}") {
            let v = spm_vocab(false);
            let t = Tokenizer::from_json(&tokenizer_json_from_gguf(&v).unwrap()).unwrap();
            proptest::prop_assert_eq!(t.encode(&text, false).unwrap(), spm_reference(&v, &text));
        }
    }

    pub(crate) fn tiny() -> Tokenizer {
        let b2c = byte_to_char_table();
        let mut tokens: Vec<String> = vec!["<|im_start|>".into(), "<|im_end|>".into()];
        tokens.extend((0..256).map(|b| b2c[b].to_string()));
        tokens.push("Ġh".into());
        let mut types = vec![3, 3];
        types.extend(std::iter::repeat(1).take(257));
        let v = GgufVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens,
            token_types: Some(types),
            merges: vec!["Ġ h".into()],
            ..Default::default()
        };
        Tokenizer::from_json(&tokenizer_json_from_gguf(&v).unwrap()).unwrap()
    }

    #[test]
    fn tiny_roundtrip_and_specials() {
        let t = tiny();
        let ids = t.encode("<|im_start|> hé", true).unwrap();
        assert_eq!(ids[0], 0);
        assert_eq!(ids[1], 258);
        assert_eq!(t.decode(&ids), "<|im_start|> hé");
        let plain = t.encode("<|im_start|>", false).unwrap();
        assert_eq!(plain.len(), "<|im_start|>".len());
        assert_eq!(t.token_bytes(2 + b'a' as u32), b"a");
        assert!(t.is_special(1));
        assert_eq!(t.special_ids(), &[0, 1]);
    }

    /// The fuzzer's find: a merge whose second part is shorter than the continuing_subword_prefix
    /// panicked inside the tokenizers crate (an abort under the fuzzer, where `catch_unwind` cannot
    /// help); it is refused before the crate sees it. A repeated key is refused as well.
    #[test]
    fn hostile_merges_and_repeated_keys_are_refused_before_the_tokenizers_crate() {
        let doc = |merges: &str, prefix: &str| {
            format!(
                r###"{{"version":"1.0","model":{{"type":"BPE","continuing_subword_prefix":{prefix},"vocab":{{"a":0,"b":1,"##b":2,"a##b":3,"ab":4}},"merges":{merges}}}}}"###
            )
        };
        for merges in [r#"["a b"]"#, r#"[["a","b"]]"#, r#"[["a","xé"]]"#] {
            let e = Tokenizer::from_json(&doc(merges, r###""##""###)).unwrap_err().to_string();
            assert!(e.contains("continuing_subword_prefix") && e.contains("merge 1"), "{merges}: {e}");
        }
        // The well-formed document loads.
        Tokenizer::from_json(&doc(r###"["a ##b"]"###, r###""##""###)).unwrap();
        // The same key twice: serde_json and the tokenizers crate could each keep a different one.
        let twice = doc(r###"["a ##b"]"###, r###""##","continuing_subword_prefix":null"###);
        let e = Tokenizer::from_json(&twice).unwrap_err().to_string();
        assert!(e.contains("duplicate key \"continuing_subword_prefix\""), "{e}");
    }

    /// A byte-level BPE with overlapping merges, equal-looking pairs at several ranks, digits,
    /// whitespace and contraction tokens: what the fast path must reproduce.
    fn rich() -> Tokenizer {
        let b2c = byte_to_char_table();
        let sp = |s: &str| s.bytes().map(|b| b2c[b as usize]).collect::<String>();
        let mut tokens: Vec<String> = vec!["<|im_start|>".into(), "<|im_end|>".into(), "<|im".into()];
        tokens.extend((0..256).map(|b| b2c[b].to_string()));
        let pairs = [
            ("a", "a"), ("aa", "a"), ("aa", "aa"), ("t", "h"), (" ", "t"), (" t", "h"), ("h", "e"), (" th", "e"), ("i", "n"),
            ("e", "r"), ("'", "s"), ("'", "re"), ("r", "e"), (" ", " "), ("\n", "\n"), ("  ", " "), ("1", "2"), (" ", "a"),
            ("<", "|"), ("<|", "im"), ("i", "m"), (".", "."), ("..", "."), (" ", "."), ("in", "g"), ("th", "in"), ("thin", "g"),
        ];
        let mut merges = Vec::new();
        for (a, b) in pairs {
            let (a, b) = (sp(&a.replace("\\n", "\n")), sp(&b.replace("\\n", "\n")));
            let m = format!("{a}{b}");
            if !tokens.contains(&m) {
                tokens.push(m);
            }
            merges.push(format!("{a} {b}"));
        }
        let mut types = vec![3, 3, 1];
        types.extend(std::iter::repeat(1).take(tokens.len() - 3));
        let v = GgufVocab { model: "gpt2".into(), pre: Some("smollm".into()), tokens, token_types: Some(types), merges, ..Default::default() };
        Tokenizer::from_json(&tokenizer_json_from_gguf(&v).unwrap()).unwrap()
    }

    #[test]
    fn fast_path_matches_the_tokenizers_crate_on_cases() {
        let t = rich();
        let fast = t.fast.as_ref().expect("a smollm-style byte-level BPE takes the fast path");
        let cases = [
            "", " ", "  ", "a", "aaaaaaa", " the thing", "the's they're 're 'x ''s", "  hello", "\t\tx", "a \n\nb", "x  \n y",
            "12 345 a1b2", "...  .. .", "<|im_start|>user\nhi<|im_end|>\n", "<|im<|im_start|>", "end  ", "end\n", "\x0b\x0c\r x",
            " !?\"#$%&()*+,-./:;<=>@[\\]^_`{|}~ ", "\0\x01\x7f", "thin things thinking", "a\u{a0}b", "h\u{e9}",
        ];
        for c in cases {
            for special in [true, false] {
                assert_eq!(t.encode(c, special).unwrap(), t.encode_general(c, special).unwrap(), "{c:?} special={special}");
                assert_eq!(fast.encode(c, special).is_some(), c.is_ascii(), "{c:?}");
            }
        }
        let long = "=".repeat(500);
        assert!(fast.encode(&long, true).is_none(), "a long pre-token goes to the general encoder");
        assert_eq!(t.encode(&long, true).unwrap(), t.encode_general(&long, true).unwrap());
    }

    proptest::proptest! {
        #[test]
        fn fast_path_matches_the_tokenizers_crate(text in "([ath eirns'.12\n\t\r]|<\\|im_start\\|>|<\\|im|'re|'s|  |é){0,40}", special: bool) {
            let t = rich();
            proptest::prop_assert_eq!(t.encode(&text, special).unwrap(), t.encode_general(&text, special).unwrap());
        }
    }

    #[test]
    fn fast_path_declines_what_it_does_not_reproduce() {
        let base: Json = serde_json::from_str(&tokenizer_json_from_gguf(&GgufVocab {
            model: "gpt2".into(),
            pre: Some("smollm".into()),
            tokens: byte_to_char_table().iter().map(|c| c.to_string()).collect(),
            token_types: None,
            merges: vec![],
            ..Default::default()
        })
        .unwrap())
        .unwrap();
        assert!(fast::FastBpe::from_doc(&base).is_some());
        for (ptr, v) in [
            ("/normalizer", json!({"type": "NFC"})),
            ("/model/ignore_merges", json!(true)),
            ("/model/byte_fallback", json!(true)),
            ("/model/dropout", json!(0.1)),
            ("/pre_tokenizer", json!({"type": "Metaspace"})),
            ("/pre_tokenizer/pretokenizers/1/add_prefix_space", json!(true)),
            ("/added_tokens", json!([{"id": 1, "content": "x", "special": false}])),
        ] {
            let mut d = base.clone();
            *d.pointer_mut(ptr).unwrap_or_else(|| panic!("{ptr}")) = v;
            assert!(fast::FastBpe::from_doc(&d).is_none(), "{ptr}");
        }
        for pre in ["llama3", "qwen2"] {
            let mut d = base.clone();
            d["pre_tokenizer"] = pre_tokenizer(pre).unwrap().0;
            assert!(fast::FastBpe::from_doc(&d).is_none(), "{pre}");
        }
    }

    /// An `added_tokens` entry whose id is not the one the vocabulary gives its content (the fuzz
    /// finding `tokenizer_json/fast-path-disagrees-on-special.bin`): the fast path would split the
    /// token out under the entry's id while the `tokenizers` crate uses another, so the tokenizer
    /// must fall back to the crate, and both paths then agree.
    #[test]
    fn fast_path_declines_an_added_token_whose_id_the_vocabulary_contradicts() {
        let good = rich();
        assert!(good.takes_fast_path("hi<|im_end|>"));
        let b2c = byte_to_char_table();
        let mut tokens: Vec<String> = vec!["<|im_start|>".into(), "D|im_end|>".into()];
        tokens.extend((0..256).map(|b| b2c[b].to_string()));
        let mut types = vec![3, 3];
        types.extend(std::iter::repeat(1).take(256));
        let v = GgufVocab { model: "gpt2".into(), pre: Some("smollm".into()), tokens, token_types: Some(types), merges: vec![], ..Default::default() };
        let mut doc: Json = serde_json::from_str(&tokenizer_json_from_gguf(&v).unwrap()).unwrap();
        let added = doc["added_tokens"].as_array_mut().unwrap();
        let entry = added.iter_mut().find(|t| t["id"] == 1).unwrap();
        entry["content"] = json!("<|im_end|>");
        let t = Tokenizer::from_json(&doc.to_string()).unwrap();
        let text = "hi<|im_end|>";
        assert!(!t.takes_fast_path(text));
        assert_eq!(t.encode(text, true).unwrap(), t.encode_general(text, true).unwrap());
    }

    #[test]
    fn stream_decoder_holds_partial_chars() {
        let t = tiny();
        let ids = t.encode("é€", false).unwrap();
        assert_eq!(ids.len(), 5);
        let mut d = t.stream_decoder();
        let parts: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
        assert_eq!(parts, vec!["", "é", "", "", "€"]);
        assert_eq!(d.finish(), "");
    }
}
