//! End-to-end tests: resolve.
