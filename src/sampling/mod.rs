//! sampling (in progress)
