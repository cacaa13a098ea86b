//! bundle (in progress)
