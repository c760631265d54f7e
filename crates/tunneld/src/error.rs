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
    /// socket, netlink, a thread); the text says which step and why. Whatever was made
    /// before it has been removed.
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

    pub(crate) fn system(e: anyhow::Error) -> Error {
        Error::System(format!("{e:#}"))
    }
}
