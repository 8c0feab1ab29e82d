//! End-to-end tests: sampling.
