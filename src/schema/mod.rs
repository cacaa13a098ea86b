//! schema (in progress)
