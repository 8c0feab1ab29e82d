//! Library behind `dcpictl` (daemon control), `dcpiprof` (reports) and `dcpilist`
//! (per-instruction listings).

pub mod args;
pub mod ctl;
pub mod diff;
pub mod escape;
pub mod list;
pub mod manpages;
pub mod prof;
pub mod term;
pub mod top;
