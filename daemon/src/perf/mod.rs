//! Sampling: events, rings, drain threads.
