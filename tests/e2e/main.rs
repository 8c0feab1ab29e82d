//! End-to-end tests: each module exercises one area through the real binaries.

mod barrier;
mod control;
mod diff;
mod dwarf_stacks;
mod export;
mod first_hour;
mod format;
mod fresh;
mod listing;
mod offcpu;
mod per_command;
mod report;
mod resolve;
mod sampling;
mod scheduled_epochs;
mod service;
mod slices;
mod stack_health;
mod stacks;
mod start_failures;
mod store_reliability;
mod symstore;
mod systemd;
mod systemd_container;
mod threads;
mod time_ranges;
mod timeline;
mod who;

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

/// A scratch directory for `make install` under the target directory, not /tmp: the install
/// copies every debug binary, and /tmp may be a small tmpfs.
fn install_root() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir in CARGO_TARGET_TMPDIR")
}
