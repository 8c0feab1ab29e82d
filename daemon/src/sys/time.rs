//! The perf clock (CLOCK_MONOTONIC).
