//! Signal handling.
