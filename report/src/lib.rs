//! The report core behind every dcpi report tool (`dcpiprof`, `dcpilist`, `dcpidiff`,
//! `dcpistats`, `dcpiexport`, `dcpictl top`): what they share lives here, once, with no
//! command-line types in it. The tools in `client/` and `dcpiexport/` are front ends that turn
//! their flags into calls on this crate.
//!
//! - [`escape`]: the one escaper for names from untrusted files (terminal, CSV, JSON text).
//! - [`render`]: the one renderer: a table description written as text, CSV or JSON.

pub mod escape;
pub mod render;
