//! The control socket: one JSON request line in, one JSON response line out.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"flush"}`, `{"cmd":"epoch-new"}`, `{"cmd":"epoch-show"}`,
//! `{"cmd":"reload"}`.
//! Responses: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.
//!
//! The server is an accept thread and one short-lived thread per connection, never a sampling
//! thread. A request is read with a size cap and a deadline (`SO_RCVTIMEO`, renewed to what is
//! left of it before each read), so a malformed, huge or slow client gets an error and is
//! dropped without blocking anyone: a connection that has not sent its whole request line
//! within `READ_TIMEOUT` (2 s) is answered with an error and closed. At most `MAX_CLIENTS` commands
//! run at once, plus `STATUS_RESERVE` more for `status` only.
//!
//! Connections are bounded (`MAX_CONNECTIONS`) and shared fairly: the accept thread reads each
//! peer's credentials (`SO_PEERCRED`) and one uid holds at most `MAX_PER_UID` connections. When a
//! uid is at its share, or all places are taken, the new connection takes the place of the
//! oldest connection that is still waiting for its request in the process holding the most
//! connections (of that uid, or of the uid holding the most): that one is answered with an
//! error and closed. A connection is refused only if no waiting connection belongs to a
//! process holding more than its own (every connection is running a command, each bounded by
//! its own deadline, or the newcomer's process is itself the heaviest). So a client flooding
//! the socket only ever competes with itself, and a `dcpictl status` from another process
//! always gets in. (Before: one process holding 600 idle connections took all 512 places, and
//! 0 of 5 `dcpictl status` calls were answered; e2e test
//! `control::status_is_answered_through_a_connection_flood`.) Choosing a victim scans the
//! table (at most 512 entries, only while a uid or the whole is full), under the lock the
//! connection threads take only when they start, read their request and end.
//!
//! Access: root, the daemon's own user, or a member of the socket group (checked with
//! `SO_PEERCRED`); the socket is 0660 root:group. The socket's directory is not created (a
//! failed start must leave nothing behind; under systemd `RuntimeDirectory=` makes it), and
//! only a stale socket, never another kind of file, is replaced.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use dcpi_proto::{Request, Response};

use crate::sys::sock;
use crate::watch::Watch;

/// Largest request accepted.
pub const MAX_REQUEST: u64 = 64 * 1024;
/// Time a client has to send its request line.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Commands executed at once; more wait for a slot, not for a connection.
pub const MAX_CLIENTS: usize = 32;
/// Command slots beyond `MAX_CLIENTS` that only `status` may use: it reads counters under short
/// locks, so it is answered even while `MAX_CLIENTS` flushes wait on a slow store.
pub const STATUS_RESERVE: usize = 4;
/// Connections open at once, each on its own thread (an idle one closes after `READ_TIMEOUT`).
/// Not `MAX_CLIENTS`: 200 idle clients holding 32 slots for 2 s each delayed a status by 12 s.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections one uid may hold at once: a quarter of the places (at least 8), so that one
/// user flooding the socket leaves the rest to the others.
pub const MAX_PER_UID: usize = if MAX_CONNECTIONS / 4 > 8 { MAX_CONNECTIONS / 4 } else { 8 };

/// Who may use the socket besides root and the daemon's user: a group, changeable on reload.
#[derive(Debug)]
pub struct Access {
    gid: AtomicU64,
}

const NO_GROUP: u64 = u64::MAX;

impl Access {
    pub fn new(group: Option<u32>) -> Self {
        Self { gid: AtomicU64::new(group.map_or(NO_GROUP, u64::from)) }
    }

    pub fn group(&self) -> Option<u32> {
        u32::try_from(self.gid.load(Ordering::Acquire)).ok()
    }

    /// Allow `group` from now on and give the socket at `path` to it (as root; the mode stays
    /// 0660). Clients already connected keep their answer.
    pub fn set_group(&self, path: &Path, group: Option<u32>) -> Result<(), ControlError> {
        if sock::effective_uid() == 0 {
            std::os::unix::fs::chown(path, Some(0), Some(group.unwrap_or(0))).map_err(
                |source| ControlError::Io { path: path.to_path_buf(), what: "chown", source },
            )?;
        }
        self.gid.store(group.map_or(NO_GROUP, u64::from), Ordering::Release);
        Ok(())
    }
}

/// Executes commands; called on a connection's thread, never the accept thread.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request) -> Response;
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {0}: another dcpid is already listening there")]
    InUse(PathBuf),
    #[error(
        "control socket {path}: {kind} exists there; dcpid only ever replaces a socket \
         (remove it or choose another --socket)"
    )]
    NotASocket { path: PathBuf, kind: &'static str },
    #[error(
        "control socket {path}: directory {dir} {problem} (dcpid does not create it: the \
         systemd unit's RuntimeDirectory= does; or choose another --socket)"
    )]
    BadDirectory { path: PathBuf, dir: PathBuf, problem: String },
}

/// What is at the socket path before the server binds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    Free,
    /// A socket nobody listens on (a daemon that was killed): replaced at bind.
    StaleSocket,
}

/// Whether `path` can become the control socket, changing nothing: its directory must exist,
/// and anything already there must be a socket that no live daemon listens on. The service
/// checks this before it creates anything, so a start that fails here leaves nothing behind.
pub fn check_path(path: &Path) -> Result<PathState, ControlError> {
    use std::os::unix::fs::FileTypeExt;
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => Path::new("."),
    };
    let bad_dir = |problem: String| ControlError::BadDirectory {
        path: path.to_path_buf(),
        dir: dir.to_path_buf(),
        problem,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad_dir("is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(bad_dir("does not exist".into()))
        }
        Err(e) => return Err(bad_dir(format!("cannot be read: {e}"))),
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(PathState::Free),
        Err(source) => {
            return Err(ControlError::Io { path: path.to_path_buf(), what: "stat", source })
        }
    };
    let ft = meta.file_type();
    if !ft.is_socket() {
        let kind = if ft.is_file() {
            "a regular file"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_symlink() {
            "a symbolic link"
        } else if ft.is_fifo() {
            "a FIFO"
        } else {
            "a device or other non-socket file"
        };
        return Err(ControlError::NotASocket { path: path.to_path_buf(), kind });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(ControlError::InUse(path.to_path_buf()));
    }
    Ok(PathState::StaleSocket)
}

/// A running control server; stopped (and its socket removed) on drop.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    shared: Option<Arc<Shared>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the accept thread and [`ControlServer::stop`] share.
#[derive(Debug)]
struct Shared {
    listener: UnixListener,
    stopping: AtomicBool,
}

impl ControlServer {
    /// Bind `path` (its directory must exist; only a stale socket there is replaced), set
    /// ownership and mode, and serve `handler`.
    /// `access`: the group allowed besides root.
    pub fn start(
        path: &Path,
        access: Arc<Access>,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, ControlError> {
        Self::start_watched(path, access, handler, None)
    }

    /// [`ControlServer::start`], its thread under the daemon's `watch` (a panic, or an end
    /// before shutdown, makes the daemon degraded).
    pub fn start_watched(
        path: &Path,
        access: Arc<Access>,
        handler: Arc<dyn Handler>,
        watch: Option<Arc<Watch>>,
    ) -> Result<Self, ControlError> {
        let group = access.group();
        let io = |what: &'static str| {
            move |source| ControlError::Io { path: path.to_path_buf(), what, source }
        };
        if check_path(path)? == PathState::StaleSocket {
            // Left by a daemon that did not shut down cleanly; check_path saw a socket there.
            std::fs::remove_file(path).map_err(io("remove stale socket"))?;
        }
        let listener = UnixListener::bind(path).map_err(io("bind"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(io("chmod"))?;
        if let Some(g) = group {
            if sock::effective_uid() == 0 {
                std::os::unix::fs::chown(path, Some(0), Some(g)).map_err(io("chown"))?;
            }
        }
        let shared = Arc::new(Shared { listener, stopping: AtomicBool::new(false) });
        let s = Arc::clone(&shared);
        let w = watch.clone();
        let body = move || serve(&s, &access, &handler, w.as_deref());
        let thread = match watch {
            Some(w) => w.spawn(CONTROL_THREAD.into(), true, body),
            None => std::thread::Builder::new().name(CONTROL_THREAD.into()).spawn(body),
        }
        .map_err(io("spawn thread"))?;
        Ok(Self { path: path.to_path_buf(), shared: Some(shared), thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop accepting and remove the socket. Connections already accepted finish on their
    /// own threads (each within its deadlines); they are not waited for.
    pub fn stop(&mut self) {
        if let Some(s) = self.shared.take() {
            s.stopping.store(true, Ordering::Release);
            // Wakes the accept thread: accept(2) on a shut-down listener fails at once.
            sock::shutdown_listener(&s.listener);
        }
        if let Some(t) = self.thread.take() {
            drop(t.join());
            drop(std::fs::remove_file(&self.path));
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

const CONTROL_THREAD: &str = "dcpi-control";
const CONNECTION_THREAD: &str = "dcpi-control-conn";

/// Who is at the other end of a connection, as far as sharing the places goes: its uid and
/// the process that connected (`None` when it is not visible in the daemon's pid namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Peer {
    uid: u32,
    pid: Option<i32>,
}

/// One open connection.
#[derive(Debug)]
struct Conn {
    peer: Peer,
    since: Instant,
    /// Still reading its request: may be closed to make room for another.
    waiting: bool,
    /// Shared with the connection's thread, to wake its read when it is closed for room.
    stream: Arc<UnixStream>,
}

/// The open connections, and how many each uid and process holds.
#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    conns: std::collections::HashMap<u64, Conn>,
    per_uid: std::collections::HashMap<u32, usize>,
    per_peer: std::collections::HashMap<Peer, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        decrement(&mut self.per_uid, c.peer.uid);
        decrement(&mut self.per_peer, c.peer);
        Some(c)
    }

    /// The connection to close so that one from `peer` can open, if one must be: see the
    /// module's comment. `Err` when `peer` must be refused instead.
    fn make_room(&self, peer: Peer) -> Result<Option<u64>, Refusal> {
        let of_uid = |uid: u32| self.per_uid.get(&uid).copied().unwrap_or(0);
        let uid_full = of_uid(peer.uid) >= MAX_PER_UID;
        if !uid_full && self.conns.len() < MAX_CONNECTIONS {
            return Ok(None);
        }
        let mine = self.per_peer.get(&peer).copied().unwrap_or(0);
        // Among the connections still waiting for their request, of processes holding more
        // than `peer` (so a flooding process competes with itself) and of its own uid if that
        // is at its share: the oldest of the process holding the most, in the uid holding the
        // most.
        let victim = self
            .conns
            .iter()
            .filter(|(_, c)| c.waiting && c.peer != peer && (!uid_full || c.peer.uid == peer.uid))
            .map(|(id, c)| {
                let n = self.per_peer.get(&c.peer).copied().unwrap_or(0);
                ((of_uid(c.peer.uid), n, std::cmp::Reverse((c.since, *id))), n, *id)
            })
            .filter(|(_, n, _)| *n > mine)
            .max_by_key(|(key, _, _)| *key);
        match victim {
            Some((_, _, id)) => Ok(Some(id)),
            None if uid_full => Err(Refusal::UidShare),
            None => Err(Refusal::Full),
        }
    }
}

fn decrement<K: std::hash::Hash + Eq>(counts: &mut std::collections::HashMap<K, usize>, k: K) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = counts.entry(k) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    UidShare,
    Full,
}

/// The open connections and the commands running; both bounded.
#[derive(Debug, Default)]
struct Limits {
    table: Mutex<Table>,
    running: Mutex<usize>,
    freed: Condvar,
}

impl Limits {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Give `stream` from `peer` a place, closing another connection if it must (see the
    /// module's comment); returns the connection's id, and whether another was closed.
    fn admit(&self, peer: Peer, stream: &Arc<UnixStream>) -> Result<(u64, bool), Refusal> {
        let mut t = self.table();
        let evicted = match t.make_room(peer)? {
            Some(victim) => {
                if let Some(c) = t.remove(victim) {
                    // Wakes its thread's read (it returns end of file); the thread sees it lost
                    // its place and answers with an error. Under the table's lock, so the
                    // thread cannot be between its read and marking itself busy unnoticed.
                    drop(c.stream.shutdown(std::net::Shutdown::Read));
                }
                true
            }
            None => false,
        };
        let id = t.next_id;
        t.next_id += 1;
        *t.per_uid.entry(peer.uid).or_default() += 1;
        *t.per_peer.entry(peer).or_default() += 1;
        let conn = Conn { peer, since: Instant::now(), waiting: true, stream: Arc::clone(stream) };
        t.conns.insert(id, conn);
        Ok((id, evicted))
    }

    /// The connection `id` read its request and is about to run it: it can no longer be closed
    /// for room. `false` if it was closed for room already.
    fn busy(&self, id: u64) -> bool {
        match self.table().conns.get_mut(&id) {
            Some(c) => {
                c.waiting = false;
                true
            }
            None => false,
        }
    }

    /// Wait for one of the `MAX_CLIENTS` command slots (`MAX_CLIENTS` + `STATUS_RESERVE` for a
    /// status); it is given back when the guard drops.
    fn command_slot(&self, status: bool) -> CommandSlot<'_> {
        let max = if status { MAX_CLIENTS + STATUS_RESERVE } else { MAX_CLIENTS };
        let mut n = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *n >= max {
            n = self.freed.wait(n).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *n += 1;
        CommandSlot(self)
    }
}

struct CommandSlot<'a>(&'a Limits);

impl Drop for CommandSlot<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner) -= 1;
        // All: a waiting status may be allowed a slot that a waiting flush is not.
        self.0.freed.notify_all();
    }
}

/// Gives a connection's place back when its thread ends, however it ends (unless it was
/// closed for room, which gave it back already).
struct OpenConnection(Arc<Limits>, u64);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.table().remove(self.1);
    }
}

fn serve(shared: &Shared, access: &Access, handler: &Arc<dyn Handler>, watch: Option<&Watch>) {
    // Every connection is accepted at once and reads its request on its own thread: an idle
    // client costs a thread and a descriptor until READ_TIMEOUT, never another client's turn.
    // Only the commands themselves share the MAX_CLIENTS slots.
    let limits = Arc::new(Limits::default());
    let mut accept_error_logged = false;
    let mut refused_logged = false;
    let mut evicted_logged = false;
    let mut spawn_error_logged = false;
    loop {
        if let Some(w) = watch {
            w.fault_point(CONTROL_THREAD);
        }
        let accepted = shared.listener.accept();
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                if !accept_error_logged {
                    tracing::warn!(error = %e, "control socket: accept failed");
                    accept_error_logged = true;
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let cred = match sock::peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                refuse(&stream, &format!("cannot read peer credentials: {e}"));
                continue;
            }
        };
        let peer = Peer { uid: cred.uid, pid: cred.pid };
        let stream = Arc::new(stream);
        let (id, evicted) = match limits.admit(peer, &stream) {
            Ok(a) => a,
            Err(why) => {
                if !refused_logged {
                    tracing::warn!(
                        uid = peer.uid,
                        pid = ?peer.pid,
                        max = MAX_CONNECTIONS,
                        max_per_uid = MAX_PER_UID,
                        "control socket: too many open connections; refusing some (logged once)"
                    );
                    refused_logged = true;
                }
                let msg = match why {
                    Refusal::UidShare => format!(
                        "too many open connections to dcpid from uid {} (at most {MAX_PER_UID} \
                         a uid, this process holding the most of them); retry",
                        peer.uid
                    ),
                    Refusal::Full => format!(
                        "too many open connections to dcpid (at most {MAX_CONNECTIONS}); retry"
                    ),
                };
                refuse(&stream, &msg);
                continue;
            }
        };
        if evicted && !evicted_logged {
            tracing::warn!(
                uid = peer.uid,
                pid = ?peer.pid,
                "control socket: places full; closing the oldest idle connections of the \
                 clients holding the most (logged once)"
            );
            evicted_logged = true;
        }
        let guard = OpenConnection(Arc::clone(&limits), id);
        let h = Arc::clone(handler);
        let group = access.group();
        let spawned = std::thread::Builder::new().name(CONNECTION_THREAD.into()).spawn(move || {
            let open = guard;
            connection(&stream, cred, group, &*h, &open.0, open.1);
        });
        if let Err(e) = spawned {
            // The closure (stream and guard) was dropped: the client sees the connection close.
            if !spawn_error_logged {
                tracing::warn!(error = %e, "control socket: cannot start a connection thread");
                spawn_error_logged = true;
            }
        }
    }
}

/// Answer a connection that gets no thread with `msg`, from the accept thread.
fn refuse(stream: &UnixStream, msg: &str) {
    // A fresh connection's send buffer is empty: a non-blocking write of one short line goes
    // through without making the accept thread wait for anyone.
    drop(stream.set_nonblocking(true));
    send(stream, &Response::err(msg.to_owned()));
}

fn allowed(cred: sock::PeerCred, group: Option<u32>) -> Result<(), String> {
    let uid = cred.uid;
    if uid == 0 || uid == sock::effective_uid() {
        return Ok(());
    }
    if let Some(g) = group {
        if sock::process_in_group(cred.pid, cred.gid, g) {
            return Ok(());
        }
    }
    Err(format!(
        "permission denied: uid {uid} is not root{}",
        match group {
            Some(g) => format!(" and not in dcpid's socket group (gid {g})"),
            None => " (no socket group configured)".to_owned(),
        }
    ))
}

/// The request line (with its newline, if any), read within `READ_TIMEOUT` in all: the deadline
/// covers the whole line, so a client trickling bytes cannot hold the thread longer.
fn read_request(mut stream: &UnixStream) -> Result<Vec<u8>, Response> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let timed_out = || Response::err(format!("request not received within {READ_TIMEOUT:?}"));
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| Response::err(format!("read error: {e}")))?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Ok(line),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(e) => return Err(Response::err(format!("read error: {e}"))),
        };
        let end = chunk[..n].iter().position(|&b| b == b'\n').map_or(n, |i| i + 1);
        line.extend_from_slice(&chunk[..end]);
        if line.len() as u64 > MAX_REQUEST {
            return Err(Response::err(format!("request larger than {MAX_REQUEST} bytes")));
        }
        if end < n || line.last() == Some(&b'\n') {
            return Ok(line);
        }
    }
}

fn connection(
    stream: &UnixStream,
    cred: sock::PeerCred,
    group: Option<u32>,
    handler: &dyn Handler,
    limits: &Limits,
    id: u64,
) {
    let closed_for_room = || {
        Response::err(format!(
            "connection closed to make room: dcpid's control socket is full (at most \
             {MAX_CONNECTIONS} connections, {MAX_PER_UID} a uid) and this client's process held \
             the most; retry"
        ))
    };
    let resp = match allowed(cred, group) {
        Err(msg) => {
            tracing::debug!(%msg, "control: refused a client");
            Response::err(msg)
        }
        Ok(()) => match read_request(stream) {
            // Checked first: a connection closed for room reads an end of file.
            _ if !limits.busy(id) => closed_for_room(),
            Err(r) => r,
            Ok(line) => match serde_json::from_slice::<Request>(&line) {
                Err(e) => Response::err(format!(
                    "malformed request: {e} (expected one JSON line like {{\"cmd\":\"status\"}})"
                )),
                Ok(req) => {
                    let _slot = limits.command_slot(matches!(req, Request::Status));
                    handler.handle(req)
                }
            },
        },
    };
    drop(stream.set_write_timeout(Some(READ_TIMEOUT)));
    send(stream, &resp);
}

/// Write `resp` as one line and close the sending side; a client that does not read is the
/// client's problem (the write is bounded by the socket's timeout or is non-blocking).
fn send(mut stream: &UnixStream, resp: &Response) {
    let mut out = serde_json::to_vec(resp).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    drop(stream.write_all(&out));
    drop(stream.shutdown(std::net::Shutdown::Write));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};

    struct Echo;
    impl Handler for Echo {
        fn handle(&self, req: Request) -> Response {
            Response::ok(serde_json::to_value(req).unwrap_or_default())
        }
    }

    fn ask(path: &Path, bytes: &[u8]) -> Response {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(bytes).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[test]
    fn requests_limits_and_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dcpid.sock");
        let mut srv =
            ControlServer::start(&path, Arc::new(Access::new(None)), Arc::new(Echo)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let r = ask(&path, b"{\"cmd\":\"status\"}\n");
        assert!(r.ok, "{r:?}");
        assert_eq!(r.result_value().unwrap()["cmd"], "status");
        let r = ask(&path, b"{\"cmd\":\"reboot\"}\n");
        assert!(!r.ok && r.error.unwrap().contains("malformed"));
        let r = ask(&path, b"garbage\n");
        assert!(!r.ok);
        // A slow client that never finishes its line does not stop others.
        let mut slow = std::os::unix::net::UnixStream::connect(&path).unwrap();
        slow.write_all(b"{\"cmd\":").unwrap();
        let r = ask(&path, b"{\"cmd\":\"epoch-show\"}\n");
        assert!(r.ok);
        let mut line = String::new();
        std::io::BufReader::new(&mut slow).read_line(&mut line).unwrap();
        assert!(line.contains("not received"), "{line}");
        // Huge.
        let mut big = vec![b' '; (MAX_REQUEST + 10) as usize];
        big.push(b'\n');
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        drop(s.write_all(&big));
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        assert!(line.contains("larger than"), "{line}");
        // A second server on a live socket refuses; after stop the socket is gone.
        assert!(matches!(
            ControlServer::start(&path, Arc::new(Access::new(None)), Arc::new(Echo)),
            Err(ControlError::InUse(_))
        ));
        srv.stop();
        assert!(!path.exists());
        // A stale socket file is replaced.
        let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(_stale);
        let _srv =
            ControlServer::start(&path, Arc::new(Access::new(None)), Arc::new(Echo)).unwrap();
        assert!(ask(&path, b"{\"cmd\":\"flush\"}\n").ok);
    }

    #[test]
    fn only_a_stale_socket_is_replaced_and_no_directory_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let start = |p: &Path| ControlServer::start(p, Arc::new(Access::new(None)), Arc::new(Echo));
        // A regular file (say, someone's data) named as the socket is kept, byte for byte.
        let file = dir.path().join("precious.txt");
        std::fs::write(&file, b"keep me").unwrap();
        let e = start(&file).unwrap_err();
        assert!(matches!(e, ControlError::NotASocket { kind: "a regular file", .. }), "{e}");
        assert!(e.to_string().contains("precious.txt"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        // A symbolic link, even to a socket, is not followed nor removed.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(start(&link), Err(ControlError::NotASocket { .. })));
        assert!(std::fs::symlink_metadata(&link).is_ok());
        // A directory is kept too.
        let sub = dir.path().join("adir");
        std::fs::create_dir(&sub).unwrap();
        assert!(matches!(start(&sub), Err(ControlError::NotASocket { kind: "a directory", .. })));
        // A missing directory is an error naming it, and it is not created.
        let missing = dir.path().join("no/such/dir/d.sock");
        let e = start(&missing).unwrap_err();
        assert!(matches!(e, ControlError::BadDirectory { .. }), "{e}");
        assert!(e.to_string().contains("no/such/dir") && e.to_string().contains("does not exist"));
        assert!(!dir.path().join("no").exists(), "a failed start created a directory");
        // Under a regular file.
        assert!(matches!(start(&file.join("d.sock")), Err(ControlError::BadDirectory { .. })));
        assert_eq!(check_path(&dir.path().join("free.sock")).unwrap(), PathState::Free);
    }

    #[test]
    fn idle_connections_do_not_delay_a_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sock");
        let _srv =
            ControlServer::start(&path, Arc::new(Access::new(None)), Arc::new(Echo)).unwrap();
        // 100 clients that connect and say nothing (each holds its connection until the
        // server's READ_TIMEOUT); fewer than MAX_PER_UID, all from this process like the
        // status below.
        let idle: Vec<_> =
            (0..100).map(|_| std::os::unix::net::UnixStream::connect(&path).unwrap()).collect();
        let t = std::time::Instant::now();
        let r = ask(&path, b"{\"cmd\":\"status\"}\n");
        let took = t.elapsed();
        assert!(r.ok, "{r:?}");
        // Less than one idle timeout: no idle client was waited for (it took 12 s when idle
        // clients held the 32 connection slots).
        assert!(took < READ_TIMEOUT, "status took {took:?} behind {} idle clients", idle.len());
        // The idle ones are then dropped with an error, not kept forever.
        let mut line = String::new();
        std::io::BufReader::new(&idle[0]).read_line(&mut line).unwrap();
        assert!(line.contains("not received"), "{line}");
    }

    /// Who loses a place when they are full (issue 35, defect 7): never a process holding
    /// fewer than the newcomer, never one running a command, the oldest first.
    #[test]
    fn places_go_to_the_processes_holding_the_fewest() {
        let (a, _keep) = UnixStream::pair().unwrap();
        let stream = Arc::new(a);
        let limits = Arc::new(Limits::default());
        let p = |uid, pid| Peer { uid, pid: Some(pid) };
        let flooder = p(0, 1);
        let ids: Vec<u64> =
            (0..MAX_PER_UID).map(|_| limits.admit(flooder, &stream).unwrap().0).collect();
        // The flooder's own next connection is refused: it holds the most of its uid's share.
        assert_eq!(limits.admit(flooder, &stream), Err(Refusal::UidShare));
        // Another process of the same uid (dcpictl as root) takes the flooder's oldest place.
        let (ctl, evicted) = limits.admit(p(0, 2), &stream).unwrap();
        assert!(evicted);
        assert!(!limits.busy(ids[0]), "the oldest waiting connection was closed");
        assert!(limits.busy(ids[1]), "only one was closed");
        assert!(limits.busy(ctl));
        {
            let t = limits.table();
            assert_eq!((t.per_uid[&0], t.per_peer[&flooder], t.per_peer[&p(0, 2)]), (128, 127, 1));
        }
        // The flooder, now down by one, cannot take it back from a process holding fewer.
        assert_eq!(limits.admit(flooder, &stream), Err(Refusal::UidShare));
        // Connections running a command are never closed: with every one busy, a newcomer of
        // that uid is refused.
        for id in &ids[2..] {
            assert!(limits.busy(*id));
        }
        assert_eq!(limits.admit(p(0, 3), &stream), Err(Refusal::UidShare));
        // Other uids fill the rest; when all places are taken a newcomer of another uid takes
        // the oldest waiting place of the heaviest process in the heaviest uid.
        let mut others = Vec::new();
        for uid in 1..=3 {
            for _ in 0..MAX_PER_UID {
                others.push(limits.admit(p(uid, 10 + uid.cast_signed()), &stream).unwrap().0);
            }
        }
        assert_eq!(limits.table().conns.len(), MAX_CONNECTIONS);
        let (_, evicted) = limits.admit(p(9, 99), &stream).unwrap();
        assert!(evicted);
        assert!(!limits.busy(others[0]), "uid 1's oldest (the first of the tied heaviest)");
        assert_eq!(limits.table().conns.len(), MAX_CONNECTIONS);
        // A connection whose thread ends gives its place back, counts included.
        let before = limits.table().per_peer[&p(0, 2)];
        drop(OpenConnection(Arc::clone(&limits), ctl));
        assert!(!limits.busy(ctl));
        let t = limits.table();
        assert_eq!(t.per_peer.get(&p(0, 2)).copied().unwrap_or(0), before - 1);
        assert!(t.per_uid.values().all(|n| *n <= MAX_PER_UID));
        assert_eq!(t.per_uid.values().sum::<usize>(), t.conns.len());
        assert_eq!(t.per_peer.values().sum::<usize>(), t.conns.len());
    }
}
