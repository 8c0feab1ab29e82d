//! perf_event_open(2), its ioctls and the ring-buffer control page.
