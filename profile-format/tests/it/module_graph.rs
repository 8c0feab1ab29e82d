//! Issue 34: the module graph of this crate has no cycle (a lower module never imports a
//! higher one), so that it cannot come back unnoticed.

use dcpi_testkit::modgraph;

#[test]
fn the_module_graph_has_no_cycle() {
    modgraph::assert_acyclic(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
