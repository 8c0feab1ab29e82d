//! All unsafe code and FFI of the daemon lives under this module, in small files with a
//! `// SAFETY:` comment on every unsafe block. Everything else in the daemon is safe Rust.

pub mod malloc;
pub mod perf;
pub mod process;
pub mod sock;
pub mod time;
