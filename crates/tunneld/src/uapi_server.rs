//! The WireGuard cross-platform UAPI socket (`/var/run/wireguard/<name>.sock`), so `wg show`
//! and `wg set` work against tunneld: the socket and the protocol's framing. What a request
//! does is its caller's `answer` (the interface's control handle, or the bare mode's staging).

use anyhow::{bail, Context};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tunneld_wireguard::uapi::{self, Request};

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
        Self::bind_at(PathBuf::from(format!("{SOCKET_DIR}/{interface}.sock")))
    }

    /// The socket at `path` (`<dir>/<interface>.sock`, its directory made already).
    pub fn bind_at(path: PathBuf) -> anyhow::Result<Self> {
        let interface = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
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
