//! The WireGuard cross-platform UAPI socket (`/var/run/wireguard/<name>.sock`), so `wg show`
//! and `wg set` work against tunneld. Requests run on the worker's thread via its handle;
//! route changes they imply are made here, on the control side.

use crate::netlink::Netlink;
use anyhow::{bail, Context};
use ipnet::IpNet;
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tunneld_dataplane::worker::Workers;
use tunneld_tunnel::uapi::{self, DeviceSnapshot, Request};

pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// A request larger than this is refused (a config with tens of thousands of peers fits).
const MAX_REQUEST: usize = 16 << 20;
/// A client that sends nothing for this long is disconnected, so it cannot block the socket.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The bound socket, before serving.
#[derive(Debug)]
pub struct UapiServer {
    listener: UnixListener,
    path: PathBuf,
}

/// Until it serves, dropping the bound socket removes its file: a start that fails after
/// binding it leaves no socket behind.
impl Drop for UapiServer {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Serving the socket; dropping it stops serving and removes the socket file.
#[derive(Debug)]
pub struct Serving {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop`.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

impl UapiServer {
    pub fn bind(interface: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(SOCKET_DIR)
            .with_context(|| format!("cannot create {SOCKET_DIR}"))?;
        let path = PathBuf::from(format!("{SOCKET_DIR}/{interface}.sock"));
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                bail!(
                    "interface {interface} is already served by another process ({} answers)",
                    path.display()
                );
            }
            // A socket left by a process that died: nobody answers on it. `wg` removes such
            // sockets too when it finds them, so it may be gone already.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(e)
                        .with_context(|| format!("cannot remove the stale {}", path.display()));
                }
                _ => {}
            }
        }
        // The socket is made under a name of its own, restricted (keys can be read and set
        // through it: root only), then renamed into place, so the path never names it
        // unrestricted. A `wg` that found the stale socket refusing it just before it went
        // unlinks the path, which may by then be ours: so the path must answer afterwards,
        // or the socket is made again.
        let made = path.with_file_name(format!(".{interface}.sock.{}", std::process::id()));
        for _ in 0..3 {
            let _ = std::fs::remove_file(&made);
            let listener = UnixListener::bind(&made)
                .with_context(|| format!("cannot create the UAPI socket {}", made.display()))?;
            let placed = std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o600))
                .and_then(|()| std::fs::rename(&made, &path));
            if let Err(e) = placed {
                let _ = std::fs::remove_file(&made);
                return Err(e).with_context(|| format!("cannot put {} in place", path.display()));
            }
            // A connection to check: the serving thread takes it and it closes at once.
            if UnixStream::connect(&path).is_ok() {
                return Ok(Self { listener, path });
            }
            tracing::debug!(
                "{} was removed as it was made; making it again",
                path.display()
            );
        }
        bail!(
            "cannot keep the UAPI socket {} in place: something removes it",
            path.display()
        )
    }

    /// Serves the socket on a thread of its own, answering each request with `answer`.
    pub fn serve(
        mut self,
        mut answer: impl FnMut(Request) -> String + Send + 'static,
    ) -> anyhow::Result<Serving> {
        let stop = Arc::new(AtomicBool::new(false));
        // The file is `Serving`'s to remove from here on.
        let serving = Serving {
            path: std::mem::take(&mut self.path),
            stop: stop.clone(),
        };
        let listener = self
            .listener
            .try_clone()
            .context("cannot keep the UAPI socket")?;
        std::thread::Builder::new()
            .name("uapi".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    match stream {
                        Ok(stream) => {
                            if let Err(e) = serve_client(stream, &mut answer) {
                                tracing::debug!("uapi client: {e}");
                            }
                        }
                        Err(e) => tracing::warn!("uapi accept: {e}"),
                    }
                }
            })
            .context("cannot start the UAPI thread")?;
        Ok(serving)
    }
}

fn serve_client(
    mut stream: UnixStream,
    answer: &mut impl FnMut(Request) -> String,
) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            stream.write_all(uapi::format_errno(libc::EMSGSIZE).as_bytes())?;
            return Ok(());
        }
        if !uapi::is_complete(&buf) {
            continue;
        }
        let reply = match std::str::from_utf8(&buf) {
            Ok(text) => match uapi::parse_request(text) {
                Ok(request) => answer(request),
                Err(e) => {
                    tracing::warn!("uapi: refused request: {e}");
                    uapi::format_errno(e.errno)
                }
            },
            Err(_) => {
                tracing::warn!("uapi: request is not UTF-8");
                uapi::format_errno(libc::EPROTO)
            }
        };
        stream.write_all(reply.as_bytes())?;
        buf.clear();
    }
}

/// Answers requests from the running interface's workers; with `routes`, the kernel's routes
/// through the link follow the peers' allowed IPs after each `set` (`tunneld up`; in the
/// bare mode `wg-quick` makes the routes). `marks` follow the `fwmark`.
pub fn worker_answers(
    worker: Workers,
    mut routes: Option<(Netlink, u32)>,
    marks: Arc<Mutex<SocketMarks>>,
) -> impl FnMut(Request) -> String + Send + 'static {
    move |request| answer_from_workers(request, &worker, routes.as_mut(), &mut lock(&marks))
}

/// A lock on control-plane state only (never taken on the data path): the gateway's, the
/// UAPI server's and the reloader's. A thread that panicked holding it left nothing
/// half-done that matters more than stopping cleanly.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The interface's UDP sockets, for the UAPI's `fwmark`: the workers own the sockets, so
/// the control side keeps its own descriptors of them (the same sockets) to put a new mark
/// on. `wg-quick` sets a mark on a running interface whose peer takes the default route, so
/// its own datagrams can be routed around the tunnel.
#[derive(Debug)]
pub struct SocketMarks {
    sockets: Vec<std::os::fd::OwnedFd>,
    current: u32,
    /// `backend = "xdp"`: its next-hop lookups ask for routes with the mark too.
    nexthops: Option<Arc<tunneld_dataplane::xdp::nexthop::NextHops>>,
}

impl SocketMarks {
    /// Descriptors of `sockets`, which carry `current`.
    pub fn new(
        sockets: &[tunneld_dataplane::udp::UdpSocket],
        current: u32,
    ) -> io::Result<SocketMarks> {
        use tunneld_dataplane::DatagramIo;
        let sockets = sockets
            .iter()
            .filter_map(|s| s.fd())
            .map(|fd| {
                // SAFETY: the socket is open for the duration of this call (borrowed above).
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
            })
            .collect::<io::Result<_>>()?;
        Ok(SocketMarks {
            sockets,
            current,
            nexthops: None,
        })
    }

    /// The AF_XDP path's next hops follow the mark too.
    pub fn with_nexthops(
        mut self,
        nexthops: Arc<tunneld_dataplane::xdp::nexthop::NextHops>,
    ) -> SocketMarks {
        self.nexthops = Some(nexthops);
        self
    }

    /// The mark the sockets carry.
    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// Whether `mark` can be put on the sockets: setting the current one again asks the
    /// kernel the same question (`CAP_NET_ADMIN`) and changes nothing.
    pub(crate) fn check(&self, mark: u32) -> Result<(), uapi::UapiError> {
        match self.sockets.first() {
            Some(fd) if mark != self.current => set_mark(fd, self.current),
            _ => Ok(()),
        }
    }

    /// Puts `mark` on every socket.
    pub(crate) fn set(&mut self, mark: u32) -> Result<(), uapi::UapiError> {
        if mark == self.current {
            return Ok(());
        }
        for fd in &self.sockets {
            set_mark(fd, mark)?;
        }
        if let Some(nexthops) = &self.nexthops {
            nexthops.set_mark(mark);
        }
        tracing::info!(fwmark = mark, "the interface's sockets carry a new mark");
        self.current = mark;
        Ok(())
    }
}

fn set_mark(fd: &std::os::fd::OwnedFd, mark: u32) -> Result<(), uapi::UapiError> {
    use std::os::fd::AsRawFd;
    let value = mark as libc::c_int;
    // SAFETY: SO_MARK reads an int of the size passed from a live value.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(uapi::UapiError {
            errno: e.raw_os_error().unwrap_or(libc::EPERM),
            message: format!("fwmark: cannot put mark {mark} on the interface's sockets: {e}"),
        });
    }
    Ok(())
}

pub(crate) fn answer_from_workers(
    request: Request,
    worker: &Workers,
    routes: Option<&mut (Netlink, u32)>,
    marks: &mut SocketMarks,
) -> String {
    match request {
        Request::Get => {
            let unix_now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            match worker.run_each(move |device, now| device.snapshot(now, unix_now)) {
                Some(parts) => uapi::format_get(&DeviceSnapshot::merge(parts)),
                None => uapi::format_errno(libc::ESHUTDOWN),
            }
        }
        Request::Stats => match worker.run_each(|device, _| uapi::WorkerStats {
            stats: device.stats().clone(),
            carries: device.carried(),
        }) {
            Some(stats) => uapi::format_stats(&stats),
            None => uapi::format_errno(libc::ESHUTDOWN),
        },
        Request::Set(set) => {
            // A mark that cannot be put on the sockets is refused before anything changes.
            if let Some(Err(e)) = set.fwmark.map(|mark| marks.check(mark)) {
                tracing::warn!("uapi: set failed: {e}");
                return uapi::format_errno(e.errno);
            }
            // Every worker applies the same request (each holds every peer); they decide
            // alike, so the first worker's outcome is the interface's.
            let outcome = worker.run_each(move |device, now| {
                let before = device.routes();
                let result = device.apply(set.clone(), now);
                (result, before, device.routes(), device.fwmark())
            });
            let Some((result, before, after, mark)) = outcome.and_then(|o| o.into_iter().next())
            else {
                return uapi::format_errno(libc::ESHUTDOWN);
            };
            if let Some((netlink, link)) = routes {
                sync_routes(netlink, *link, &before, &after);
            }
            // The sockets follow the mark the devices took (a request refused before its mark
            // leaves it as it was).
            if let Err(e) = marks.set(mark) {
                tracing::warn!("uapi: set failed: {e}");
                return uapi::format_errno(e.errno);
            }
            match result {
                Ok(()) => uapi::format_errno(0),
                Err(e) => {
                    tracing::warn!("uapi: set failed: {e}");
                    uapi::format_errno(e.errno)
                }
            }
        }
    }
}

/// Makes the kernel's routes through the interface follow the peers' allowed IPs.
pub(crate) fn sync_routes(netlink: &mut Netlink, link: u32, before: &[IpNet], after: &[IpNet]) {
    let (before_set, after_set): (HashSet<&IpNet>, HashSet<&IpNet>) =
        (before.iter().collect(), after.iter().collect());
    for net in after.iter().filter(|n| !before_set.contains(n)) {
        if let Err(e) = netlink.add_route(link, *net) {
            tracing::warn!("{e}");
        }
    }
    for net in before.iter().filter(|n| !after_set.contains(n)) {
        if let Err(e) = netlink.del_route(link, *net) {
            tracing::warn!("{e}");
        }
    }
}
