//! tunneld as a library: embed a WireGuard (and TLS) gateway in a Rust program.
//!
//! [`Settings`] come from a config file or its text (the format `tunneld up` reads, see
//! README.md), [`Gateway::builder`] starts them, and the [`Gateway`] handle changes peers,
//! reads their state and per-worker counters, reloads and shuts down, with typed
//! [`Error`]s that name the field at fault. The `tunneld` command line (the `tunneld-cli`
//! crate) is this library and a signal loop.
//!
//! ```no_run
//! use tunneld::{Gateway, Settings};
//!
//! let gateway = Gateway::builder(Settings::from_file("/etc/tunneld/site-a.toml")?).start()?;
//! println!("{} listening on {:?}", gateway.interface_name().unwrap_or("-"), gateway.listen_port());
//! gateway.shutdown()?;
//! # Ok::<(), tunneld::Error>(())
//! ```
//!
//! Settings also come from typed values ([`Settings::builder`]), checked by the same rules
//! as a file.
//!
//! # Platform and blocking
//!
//! Linux only (TUN, netlink, `recvmmsg`/`sendmmsg`, io_uring and AF_XDP), and bringing an
//! interface up needs `CAP_NET_ADMIN` (root); an error where the system refused carries
//! its `io::ErrorKind` ([`Error::io_kind`]). Every [`Gateway`] method is synchronous and
//! blocks the calling thread: [`GatewayBuilder::start`] for the bring-up; the peer
//! operations, `peers`, `snapshot`, `worker_stats` and reloads until every worker has
//! applied or answered between two of its batches (normally well under a millisecond),
//! with routes changed over netlink; [`Gateway::wait_ready`] and [`GatewayEvents::recv`]
//! until what they wait for; [`Gateway::shutdown`] until the workers have stopped. From
//! async code, call them in `tokio::task::spawn_blocking`. The handle is `Send + Sync`,
//! cheap to clone, and writers from any thread are serialized by one lock.
//!
//! With the `tokio` feature, `tunneld::userspace` gives a tokio program its own TCP/IP stack inside
//! a WireGuard tunnel (`Tunnel::tcp_connect`, `tcp_listen`, `udp_bind`), with no TUN and no
//! root. Its integrations are features here too, each turning on `tokio`: `axum`, `hyper`
//! (`Connector` for hyper-util's and tonic's clients), `tonic` (a tonic server inside a
//! tunnel) and `dns` (names resolved inside the tunnel).
//!
//! The crates below it are usable on their own: `tunneld-wireguard` (the sans-IO WireGuard
//! core), `tunneld-dataplane` (batches, backends, workers), `tunneld-config` (the file),
//! `tunneld-tls` (TLS forwarding and WireGuard over TLS, with its record layer).

// Input from the network, config files and the UAPI socket must never panic: no unwrap or
// expect outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]
// Doc examples are code users copy: a `for` over a `Result` or an ignored `Result` there
// compiles and does nothing, a bug in the docs.
#![doc(test(attr(deny(for_loops_over_fallibles, unused_must_use))))]

mod bare;
mod bring_up;
mod control;
mod error;
mod events;
mod front_end;
mod gateway;
mod metrics;
mod netlink;
mod plan;
mod privileges;
#[cfg(feature = "proxy")]
pub mod proxy;
mod reload;
mod reresolve;
mod tls_peers;
mod topology;
mod uapi_server;

pub use bare::BareInterface;

pub use error::Error;
pub use events::GatewayEvents;
pub use front_end::FrontEnd;
pub use gateway::{Gateway, GatewayBuilder, Settings, SettingsBuilder, TlsBridge, TlsRedirect};
pub use ipnet::IpNet;
pub use reload::ReloadReport;
pub use tunneld_config::{self as config, ConfigError, ConfigErrors};
pub use tunneld_crypto::{KeyError, PresharedKey, PrivateKey, PublicKey};
/// Tunnels with their own TCP/IP stack for tokio programs, with no TUN and no root (the
/// `tunneld-userspace` crate; the `tokio` feature).
#[cfg(feature = "tokio")]
pub use tunneld_userspace as userspace;
pub use tunneld_wireguard::event::{Event, HANDSHAKE_FAILED_AFTER};
pub use tunneld_wireguard::uapi::{DeviceSnapshot, PeerSnapshot, WorkerStats};
pub use tunneld_wireguard::{PeerChange, PeerSettings, SyncReport};

/// Where the UAPI sockets live (`<dir>/<interface>.sock`), as `wg` expects.
pub const UAPI_SOCKET_DIR: &str = uapi_server::SOCKET_DIR;
