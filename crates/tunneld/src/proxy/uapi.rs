//! The proxy's UAPI socket, so `wg show`, `wg set` and `tunneld show` work against it: where
//! it goes when the proxy may not write `/var/run/wireguard`, and the answers, from the
//! tunnel's peers. A `set` is applied through the tunnel's peer operations; what the user-space
//! tunnel cannot change while it runs (its private key, its port, a fwmark) is refused with
//! an errno, as the kernel refuses what it cannot do.

use crate::uapi_server::SOCKET_DIR;
use std::collections::HashSet;
use std::path::PathBuf;
use tunneld_crypto::PrivateKey;
use tunneld_userspace::{Error as TunnelError, PeerChange, PeerSettings, Tunnel};
use tunneld_wireguard::uapi::{self, DeviceSnapshot, PeerUpdate, Request, SetRequest};

/// Where the socket of interface `name` goes: `$RUNTIME_DIRECTORY` (systemd's
/// `RuntimeDirectory=`), else `/var/run/wireguard` where this process may make or write it
/// (as `wg` looks there), else `$XDG_RUNTIME_DIR/tunneld`. The directory is made if needed.
pub(super) fn socket_path(name: &str) -> Result<PathBuf, String> {
    let file = format!("{name}.sock");
    if let Some(dir) = std::env::var_os("RUNTIME_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may list several directories, separated by colons: the first is ours.
        let dir = PathBuf::from(dir);
        let first = dir
            .to_str()
            .and_then(|d| d.split(':').next())
            .map_or(dir.clone(), PathBuf::from);
        return Ok(first.join(file));
    }
    if std::fs::create_dir_all(SOCKET_DIR).is_ok() && writable(SOCKET_DIR) {
        return Ok(PathBuf::from(SOCKET_DIR).join(file));
    }
    let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) else {
        return Err(format!(
            "{SOCKET_DIR} is not writable by this user and XDG_RUNTIME_DIR is not set"
        ));
    };
    let dir = PathBuf::from(runtime).join("tunneld");
    let made = {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
    };
    made.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir.join(file))
}

fn writable(dir: &str) -> bool {
    let Ok(path) = std::ffi::CString::new(dir) else {
        return false;
    };
    // SAFETY: access only reads the NUL-terminated path it is given.
    unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The answers to UAPI requests, from the UAPI thread (which waits on the tunnel through
/// `handle`).
pub(super) fn answer(
    handle: tokio::runtime::Handle,
    tunnel: Tunnel,
    private_key: PrivateKey,
    listen_port: u16,
) -> impl FnMut(Request) -> String + Send + 'static {
    move |request| match request {
        Request::Get => match handle.block_on(tunnel.peers()) {
            Ok(peers) => uapi::format_get(&DeviceSnapshot {
                private_key: Some(private_key.clone()),
                listen_port,
                fwmark: 0,
                peers,
            }),
            Err(_) => uapi::format_errno(libc::ESHUTDOWN),
        },
        // No workers: the user-space tunnel's counters are its peers'.
        Request::Stats => uapi::format_stats(&[]),
        Request::Fleet => uapi::format_errno(libc::ENOENT),
        Request::Set(set) => {
            let errno = match handle.block_on(apply(&tunnel, &private_key, listen_port, set)) {
                Ok(()) => 0,
                Err((errno, why)) => {
                    tracing::warn!("uapi: set refused: {why}");
                    errno
                }
            };
            uapi::format_errno(errno)
        }
    }
}

async fn apply(
    tunnel: &Tunnel,
    private_key: &PrivateKey,
    listen_port: u16,
    set: SetRequest,
) -> Result<(), (i32, String)> {
    if let Some(key) = &set.private_key {
        if key.as_ref().map(PrivateKey::public_key) != Some(private_key.public_key()) {
            return Err((
                libc::EOPNOTSUPP,
                "a proxy's private key is its config's (restart it with another)".into(),
            ));
        }
    }
    if set.listen_port.is_some_and(|p| p != listen_port) {
        return Err((
            libc::EOPNOTSUPP,
            "a proxy's listen port is fixed while it runs".into(),
        ));
    }
    if set.fwmark.is_some_and(|m| m != 0) {
        return Err((libc::EOPNOTSUPP, "a proxy has no fwmark".into()));
    }
    let current = tunnel.peers().await.map_err(refusal)?;
    let known: HashSet<_> = current.iter().map(|p| p.public_key).collect();
    if set.replace_peers {
        let kept: HashSet<_> = set
            .peers
            .iter()
            .filter(|p| !p.remove)
            .map(|p| p.public_key)
            .collect();
        for key in known.iter().filter(|k| !kept.contains(*k)) {
            tunnel.remove_peer(key).await.map_err(refusal)?;
        }
    }
    for update in set.peers {
        // A peer `replace_peers` removed above was not among the request's.
        let exists = known.contains(&update.public_key);
        apply_peer(tunnel, &current, update, exists).await?;
    }
    Ok(())
}

async fn apply_peer(
    tunnel: &Tunnel,
    current: &[tunneld_wireguard::uapi::PeerSnapshot],
    update: PeerUpdate,
    exists: bool,
) -> Result<(), (i32, String)> {
    let key = update.public_key;
    if update.remove {
        return match tunnel.remove_peer(&key).await {
            Ok(()) | Err(TunnelError::UnknownPeer(_)) => Ok(()),
            Err(e) => Err(refusal(e)),
        };
    }
    if !exists {
        if update.update_only {
            return Ok(());
        }
        let mut peer = PeerSettings::new(key)
            .allowed_ips(update.allowed_ips.iter().copied())
            .persistent_keepalive(update.persistent_keepalive.unwrap_or(0));
        peer.endpoint = update.endpoint;
        peer.preshared_key = update.preshared_key.flatten();
        return tunnel.add_peer(peer).await.map_err(refusal);
    }
    let mut change = PeerChange::new(key);
    change.endpoint = update.endpoint;
    change.persistent_keepalive = update.persistent_keepalive;
    change.preshared_key = update.preshared_key;
    if update.replace_allowed_ips {
        change.allowed_ips = Some(update.allowed_ips);
    } else if !update.allowed_ips.is_empty() {
        let mut all: Vec<_> = current
            .iter()
            .find(|p| p.public_key == key)
            .map(|p| p.allowed_ips.clone())
            .unwrap_or_default();
        for ip in update.allowed_ips {
            if !all.contains(&ip) {
                all.push(ip);
            }
        }
        change.allowed_ips = Some(all);
    }
    tunnel.update_peer(change).await.map_err(refusal)
}

fn refusal(e: TunnelError) -> (i32, String) {
    let errno = match &e {
        TunnelError::UnknownPeer(_) => libc::ENOENT,
        TunnelError::PeerExists(_) => libc::EEXIST,
        TunnelError::Stopped => libc::ESHUTDOWN,
        _ => libc::EINVAL,
    };
    (errno, e.to_string())
}
