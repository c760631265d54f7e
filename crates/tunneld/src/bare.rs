//! The bare interface: what `wireguard-go wg0` makes, and what `wg-quick` expects of a
//! userspace implementation. The TUN interface and its UAPI socket exist at once, with no
//! key, no port, no peers and no address; everything else comes through the UAPI (`wg
//! setconf`, `wg set`, `wg syncconf`), and `ip` (run by `wg-quick`) adds addresses, routes
//! and the link's state.
//!
//! Until a private key arrives there is nothing to run: `set` requests are kept (checked on
//! a scratch device, so one with errors is refused whole and changes nothing) and `get`
//! shows them. The request that brings the key starts the dataplane, the same one as `up`'s:
//! the sockets bound on the requested port (or any free one), a device and a worker per TUN
//! queue with every request kept so far applied. From then on requests go to the workers.
//! The port and mark cannot change after that (as for `up`; the UAPI says so).

use crate::bring_up::{self, Opened, RunningWireGuard, StartOptions};
use crate::control::lock;
use crate::error::Error;
use crate::plan;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tunneld_crypto::PrivateKey;
use tunneld_wireguard::uapi::{self, DeviceSnapshot, Request, SetRequest, UapiError};
use tunneld_wireguard::{Device, DeviceSettings};

/// A WireGuard interface with no keys and no peers, configured through its UAPI socket, as
/// `wireguard-go <interface>` makes one. Runs until [`BareInterface::shutdown`] (or until
/// the last handle is dropped).
///
/// ```no_run
/// let bare = tunneld::BareInterface::create("wg0", "")?;
/// // now: wg setconf wg0 wg0.conf; ip address add …; ip link set wg0 up
/// while bare.interface_exists() && !bare.has_failed() {
///     std::thread::sleep(std::time::Duration::from_millis(100));
/// }
/// bare.shutdown()?;
/// # Ok::<(), tunneld::Error>(())
/// ```
#[derive(Clone)]
pub struct BareInterface {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BareInterface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareInterface")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

struct Inner {
    name: String,
    state: Arc<Mutex<State>>,
    /// Serving the UAPI socket; dropped (the socket removed) at shutdown.
    uapi: Mutex<Option<crate::uapi_server::Serving>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = stop(&self.state, &self.uapi);
    }
}

enum State {
    /// No private key yet.
    Staged(Box<Staged>),
    Running(RunningWireGuard),
    Stopped,
}

struct Staged {
    opened: Opened,
    private_key: Option<PrivateKey>,
    listen_port: u16,
    fwmark: u32,
    /// The peer changes of every request accepted so far, in order.
    requests: Vec<SetRequest>,
}

/// How the dataplane starts once a key arrives.
#[derive(Clone)]
struct Start {
    dataplane: plan::Dataplane,
    options: StartOptions,
}

impl BareInterface {
    /// Creates the interface `name` and its UAPI socket. `dataplane` is the body of a
    /// `[dataplane]` section (`workers = 2`, `backend = "uring"`, …; empty for the
    /// defaults), checked as the config file's is. Needs `CAP_NET_ADMIN`.
    pub fn create(name: &str, dataplane: &str) -> Result<BareInterface, Error> {
        tunneld_config::check_interface_name(name)
            .map_err(|e| Error::Invalid(tunneld_config::ConfigErrors(vec![e])))?;
        let dataplane = tunneld_config::parse_dataplane(dataplane).map_err(Error::Invalid)?;
        let mtu = tunneld_config::DEFAULT_MTU;
        // With no peers known, `auto` means a worker per CPU.
        let dataplane = plan::plan_dataplane(&dataplane, mtu, &[]).map_err(Error::invalid_lines)?;
        let workers = dataplane.workers;
        let mut opened =
            bring_up::open_interface(name, mtu, &dataplane, true).map_err(Error::system)?;
        let uapi = opened.uapi.take();
        let state = Arc::new(Mutex::new(State::Staged(Box::new(Staged {
            opened,
            private_key: None,
            listen_port: 0,
            fwmark: 0,
            requests: Vec::new(),
        }))));
        let start = Start {
            dataplane,
            options: StartOptions {
                uapi: true,
                // The UAPI thread is already running with every capability; dropping them
                // now would leave it with them all the same.
                drop_privileges: false,
            },
        };
        let serving = match uapi {
            Some(uapi) => {
                let state = state.clone();
                Some(
                    uapi.serve(move |request| answer(&state, &start, request))
                        .map_err(Error::system)?,
                )
            }
            None => None,
        };
        tracing::info!(interface = %name, workers, "interface created; waiting for its configuration (wg setconf)");
        Ok(BareInterface {
            inner: Arc::new(Inner {
                name: name.to_string(),
                state,
                uapi: Mutex::new(serving),
            }),
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the interface still exists (`ip link del` removes it, as `wg-quick down`
    /// does; the caller then shuts down).
    pub fn interface_exists(&self) -> bool {
        let Ok(name) = std::ffi::CString::new(self.inner.name.as_str()) else {
            return false;
        };
        // SAFETY: `name` is a valid NUL-terminated string; the call only reads it.
        unsafe { libc::if_nametoindex(name.as_ptr()) != 0 }
    }

    /// Whether the dataplane runs (a private key has been set).
    pub fn is_running(&self) -> bool {
        matches!(*lock(&self.inner.state), State::Running(_))
    }

    /// Whether a worker has stopped on its own (the interface was deleted, or a failure).
    pub fn has_failed(&self) -> bool {
        match &*lock(&self.inner.state) {
            State::Running(wg) => wg.threads.iter().any(|t| t.is_finished()),
            _ => false,
        }
    }

    /// Stops the workers, removes the interface (if it still exists) and the UAPI socket.
    /// Calling it again does nothing.
    pub fn shutdown(&self) -> Result<(), Error> {
        stop(&self.inner.state, &self.inner.uapi)
    }
}

fn stop(
    state: &Mutex<State>,
    uapi: &Mutex<Option<crate::uapi_server::Serving>>,
) -> Result<(), Error> {
    // The socket first, so that no request arrives for what is being stopped.
    drop(lock(uapi).take());
    let was = std::mem::replace(&mut *lock(state), State::Stopped);
    if let State::Running(wg) = was {
        if !wg.stop() {
            return Err(Error::System(
                "a worker thread failed; the interface has been removed".into(),
            ));
        }
    }
    Ok(())
}

fn answer(state: &Mutex<State>, start: &Start, request: Request) -> String {
    let mut state = lock(state);
    match &mut *state {
        // From here on, the interface's control handle, as for `up`.
        State::Running(wg) => lock(&wg.control).answer(request),
        State::Stopped => uapi::format_errno(libc::ESHUTDOWN),
        State::Staged(staged) => match request {
            Request::Get => match staged.snapshot() {
                Ok(snapshot) => uapi::format_get(&snapshot),
                Err(e) => uapi::format_errno(e.errno),
            },
            Request::Stats => uapi::format_stats(&[]),
            Request::Fleet => uapi::format_errno(libc::ENOENT),
            Request::Set(set) => {
                if let Err(e) = staged.accept(set) {
                    tracing::warn!("uapi: set failed: {e}");
                    return uapi::format_errno(e.errno);
                }
                if staged.private_key.is_none() {
                    return uapi::format_errno(0);
                }
                let State::Staged(staged) = std::mem::replace(&mut *state, State::Stopped) else {
                    return uapi::format_errno(libc::EPROTO);
                };
                match run(*staged, start) {
                    Ok(running) => {
                        *state = State::Running(running);
                        uapi::format_errno(0)
                    }
                    Err(RunError::Staged(staged, errno, why)) => {
                        tracing::error!("cannot start the dataplane: {why}; the settings are kept");
                        *state = State::Staged(staged);
                        uapi::format_errno(errno)
                    }
                    Err(RunError::Lost(why)) => {
                        tracing::error!(
                            "the dataplane failed to start and the interface is gone: {why}"
                        );
                        uapi::format_errno(libc::EIO)
                    }
                }
            }
        },
    }
}

impl Staged {
    /// A device with every request kept so far (and `extra`) applied: what the interface
    /// would be. The key is a stand-in until one is set.
    fn scratch(&self, extra: Option<&SetRequest>) -> Result<Device, UapiError> {
        let now = Instant::now();
        let settings = DeviceSettings {
            private_key: self
                .private_key
                .clone()
                .unwrap_or_else(PrivateKey::generate),
            listen_port: self.listen_port,
            mtu: self.opened.mtu,
            fwmark: self.fwmark,
        };
        // A checker: no peer's static Diffie-Hellman, which the workers compute anyway.
        let mut device = Device::checker(settings, now, tunneld_dataplane::system_environment());
        for request in self.requests.iter().chain(extra) {
            device.apply(peers_only(request), now)?;
        }
        Ok(device)
    }

    fn snapshot(&self) -> Result<DeviceSnapshot, UapiError> {
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut snapshot = self.scratch(None)?.snapshot(Instant::now(), unix_now);
        snapshot.private_key = self.private_key.clone();
        snapshot.listen_port = self.listen_port;
        snapshot.fwmark = self.fwmark;
        Ok(snapshot)
    }

    /// Keeps `set` if the interface would take it, else changes nothing.
    fn accept(&mut self, set: SetRequest) -> Result<(), UapiError> {
        if let Some(None) = set.private_key {
            return Err(UapiError {
                errno: libc::EOPNOTSUPP,
                message: "private_key: removing the private key is not supported".into(),
            });
        }
        self.scratch(Some(&set))?;
        if let Some(Some(key)) = &set.private_key {
            self.private_key = Some(key.clone());
        }
        if let Some(port) = set.listen_port {
            self.listen_port = port;
        }
        if let Some(mark) = set.fwmark {
            self.fwmark = mark;
        }
        if set.replace_peers {
            self.requests.clear();
        }
        self.requests.push(peers_only(&set));
        Ok(())
    }
}

/// The peer part of a request (its key, port and mark are the staged fields).
fn peers_only(request: &SetRequest) -> SetRequest {
    SetRequest {
        private_key: None,
        listen_port: None,
        fwmark: None,
        replace_peers: request.replace_peers,
        peers: request.peers.clone(),
    }
}

/// Why the dataplane did not start.
enum RunError {
    /// Nothing was committed: the staged settings are back, with the errno to answer.
    Staged(Box<Staged>, i32, String),
    /// The TUN queues went into a start that failed: the interface is gone.
    Lost(String),
}

/// Starts the dataplane now that the staged settings have a key. A port that cannot be bound
/// leaves everything staged and says so (the interface stays as it was).
fn run(staged: Staged, start: &Start) -> Result<RunningWireGuard, RunError> {
    let Some(private_key) = staged.private_key.clone() else {
        return Err(RunError::Staged(
            Box::new(staged),
            libc::EINVAL,
            "no private key".into(),
        ));
    };
    let sockets =
        match bring_up::bind_dataplane_sockets(staged.listen_port, staged.fwmark, &start.dataplane)
        {
            Ok(sockets) => sockets,
            Err(e) => {
                let errno = e
                    .downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::raw_os_error)
                    .unwrap_or(libc::EADDRINUSE);
                return Err(RunError::Staged(Box::new(staged), errno, format!("{e:#}")));
            }
        };
    let settings = DeviceSettings {
        private_key,
        listen_port: staged.listen_port,
        mtu: staged.opened.mtu,
        fwmark: staged.fwmark,
    };
    let requests = staged.requests;
    let running = bring_up::run_dataplane(
        staged.opened,
        sockets,
        settings,
        Vec::new(),
        &start.dataplane,
        start.options,
        None,
    )
    .map_err(|e| RunError::Lost(format!("{e:#}")))?;
    for request in requests {
        // Checked on the scratch device when it was accepted: only a stopped worker fails.
        let applied = lock(&running.control).set(request);
        if let Err(e) = applied {
            let _ = running.stop();
            return Err(RunError::Lost(format!(
                "the workers stopped while being configured: {e}"
            )));
        }
    }
    tracing::info!(
        listen_port = running.port,
        public_key = %running.public_key,
        "private key set: the dataplane runs"
    );
    Ok(running)
}
