//! Library behind `dcpictl` (daemon control) and `dcpiprof` (reports).

pub mod args;
pub mod ctl;
pub mod diff;
pub mod prof;
