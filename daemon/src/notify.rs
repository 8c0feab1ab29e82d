//! notify
