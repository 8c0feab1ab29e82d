//! The integration tests of this crate, as one test binary (one link, one process; the
//! layout of ripgrep's and blazesym's suites). Shared helpers live in the support modules.

mod docs;
mod offcpu_hotplug;
mod periods;
mod resolve_live;
mod resolve_ordering;
mod resolve_scan;
mod sampler_basic;
mod sampler_phase;
mod sampler_rate;
mod sampler_support;
mod store_failure;
mod store_hostile;
mod store_housekeeping;
mod store_layout;
mod store_lease;
mod store_newer_format;
mod store_publish;
mod store_slices;
mod store_spool_directly;
mod store_spool_full;
mod store_spool_quarantine;
mod store_summary_index;
mod store_support;
mod store_symtabs;
mod store_who;
mod store_who_profiles;
mod thread_watch;
mod who_attribution;
