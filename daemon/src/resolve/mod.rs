//! Resolution of (pid, pc) to (image, offset).
