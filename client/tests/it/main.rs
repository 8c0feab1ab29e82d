//! The integration tests of this crate, as one test binary (one link, one process; the
//! layout of ripgrep's and blazesym's suites). Shared helpers live in the support modules.
#![forbid(unsafe_code)]

mod dcpidiff;
mod dcpilist;
mod dcpiprof;
mod export;
mod first_hour;
mod fresh;
mod hostile_db;
mod hostile_files;
mod hostile_names;
mod per_command;
mod planted_links;
mod pprof_proto;
mod symbolizer;
mod threads;
mod timeline;
mod util;
mod who_profiles;
mod wide_names;
