//! Process-level calls: resource usage, auxiliary vector.
