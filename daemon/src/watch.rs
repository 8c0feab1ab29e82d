//! Every long-lived daemon thread (drain, resolver, hotplug, flush, control, signals) runs
//! under a [`Watch`]: a thread that panics, or that must run until shutdown and ends before it, is
//! recorded with the reason. The service then reports `degraded` in status, stops feeding the
//! systemd watchdog (so that systemd restarts the daemon) and exits with
//! [`DEGRADED_EXIT_CODE`].
//!
//! Tests reach into the threads through [`FaultInjector`], a trait only tests implement: the
//! daemon calls [`Watch::fault_point`] once per loop of each thread, which does nothing unless
//! a test lent an injector (through `service::Hooks`). There is no setting or variable for it.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub use dcpi_proto::ThreadFailure;

/// Exit status of a daemon that ran with a dead thread.
pub const DEGRADED_EXIT_CODE: u8 = 3;

/// Test-only: called by each watched thread at each iteration of its loop, with the thread's
/// name (`dcpid-flush`, `dcpi-drain-0`, `dcpi-resolve`, `dcpi-hotplug`, `dcpi-control`); may
/// panic or stall.
pub trait FaultInjector: Send + Sync + 'static {
    fn at(&self, thread: &str);
}

/// Watches the daemon's threads.
#[derive(Default)]
pub struct Watch {
    failures: Mutex<Vec<ThreadFailure>>,
    stopping: AtomicBool,
    faults: Option<Arc<dyn FaultInjector>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("failures", &self.failures())
            .field("stopping", &self.stopping.load(Ordering::Relaxed))
            .field("faults", &self.faults.is_some())
            .finish()
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

impl Watch {
    pub fn new(faults: Option<Arc<dyn FaultInjector>>) -> Arc<Self> {
        Arc::new(Self { faults, ..Self::default() })
    }

    /// Spawn `f` on a thread named `name`. A panic is recorded; so is a return before
    /// [`Watch::stopping`] when `must_run` (a drain thread may end on its own, when its CPU
    /// goes offline; the flush thread may not).
    pub fn spawn<F>(
        self: &Arc<Self>,
        name: String,
        must_run: bool,
        f: F,
    ) -> std::io::Result<JoinHandle<()>>
    where
        F: FnOnce() + Send + 'static,
    {
        let w = Arc::clone(self);
        let n = name.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            match std::panic::catch_unwind(AssertUnwindSafe(f)) {
                Err(p) => w.record(&n, format!("panicked: {}", panic_message(p.as_ref()))),
                Ok(()) if must_run && !w.stopping.load(Ordering::Acquire) => {
                    w.record(&n, "ended while the daemon was running".to_string())
                }
                Ok(()) => {}
            }
        })
    }

    fn record(&self, thread: &str, reason: String) {
        tracing::error!(thread, %reason, "daemon thread died; dcpid is degraded (the watchdog is no longer fed)");
        let mut f = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f.push(ThreadFailure { thread: thread.to_string(), reason, unix_ms: unix_ms_now() });
    }

    /// The daemon is shutting down: threads that end from now on do so on purpose.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Threads that died, in order.
    pub fn failures(&self) -> Vec<ThreadFailure> {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn degraded(&self) -> bool {
        !self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
    }

    /// See [`FaultInjector`]; nothing happens unless a test lent one.
    pub fn fault_point(&self, thread: &str) {
        if let Some(f) = &self.faults {
            f.at(thread);
        }
    }
}

/// `failures` as one line: `thread dcpid-flush panicked: ...; ...`.
pub fn describe(failures: &[ThreadFailure]) -> String {
    failures
        .iter()
        .map(|f| format!("thread {} {}", f.thread, f.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct PanicIn(&'static str);
    impl FaultInjector for PanicIn {
        fn at(&self, thread: &str) {
            if thread == self.0 {
                panic!("injected fault in {thread}");
            }
        }
    }

    #[test]
    fn panics_and_early_ends_are_recorded_planned_ends_are_not() {
        let w = Watch::new(Some(Arc::new(PanicIn("t-panic"))));
        let w2 = Arc::clone(&w);
        w.spawn("t-panic".into(), false, move || w2.fault_point("t-panic"))
            .unwrap()
            .join()
            .unwrap();
        w.spawn("t-early".into(), true, || {}).unwrap().join().unwrap();
        w.spawn("t-may-end".into(), false, || {}).unwrap().join().unwrap();
        let f = w.failures();
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].thread, "t-panic");
        assert_eq!(f[0].reason, "panicked: injected fault in t-panic");
        assert_eq!(f[1].thread, "t-early");
        assert!(f[1].reason.contains("ended while the daemon was running"));
        assert!(w.degraded());
        assert!(describe(&f).starts_with("thread t-panic panicked: injected fault"));
        let w = Watch::new(None);
        w.fault_point("anything");
        w.stopping();
        w.spawn("t-end".into(), true, || {}).unwrap().join().unwrap();
        assert!(!w.degraded(), "{:?}", w.failures());
    }
}
