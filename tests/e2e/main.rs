//! End-to-end tests: each module exercises one area through the real binaries.

mod barrier;
mod diff;
mod export;
mod first_hour;
mod format;
mod listing;
mod report;
mod resolve;
mod sampling;
mod service;
mod stacks;
mod start_failures;
mod store_reliability;
mod systemd;
mod who;
