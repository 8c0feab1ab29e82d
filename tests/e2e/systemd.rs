//! End-to-end tests: systemd.
