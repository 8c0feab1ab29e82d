//! Sampling: event specs, perf rings, per-CPU drain threads.
