//! The integration tests of this crate, as one test binary (one link, one process; the
//! layout of ripgrep's and blazesym's suites). Shared helpers live in the support modules.

// Reads /proc and files it wrote itself (clippy.toml forbids plain reads in the library).
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

mod common;
mod compact;
mod corruption;
mod db;
mod hostile;
mod ksymstore;
mod module_graph;
mod roundtrip;
mod seeds;
