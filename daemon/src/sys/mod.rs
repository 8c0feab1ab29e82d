//! All unsafe code and FFI of the daemon lives under this module.
