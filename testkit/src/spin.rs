//! A thread that keeps one CPU busy while a guard lives, so that a sampling daemon has samples
//! to count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Stops the busy thread and joins it when dropped.
#[derive(Debug)]
pub struct Spin(Arc<AtomicBool>, Option<JoinHandle<()>>);

/// Start a thread that computes until the returned guard is dropped.
pub fn spin() -> Spin {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let h = std::thread::spawn(move || {
        let mut x = 1u64;
        while !s.load(Ordering::Relaxed) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
    });
    Spin(stop, Some(h))
}

impl Drop for Spin {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            drop(h.join());
        }
    }
}
