//! Prometheus metrics and the admin server.
