//! Sampling: event specs, perf rings, per-CPU drain threads.
//!
//! See `README.md` in this directory for why periods are randomized and what was measured.

pub mod callchain;
pub mod dwarf;
pub mod events;
pub mod records;
pub mod redraw;
pub mod ring;
pub mod sampler;

pub use events::{default_period, parse_event_list, EventError, EventKind, EventSpec};
pub use sampler::{
    probe, EventSource, OpenedEvent, Sampler, SamplerConfig, SamplerError, SamplerStatus,
};
