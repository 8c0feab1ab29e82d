//! Unix socket credentials and ownership.
