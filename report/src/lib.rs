//! The report core behind every dcpi report tool (`dcpiprof`, `dcpilist`, `dcpidiff`,
//! `dcpistats`, `dcpiexport`, `dcpictl top`): what they share lives here, once, with no
//! command-line types in it. The tools in `client/` and `dcpiexport/` are front ends that turn
//! their flags into calls on this crate.
//!
//! - [`escape`]: the one escaper for names from untrusted files (terminal, CSV, JSON text).
//! - [`select`] picks epochs and host directories and loads profiles and summaries (through
//!   the profile-format crate's guarded readers);
//! - [`report`] weights and aggregates them into per-image or per-symbol reports;
//! - [`symbolize`], [`elfparts`], [`symcache`] and [`debuginfo`] turn stored offsets into
//!   symbols, finding the exact build of each binary and its separate debug information;
//! - [`symbolizer`] is the one symbolizer: what names an offset of any kind of image;
//! - [`names`] demangles and makes names printable; [`image`] names images and matches
//!   `--image` specs; [`stats`] counts work for `--stats`; [`error`] is the errors of a run.
//! - [`render`]: the one renderer: a table description written as text, CSV or JSON.
//! - [`timeline`]: samples per time bucket from the slice logs (`--by time`, the HTML chart).
#![forbid(unsafe_code)]

pub mod debuginfo;
pub mod elfparts;
pub mod error;
pub mod escape;
pub mod image;
pub mod names;
pub mod render;
pub mod report;
pub mod select;
pub mod stats;
pub mod symbolize;
pub mod symbolizer;
pub mod symcache;
pub mod timeline;
pub mod timerange;

pub use error::ProfError;

#[cfg(test)]
mod tests {
    use dcpi_testkit::modgraph;

    /// Issue 34: the module graph of this crate has no cycle (a lower module never imports a
    /// higher one), so that it cannot come back unnoticed.
    #[test]
    fn the_module_graph_has_no_cycle() {
        modgraph::assert_acyclic(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    }
}
