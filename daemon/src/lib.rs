//! dcpid, the dcpi daemon, as a library so that its parts can be tested and benchmarked.
//!
//! Data flow (see `daemon/ARCHITECTURE.md`):
//! `perf` (per-CPU rings, drain threads) → `aggregate` (per-CPU tables keyed by
//! (pid, address-space version, pc, event)) → `resolve` (pc → image, offset) → `store`
//! (local spool, then the shared database).

pub mod aggregate;
pub mod cli;
pub mod config;
pub mod control;
pub mod faults;
pub mod man;
pub mod notify;
pub mod offcpu;
pub mod perf;
pub mod resolve;
pub mod service;
pub mod status;
pub mod store;
pub mod sys;
pub mod types;
pub mod watch;
pub mod who;
