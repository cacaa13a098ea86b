//! The token-mask core shared by safety masks (`policy::safety`) and compiled schemas
//! (`schema`): both are a byte DFA plus, per state, the set of vocabulary tokens whose bytes the
//! DFA can read from that state without dying. This module owns what they have in common — the
//! vocabulary trie the mask compilers walk ([`Trie`]), the in-memory mask table
//! ([`MaskTable`]), the one wire codec of DFA and masks ([`write_core`] / [`read_core`],
//! FORMAT.md §10.5) and the bounded reader every decoder of those members uses ([`Reader`]).

mod table;
mod trie;
mod wire;

pub use table::{read_core, write_core, DfaTables, MaskTable, DEAD};
pub use trie::Trie;
pub use wire::{put_bitmap, put_u16, put_u32, put_u64, Reader, WireError};
