//! trust (in progress)
