//! End-to-end tests: each module exercises one area through the real binaries.

mod barrier;
mod format;
mod report;
mod resolve;
mod sampling;
mod service;
mod systemd;
