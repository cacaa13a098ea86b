//! applianced: a signed-bundle local LLM appliance for air-gapped edge boxes.
//!
//! One module per concept: [`bundle`] (the `.zlb` format, verify, store), [`trust`] (keys, trust
//! store, threshold, rollback state), [`import`] (GGUF / Hugging Face → the bundle's model layout),
//! [`model`] (that layout), [`tokenizer`] (tokenizer and chat templates), [`engine`] (the Llama
//! forward pass and KV cache) over [`backend`] (one trait, one module per backend), [`sampling`]
//! (samplers and token masks), [`tokenmask`] (the DFA + token-mask core and its wire codec),
//! [`schema`] (JSON Schema → token automaton), [`json`] (strict JSON: no repeated keys), [`tools`] (tool calling: one grammar per tool set, the call reader), [`policy`] (safety masks, redaction, presets), [`runtime`] (a verified bundle loaded for generation: the one
//! loader, prompt builder and generation step every caller uses), [`server`] (the Unix-socket API), [`audit`] (hash-chained log),
//! [`cli`] (the `applianced` command line).
#![deny(unsafe_code)]

pub mod audit;
pub mod backend;
pub mod bundle;
pub mod cli;
pub mod engine;
pub mod import;
pub mod json;
pub mod model;
pub mod oci;
pub mod policy;
pub mod runtime;
pub mod sampling;
pub mod schema;
pub mod server;
pub mod sys;
pub mod tokenizer;
pub mod tokenmask;
pub mod tools;
pub mod trust;
