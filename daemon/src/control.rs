//! The control socket: one JSON request line in, one JSON response line out.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"flush"}`, `{"cmd":"epoch-new"}`, `{"cmd":"epoch-show"}`,
//! `{"cmd":"reload"}`.
//! Responses: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.
//!
//! The server runs on its own thread (a small tokio runtime), never on a sampling thread. A
//! request is read with a size cap and a deadline, so a malformed, huge or slow client gets an
//! error and is dropped without blocking anyone; commands run on tokio's blocking pool. Access:
//! root, the daemon's own user, or a member of the socket group (checked with SO_PEERCRED);
//! the socket is 0660 root:group. The socket's directory is not created (a failed start must
//! leave nothing behind; under systemd `RuntimeDirectory=` makes it), and only a stale socket,
//! never another kind of file, is replaced.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use dcpi_proto::{Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::sys::sock;

/// Largest request accepted.
pub const MAX_REQUEST: u64 = 64 * 1024;
/// Time a client has to send its request line.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Commands executed at once (blocking threads); more wait for a thread, not for a connection.
pub const MAX_CLIENTS: usize = 32;
/// Connections open at once (each idle one closes after READ_TIMEOUT); past this a new one
/// gets an error at once rather than waiting.
pub const MAX_CONNECTIONS: usize = 512;

/// Who may use the socket besides root and the daemon's user: a group, changeable on reload.
#[derive(Debug)]
pub struct Access {
    gid: AtomicU64,
}

const NO_GROUP: u64 = u64::MAX;

impl Access {
    pub fn new(group: Option<u32>) -> Access {
        Access { gid: AtomicU64::new(group.map_or(NO_GROUP, u64::from)) }
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

/// Executes commands; called on a blocking thread.
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
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Bind `path` (its directory must exist; only a stale socket there is replaced), set
    /// ownership and mode, and serve `handler`.
    /// `access`: the group allowed besides root.
    pub fn start(
        path: &Path,
        access: Arc<Access>,
        handler: Arc<dyn Handler>,
    ) -> Result<ControlServer, ControlError> {
        ControlServer::start_watched(path, access, handler, None)
    }

    /// [`ControlServer::start`], its thread under the daemon's `watch` (a panic, or an end
    /// before shutdown, makes the daemon degraded).
    pub fn start_watched(
        path: &Path,
        access: Arc<Access>,
        handler: Arc<dyn Handler>,
        watch: Option<Arc<crate::watch::Watch>>,
    ) -> Result<ControlServer, ControlError> {
        let group = access.group();
        let io = |what: &'static str| {
            move |source| ControlError::Io { path: path.to_path_buf(), what, source }
        };
        if check_path(path)? == PathState::StaleSocket {
            // Left by a daemon that did not shut down cleanly; check_path saw a socket there.
            std::fs::remove_file(path).map_err(io("remove stale socket"))?;
        }
        let std_listener = std::os::unix::net::UnixListener::bind(path).map_err(io("bind"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(io("chmod"))?;
        if let Some(g) = group {
            if sock::effective_uid() == 0 {
                std::os::unix::fs::chown(path, Some(0), Some(g)).map_err(io("chown"))?;
            }
        }
        std_listener.set_nonblocking(true).map_err(io("set non-blocking"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(MAX_CLIENTS)
            .build()
            .map_err(io("start runtime"))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sock_path = path.to_path_buf();
        let w = watch.clone();
        let body = move || {
            rt.block_on(async move {
                    let listener = match UnixListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(socket = %sock_path.display(), error = %e, "control socket unusable");
                            return;
                        }
                    };
                    serve(listener, access, handler, rx, w).await;
                });
            // Dropping the runtime here does not wait for blocking commands still running.
            rt.shutdown_background();
        };
        let thread = match watch {
            Some(w) => w.spawn(CONTROL_THREAD.into(), true, body),
            None => std::thread::Builder::new().name(CONTROL_THREAD.into()).spawn(body),
        }
        .map_err(io("spawn thread"))?;
        Ok(ControlServer { path: path.to_path_buf(), shutdown: Some(tx), thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

const CONTROL_THREAD: &str = "dcpi-control";

async fn serve(
    listener: UnixListener,
    access: Arc<Access>,
    handler: Arc<dyn Handler>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
    watch: Option<Arc<crate::watch::Watch>>,
) {
    // Every connection is accepted at once and reads its request on its own task: an idle
    // client costs a task and a descriptor until READ_TIMEOUT, never another client's turn.
    // Only the commands themselves share the MAX_CLIENTS blocking threads.
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut accept_error_logged = false;
    let mut refused_logged = false;
    loop {
        if let Some(w) = &watch {
            w.fault_point(CONTROL_THREAD);
        }
        let mut stream = tokio::select! {
            _ = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    if !accept_error_logged {
                        tracing::warn!(error = %e, "control socket: accept failed");
                        accept_error_logged = true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if open.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            if !refused_logged {
                tracing::warn!(
                    max = MAX_CONNECTIONS,
                    "control socket: too many open connections; refusing new ones until some close"
                );
                refused_logged = true;
            }
            tokio::spawn(async move {
                let mut out = serde_json::to_vec(&Response::err(format!(
                    "too many open connections to dcpid (at most {MAX_CONNECTIONS}); retry"
                )))
                .unwrap_or_default();
                out.push(b'\n');
                let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(&out)).await;
            });
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let h = Arc::clone(&handler);
        let group = access.group();
        let open = Arc::clone(&open);
        tokio::spawn(async move {
            connection(stream, group, h).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

fn allowed(stream: &UnixStream, group: Option<u32>) -> Result<(), String> {
    let cred = stream.peer_cred().map_err(|e| format!("cannot read peer credentials: {e}"))?;
    let uid = cred.uid();
    if uid == 0 || uid == sock::effective_uid() {
        return Ok(());
    }
    if let Some(g) = group {
        if sock::process_in_group(cred.pid(), cred.gid(), g) {
            return Ok(());
        }
    }
    Err(format!(
        "permission denied: uid {uid} is not root{}",
        if group.is_some() {
            " and not in the dcpid socket group"
        } else {
            " (no socket group configured)"
        }
    ))
}

async fn connection(mut stream: UnixStream, group: Option<u32>, handler: Arc<dyn Handler>) {
    let resp = match allowed(&stream, group) {
        Err(msg) => {
            tracing::debug!(%msg, "control: refused a client");
            Response::err(msg)
        }
        Ok(()) => {
            let (rd, _) = stream.split();
            let mut line = Vec::new();
            let mut limited = BufReader::new(rd.take(MAX_REQUEST + 1));
            match tokio::time::timeout(READ_TIMEOUT, limited.read_until(b'\n', &mut line)).await {
                Err(_) => Response::err(format!("request not received within {READ_TIMEOUT:?}")),
                Ok(Err(e)) => Response::err(format!("read error: {e}")),
                Ok(Ok(_)) if line.len() as u64 > MAX_REQUEST => {
                    Response::err(format!("request larger than {MAX_REQUEST} bytes"))
                }
                Ok(Ok(_)) => match serde_json::from_slice::<Request>(&line) {
                    Err(e) => Response::err(format!(
                        "malformed request: {e} (expected one JSON line like {{\"cmd\":\"status\"}})"
                    )),
                    Ok(req) => {
                        let h = Arc::clone(&handler);
                        match tokio::task::spawn_blocking(move || h.handle(req)).await {
                            Ok(r) => r,
                            Err(e) => Response::err(format!("command failed: {e}")),
                        }
                    }
                },
            }
        }
    };
    let mut out = serde_json::to_vec(&resp).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
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
        assert_eq!(r.result.unwrap()["cmd"], "status");
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
        let _ = s.write_all(&big);
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
        // 200 clients that connect and say nothing (each holds its connection until the
        // server's READ_TIMEOUT).
        let idle: Vec<_> =
            (0..200).map(|_| std::os::unix::net::UnixStream::connect(&path).unwrap()).collect();
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
}
