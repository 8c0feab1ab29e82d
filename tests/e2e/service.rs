//! End-to-end tests: service.
