//! The control commands (`dcpictl`): what they do to the shared state.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::aggregate::Resolved;
use crate::control::{Handler, Request, Response};
use crate::store::{Store, StoreError};
use crate::types::PerfTime;
use crate::who::HotView;

use super::shared::{lock, read, unix_ms_now, Shared};
use crate::store::EpochSchedule;
use crate::who::IDLE_PATH;

/// How long a flush or `epoch new` waits for the drain threads to read their rings up to the
/// request's instant; a CPU that has not answered by then is named in the response.
pub(super) const BARRIER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `dcpictl flush` waits for the store before answering with an error.
pub(super) const FLUSH_WAIT: Duration = Duration::from_secs(20);

/// The outcome of closing a batch at an instant ([`Shared::cut`]).
pub(super) struct Cut {
    /// The instant (perf clock ns): the batch holds every sample up to it, none after.
    pub(super) until: u64,
    /// CPUs whose drain thread did not read its ring up to `until` in time.
    pub(super) unanswered: Vec<u32>,
}

pub(super) struct ControlHandler(pub(super) Arc<Shared>);

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> Response {
        let sh = &self.0;
        match req {
            Request::Status => Response::ok_with(&sh.status()),
            Request::Flush => match sh.bounded_store_op(|sh| {
                sh.flush_now()
                    .map_err(|(cut, e)| format!("{e}{}", unanswered_note(&cut.unanswered)))
            }) {
                Ok(cut) => Response::ok_with(&dcpi_proto::FlushResult {
                    flushed: true,
                    until_ns: cut.until,
                    unanswered_cpus: cut.unanswered.clone(),
                }),
                Err(e) => Response::err(format!("flush incomplete: {e}")),
            },
            Request::Reload => {
                let r = sh.reload("dcpictl");
                match serde_json::to_value(&r) {
                    Ok(v) if r.ok => Response::ok(v),
                    Ok(_) => Response::err(format!(
                        "reload rejected, running configuration kept: {}",
                        r.error.unwrap_or_default()
                    )),
                    Err(e) => Response::err(e.to_string()),
                }
            }
            Request::Top => sh.top(),
            Request::EpochShow => {
                let e = lock(&sh.store_status).epoch.clone();
                Response::ok_with(&dcpi_proto::EpochResult {
                    epoch: e,
                    until_ns: 0,
                    unanswered_cpus: Vec::new(),
                })
            }
            Request::EpochNew => match sh.bounded_store_op(|sh| match sh.new_epoch() {
                (cut, Ok(e)) => Ok((cut, e)),
                (cut, Err(e)) => Err(format!("{e}{}", unanswered_note(&cut.unanswered))),
            }) {
                Ok((cut, e)) => Response::ok_with(&dcpi_proto::EpochResult {
                    epoch: Some(e.to_string()),
                    until_ns: cut.until,
                    unanswered_cpus: cut.unanswered.clone(),
                }),
                Err(e) => Response::err(format!("cannot start a new epoch: {e}")),
            },
        }
    }
}

pub(super) fn unanswered_note(cpus: &[u32]) -> String {
    if cpus.is_empty() {
        String::new()
    } else {
        format!(" (drain threads of CPUs {cpus:?} did not answer the barrier)")
    }
}

/// The kind names of `TopRow::kind`.
fn kind_name(image: &[u8], kind: profile_format::ImageKind) -> &'static str {
    use profile_format::ImageKind as K;
    match kind {
        _ if image == IDLE_PATH => "idle",
        K::Elf => "elf",
        K::Kernel => "kernel",
        K::KernelModule => "module",
        K::Vdso => "vdso",
        K::Anon => "anon",
        K::Unknown => "unknown",
    }
}

/// The window `dcpictl top` reports.
const TOP_WINDOW: Duration = Duration::from_secs(5);
/// Code rows merged over each command's processes: enough that a function spread over many
/// small rows (one per offset) still adds up in the client's per-symbol view.
const TOP_ROWS: usize = 4000;
/// A `top` request takes the samples the watermark allows only if the live view's newest
/// batch is at least this old: a client refreshing twice a second costs a take, a merge and
/// an encoding every second or third request, not at every one (issue 38); its answers are
/// at most this old plus one refresh interval.
const TOP_FRESH: Duration = Duration::from_secs(1);

impl Shared {
    /// `dcpictl top`: take what the watermark allows now (into the store's memory, as a
    /// periodic flush does, but writing nothing), then report the last few seconds from the
    /// aggregator's recent batches.
    ///
    /// A request within [`TOP_FRESH`] of the last batch taken (by a flush or a request) does
    /// not take another: at 2 refreshes per second two requests in three reuse the last one's,
    /// and gets its view and its encoded answer back without merging or encoding anything.
    pub(super) fn top(&self) -> Response {
        if self.aggregator.since_last_batch().is_none_or(|d| d >= TOP_FRESH) {
            let mut store = lock(&self.store);
            // Stacks are not in the live view: they wait for the next flush that takes them.
            let resolved = self.aggregator.take_resolved(false);
            self.absorb(&mut store, resolved);
        }
        let v = self.aggregator.top(TOP_WINDOW, TOP_ROWS);
        let mut last = lock(&self.top_answer);
        if let Some((view, raw)) = last.as_ref() {
            if Arc::ptr_eq(view, &v) {
                return Response::ok_raw(raw.clone());
            }
        }
        let resp = Response::ok_with(&self.top_result(&v));
        if let Some(raw) = &resp.result {
            *last = Some((v, raw.clone()));
        }
        resp
    }

    /// The answer of `top` for a view of the live window.
    fn top_result(&self, v: &HotView) -> dcpi_proto::TopResult {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        dcpi_proto::TopResult {
            window_ms: TOP_WINDOW.as_millis() as u64,
            samples: v.totals.first().copied().unwrap_or(0),
            events: self.events.iter().map(|e| e.desc.name.clone()).collect(),
            totals: v.totals.clone(),
            idle: v.idle.clone(),
            rows: v
                .rows
                .iter()
                .map(|r| dcpi_proto::TopRow {
                    command: text(&r.command),
                    pid: r.pid,
                    kind: kind_name(&r.image, r.kind).to_owned(),
                    image: text(&r.image),
                    build_id: r.build_id.as_deref().map(hex::encode),
                    offset: r.offset,
                    event: u32::from(r.event),
                    samples: r.samples,
                })
                .collect(),
            processes: v
                .processes
                .iter()
                .map(|p| dcpi_proto::TopProcess {
                    pid: p.pid,
                    command: text(&p.command),
                    image: text(&p.image),
                    event: u32::from(p.event),
                    samples: p.samples,
                })
                .collect(),
        }
    }

    /// Close a batch at this instant: every drain thread reads its ring up to it (bounded
    /// wait), every sample up to it goes into the store, none after. The caller holds the store.
    pub(super) fn cut(&self, store: &mut Store) -> Cut {
        let (resolved, unanswered, until) = self.cut_batch(true);
        if !unanswered.is_empty() {
            tracing::warn!(cpus = ?unanswered, "drain threads did not read their rings up to the request in time; their samples go to a later batch");
        }
        self.sync_store(store);
        self.absorb(store, resolved);
        Cut { until, unanswered }
    }

    /// The batch of every sample up to this instant (`Aggregator::cut_taking`, every call
    /// stack with `all_stacks`), each drain thread asked to read its ring up to it and waited
    /// for at most [`BARRIER_TIMEOUT`]. Returns the batch, the CPUs that did not answer in time
    /// and the instant.
    pub(super) fn cut_batch(&self, all_stacks: bool) -> (Resolved, Vec<u32>, PerfTime) {
        let sampler = read(&self.sampler);
        self.aggregator.cut_taking(all_stacks, |t| match sampler.as_ref() {
            Some(s) => s.barrier(t, BARRIER_TIMEOUT),
            None => Vec::new(),
        })
    }

    /// A store operation of a control command on its own thread, waited for at most
    /// [`FLUSH_WAIT`]: a hung database must not hang the client too. The operation goes on in
    /// the background (one at a time); the samples are safe in the spool meanwhile.
    pub(super) fn bounded_store_op<T: Send + 'static>(
        self: &Arc<Self>,
        op: impl FnOnce(&Self) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        use std::sync::atomic::Ordering;
        let stalled = |sh: &Self| {
            let s = sh.settings();
            match sh.stalled_since(&s) {
                Some(t) => format!(
                    "publishing stalled for {:.0} s (the database is not answering)",
                    unix_ms_now().saturating_sub(t) as f64 / 1e3
                ),
                None => "the store is busy".into(),
            }
        };
        if self.flush_running.swap(true, Ordering::AcqRel) {
            return Err(format!(
                "a previous flush or epoch change has not finished: {}; samples are kept in the spool",
                stalled(self)
            ));
        }
        let (tx, rx) = mpsc::channel();
        let sh = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("dcpid-ctl-store".into()).spawn(move || {
            let r = op(&sh);
            sh.flush_running.store(false, Ordering::Release);
            drop(tx.send(r));
        });
        if let Err(e) = spawned {
            self.flush_running.store(false, Ordering::Release);
            return Err(format!("cannot start: {e}"));
        }
        match rx.recv_timeout(FLUSH_WAIT) {
            Ok(r) => r,
            Err(_) => Err(format!(
                "not done after {} s: {}; samples are kept in the local spool and published when it answers",
                FLUSH_WAIT.as_secs(),
                stalled(self)
            )),
        }
    }

    /// `dcpictl flush`: a cut, then the store spools and publishes everything.
    pub(super) fn flush_now(&self) -> Result<Cut, (Cut, String)> {
        let mut store = lock(&self.store);
        let cut = self.cut(&mut store);
        let r = store.flush_everything().map_err(|e| e.to_string());
        *lock(&self.store_status) = store.status();
        match r {
            Ok(()) => Ok(cut),
            Err(e) => Err((cut, e)),
        }
    }

    /// Start the scheduled epoch if its boundary has passed (`epoch_interval`,
    /// [`crate::store::EpochSchedule`]): like `dcpictl epoch new`, a cut closes the old epoch
    /// at an instant first, under the same store lock. The caller holds the store. Cheap when
    /// nothing is due (a comparison of the clock with the current epoch's id), so every flush
    /// tick checks it: a rotation that failed (the database down) or waits for another host's
    /// marker is tried again, and a wall clock that jumped forward is noticed.
    pub(super) fn rotate_if_due(&self, store: &mut Store) {
        let every = read(&self.settings).epoch_interval;
        let Some(schedule) = every.get().and_then(EpochSchedule::new) else {
            return;
        };
        let Some(id) =
            store.current_epoch().and_then(|e| schedule.due(std::time::SystemTime::now(), e))
        else {
            return;
        };
        self.cut(store);
        // Logged by the store (errors once per boundary); the next tick retries.
        drop(store.rotate_on_schedule(&id, schedule));
    }

    /// `dcpictl epoch new`: a cut closes the current epoch at an instant, then the next epoch
    /// starts; both under the store lock, so no batch can fall between them.
    pub(super) fn new_epoch(&self) -> (Cut, Result<profile_format::EpochId, StoreError>) {
        let mut store = lock(&self.store);
        let cut = self.cut(&mut store);
        let r = store.new_epoch();
        *lock(&self.store_status) = store.status();
        (cut, r)
    }
}
