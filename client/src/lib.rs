//! Library behind `dcpictl` (daemon control), `dcpiprof` (reports), `dcpilist`
//! (per-instruction listings), `dcpidiff` (what changed between two selections) and `dcpistats`
//! (whether a change is significant, over epochs); `dcpiexport` (in `dcpiexport/`) also reads
//! databases through it.
#![forbid(unsafe_code)]

pub mod args;
pub mod ctl;
pub mod diff;
/// The escaper lives in the report core; this path stays for the tools and tests that use it.
pub use dcpi_report::escape;
pub mod list;
pub mod manpages;
pub mod prof;
pub mod term;
pub mod top;

#[cfg(test)]
mod tests {
    /// Every binary of this crate is named in the crate documentation above and installed by
    /// the Makefile (its PROGRAMS list), so neither can forget a tool again.
    #[test]
    fn every_tool_is_documented_and_installed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).expect("src/lib.rs");
        let doc: String = lib.lines().take_while(|l| l.starts_with("//!")).collect();
        let makefile = std::fs::read_to_string(dir.join("../Makefile")).expect("Makefile");
        let programs = makefile
            .lines()
            .find_map(|l| l.strip_prefix("PROGRAMS"))
            .expect("PROGRAMS in the Makefile");
        let mut tools = Vec::new();
        for e in std::fs::read_dir(dir.join("src/bin")).expect("src/bin") {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            let Some(tool) = name.strip_suffix(".rs") else { continue };
            assert!(
                doc.contains(&format!("`{tool}`")),
                "{tool} is missing from lib.rs's documentation"
            );
            assert!(
                programs.split_whitespace().any(|p| p.split(':').next() == Some(tool)),
                "{tool} is missing from the Makefile's PROGRAMS: {programs}"
            );
            tools.push(tool.to_owned());
        }
        assert!(tools.len() >= 5, "{tools:?}");
    }
}
