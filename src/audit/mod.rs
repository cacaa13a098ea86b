//! audit (in progress)
