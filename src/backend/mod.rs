//! backend (in progress)
