//! The reporters of `trainlet sidecar` and `trainlet exec --report`.
