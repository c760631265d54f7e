//! Dropping privileges once the interface is up.
//!
//! Creating the TUN device, binding the port, forcing socket buffer sizes and configuring links
//! need root. Afterwards tunneld needs only `CAP_NET_ADMIN`: `wg set` changes routes through
//! netlink; with no WireGuard interface (TLS forwarding only) it needs nothing at all. So every
//! other capability leaves the effective, permitted, inheritable, ambient
//! and bounding sets, and `no_new_privs` stops any later exec from regaining one. Started as
//! root, it keeps uid 0 (and removes its own UAPI socket from the root-owned
//! `/var/run/wireguard` at exit); the systemd unit starts it as a user of its own with
//! `CAP_NET_ADMIN` alone, where there is nothing left to drop.
//!
//! Capabilities belong to threads: this must run before the worker and UAPI threads start,
//! which then inherit the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// The one capability a WireGuard interface needs after set-up.
pub const KEPT: Capability = Capability::CAP_NET_ADMIN;

/// Drops every capability but [`KEPT`].
pub fn drop_to_net_admin() {
    drop_privileges(&[KEPT]);
}

/// Drops every capability but [`KEPT`] and `CAP_BPF`: with `backend = "xdp"` the XDP
/// program's map of the interface's addresses is updated as they change, which bpf(2)
/// allows only with `CAP_BPF`. The AF_XDP sockets, bound at start-up, need nothing more.
pub fn drop_to_net_admin_and_bpf() {
    drop_privileges(&[KEPT, Capability::CAP_BPF]);
}

/// Drops every capability (TLS forwarding only: its listeners are bound).
pub fn drop_all() {
    drop_privileges(&[]);
}

/// Drops every capability but `kept`. A step the kernel refuses (tunneld started without
/// `CAP_SETPCAP`, say) is logged and the rest still happen: dropping is best effort, never a
/// reason to stop a working tunnel.
fn drop_privileges(kept: &[Capability]) {
    let keep: CapsHashSet = kept.iter().copied().collect();
    let mut failed: Vec<String> = Vec::new();
    let mut bounding_left = 0;
    // Only what is in the bounding set needs dropping from it (a service manager may have
    // made it small already).
    let bounding = caps::read(None, CapSet::Bounding).unwrap_or_default();
    for cap in bounding.into_iter().filter(|c| !kept.contains(c)) {
        if caps::drop(None, CapSet::Bounding, cap).is_err() {
            bounding_left += 1;
        }
    }
    let can_set_bounding =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    if bounding_left > 0 && can_set_bounding {
        failed.push(format!("{bounding_left} left in the bounding set"));
    } else if bounding_left > 0 {
        // Without CAP_SETPCAP (a systemd unit that leaves it out) the bounding set stays as
        // the manager made it; no_new_privs, below, stops any exec from using it.
        tracing::debug!(
            "{bounding_left} capabilities stay in the bounding set (no CAP_SETPCAP to drop them)"
        );
    }
    // The ambient set may not exist on old kernels; nothing to drop there then.
    let _ = caps::clear(None, CapSet::Ambient);
    let none = CapsHashSet::new();
    for (set, target, name) in [
        (CapSet::Inheritable, &none, "inheritable"),
        // Effective before permitted: the effective set must stay within the permitted one.
        (CapSet::Effective, &keep, "effective"),
        (CapSet::Permitted, &keep, "permitted"),
    ] {
        if let Err(e) = caps::set(None, set, target) {
            failed.push(format!("{name}: {e}"));
        }
    }
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        failed.push(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    if failed.is_empty() {
        if kept.is_empty() {
            tracing::info!("privileges dropped: no capabilities kept, no_new_privs set");
        } else {
            let names: Vec<String> = kept.iter().map(|c| c.to_string()).collect();
            tracing::info!(
                "privileges dropped: only {} kept, no_new_privs set",
                names.join(" and ")
            );
        }
    } else {
        tracing::warn!(
            "could not drop every privilege ({}); running with what remains",
            failed.join("; ")
        );
    }
}
