//! End-to-end tests: report.
