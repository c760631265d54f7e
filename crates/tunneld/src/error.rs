//! The library's errors: what went wrong, typed, each displayed as the one line the command
//! line prints for it.

use tunneld_config::{ConfigError, ConfigErrors};
use tunneld_crypto::PublicKey;

/// Why a gateway could not be started, changed or reloaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The settings have problems: every one found, each naming its field as the config
    /// file spells it (`peer[1].allowed_ips[0]: …`). Nothing was started or changed.
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// The system refused a step of bringing the gateway up or changing it (a TUN device, a
    /// socket, netlink, a thread) with an error of its own: `source` is it, so its kind is
    /// matched rather than the text ([`Error::io_kind`]): `PermissionDenied` without
    /// `CAP_NET_ADMIN`, `AddrInUse` for a port taken, …; `message` says which step and why.
    /// Whatever was made before it has been removed.
    #[error("{message}")]
    Io {
        /// The step and the system's error, in one line.
        message: String,
        /// The system's error (its kind and, where there is one, its errno).
        #[source]
        source: std::io::Error,
    },
    /// The system refused a step of bringing the gateway up or changing it, with no
    /// system error to carry (a refusal found by tunneld itself, e.g. a worker that
    /// stopped); the text says which step and why. Whatever was made before it has been
    /// removed.
    #[error("{0}")]
    System(String),
    /// No peer has this public key.
    #[error("no peer has the public key {0}")]
    UnknownPeer(PublicKey),
    /// A peer with this public key is already configured.
    #[error("a peer with the public key {0} is already configured")]
    PeerExists(PublicKey),
    /// The settings have no `[interface]`: the gateway runs TLS forwarding only and has no
    /// WireGuard peers to change.
    #[error("this gateway has no WireGuard interface (its settings have no [interface])")]
    NoInterface,
    /// The gateway was not started from a file, so it has none to read again.
    #[error("this gateway was not started from a config file; pass the new settings instead")]
    NoConfigFile,
    /// The gateway has been shut down, or its workers have stopped.
    #[error("the gateway has stopped")]
    Stopped,
    /// A wait ([`Gateway::wait_ready`](crate::Gateway::wait_ready)) ended before what it
    /// waited for; the text says what.
    #[error("timed out: {0}")]
    TimedOut(String),
    /// The interface refused a change (as `wg set` would be refused), with the errno the
    /// UAPI answers for it.
    #[error("{message}")]
    Refused {
        /// A positive errno value, as the UAPI protocol reports it.
        errno: i32,
        /// Why, in one line.
        message: String,
    },
}

impl Error {
    /// The kind of the system's error, where the system refused ([`Error::Io`]).
    ///
    /// ```no_run
    /// # fn run(settings: tunneld::Settings) {
    /// match tunneld::Gateway::builder(settings).start() {
    ///     Err(e) if e.io_kind() == Some(std::io::ErrorKind::PermissionDenied) => {
    ///         eprintln!("run as root, or with CAP_NET_ADMIN: {e}")
    ///     }
    ///     Err(e) => eprintln!("{e}"),
    ///     Ok(_gateway) => {}
    /// }
    /// # }
    /// ```
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    /// The settings problems, if that is what this error is.
    pub fn problems(&self) -> Option<&[ConfigError]> {
        match self {
            Error::Invalid(p) => Some(&p.0),
            _ => None,
        }
    }

    pub(crate) fn invalid_lines(lines: Vec<String>) -> Error {
        Error::Invalid(ConfigErrors(
            lines.iter().map(|l| ConfigError::from_line(l)).collect(),
        ))
    }

    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Error {
        Error::Invalid(ConfigErrors(vec![ConfigError::new(field, message)]))
    }

    /// A step that failed: [`Error::Io`] when a system error is among its causes (the
    /// outermost one), else [`Error::System`].
    pub(crate) fn system(e: anyhow::Error) -> Error {
        let message = format!("{e:#}");
        match e
            .chain()
            .find_map(|cause| cause.downcast_ref::<std::io::Error>())
        {
            Some(io) => Error::Io {
                message,
                source: match io.raw_os_error() {
                    Some(errno) => std::io::Error::from_raw_os_error(errno),
                    None => std::io::Error::new(io.kind(), io.to_string()),
                },
            },
            None => Error::System(message),
        }
    }
}
