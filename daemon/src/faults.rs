//! Faults that tests inject into a running daemon: a drain thread that stops making progress,
//! a database that hangs like a dead NFS server, a machine without a PMU, a crash after N
//! writes.
//!
//! They are not settings: no config key or flag reaches them. In-process tests set the fields
//! of [`Faults`] directly; tests that run the `dcpid` binary set environment variables, which
//! the binary reads only when it was built with the `fault-injection` feature AND with debug
//! assertions (the dev/test profiles). The end-to-end test crate enables the feature, and
//! cargo's feature unification turns it on for every package built with that crate
//! (`cargo build --release --workspace`), so the feature alone cannot keep it out of an
//! installed binary: the `debug_assertions` condition does. No release-profile build reads
//! these variables, whatever features it has, so a production daemon never changes behaviour
//! because of its environment (`make install`'s binary is checked by the end-to-end test
//! `systemd::installed_release_dcpid_ignores_fault_variables`).

use std::path::PathBuf;
use std::time::Duration;

/// Environment variable of a `fault-injection` debug build: `CPU:MS`, the drain thread of CPU
/// stalls MS milliseconds after start.
pub const STALL_DRAIN_ENV: &str = "DCPI_TEST_STALL_DRAIN";
/// Environment variable of a `fault-injection` debug build: names a file; while it exists, every
/// database phase of the store blocks.
pub const STALL_DB_ENV: &str = "DCPI_TEST_STALL_DB";

/// Whether [`Faults::from_env`] reads the environment: only in a `fault-injection` build of a
/// profile with debug assertions, so that no release build obeys the variables even when
/// feature unification turned the feature on.
pub const INJECTABLE: bool = cfg!(all(feature = "fault-injection", debug_assertions));

/// The faults to inject; the default injects none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// The drain thread of this CPU stops making progress after this long.
    pub stall_drain: Option<(u32, Duration)>,
    /// Hardware and raw events fail to open with ENOENT, as on a machine without a PMU (lets
    /// the `auto` fallback be tested on machines that have one).
    pub simulate_no_pmu: bool,
    /// While this file exists, database operations of the store block.
    pub stall_db: Option<PathBuf>,
    /// The store fails with an injected crash after this many profile writes.
    pub crash_after_writes: Option<u32>,
}

/// A fault variable that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{var}: expected {expected}, got {value:?}")]
pub struct FaultsError {
    pub var: &'static str,
    pub expected: &'static str,
    pub value: String,
}

impl Faults {
    /// The faults named by the environment in a `fault-injection` build with debug assertions
    /// (never a release build); none otherwise.
    pub fn from_env() -> Result<Self, FaultsError> {
        if INJECTABLE {
            Self::from_lookup(|name| std::env::var_os(name))
        } else {
            Ok(Self::default())
        }
    }

    /// The faults named by `var` (the environment's lookup, or a test's).
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self, FaultsError> {
        let mut f = Self::default();
        if let Some(v) = var(STALL_DRAIN_ENV) {
            let v = v.to_string_lossy().into_owned();
            let parsed = v.split_once(':').and_then(|(c, ms)| {
                Some((c.trim().parse::<u32>().ok()?, ms.trim().parse::<u64>().ok()?))
            });
            let Some((cpu, ms)) = parsed else {
                return Err(FaultsError { var: STALL_DRAIN_ENV, expected: "CPU:MS", value: v });
            };
            f.stall_drain = Some((cpu, Duration::from_millis(ms)));
        }
        f.stall_db = var(STALL_DB_ENV).map(PathBuf::from);
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<std::ffi::OsString> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).into())
    }

    #[test]
    fn parses_the_variables() {
        let f = Faults::from_lookup(lookup(&[(STALL_DRAIN_ENV, "1:250"), (STALL_DB_ENV, "/x")]))
            .unwrap();
        assert_eq!(f.stall_drain, Some((1, Duration::from_millis(250))));
        assert_eq!(f.stall_db, Some(PathBuf::from("/x")));
        assert_eq!(Faults::from_lookup(lookup(&[])).unwrap(), Faults::default());
    }

    #[test]
    fn a_bad_value_names_the_variable() {
        let e = Faults::from_lookup(lookup(&[(STALL_DRAIN_ENV, "soon")])).unwrap_err();
        assert!(e.to_string().contains(STALL_DRAIN_ENV) && e.to_string().contains("CPU:MS"), "{e}");
    }
}
