//! Dropping privileges once the interface is up.
//!
//! Creating the TUN device, binding the port, forcing socket buffer sizes and configuring links
//! need root. Afterwards tunneld needs only `CAP_NET_ADMIN`: `wg set` changes routes through
//! netlink. So every other capability leaves the effective, permitted, inheritable, ambient
//! and bounding sets, and `no_new_privs` stops any later exec from regaining one. The process
//! keeps uid 0 so that it can still remove its own UAPI socket from the root-owned
//! `/var/run/wireguard` at exit; running as a dedicated user is future work.
//!
//! Capabilities belong to threads: this must run before the worker and UAPI threads start,
//! which then inherit the reduced sets.

use caps::{CapSet, Capability, CapsHashSet};

/// The one capability kept.
pub const KEPT: Capability = Capability::CAP_NET_ADMIN;

/// Drops every capability but [`KEPT`]. A step the kernel refuses (tunneld started without
/// `CAP_SETPCAP`, say) is logged and the rest still happen: dropping is best effort, never a
/// reason to stop a working tunnel.
pub fn drop_to_net_admin() {
    let keep: CapsHashSet = [KEPT].into_iter().collect();
    let mut failed: Vec<String> = Vec::new();
    let mut bounding_left = 0;
    for cap in caps::all() {
        if cap != KEPT && caps::drop(None, CapSet::Bounding, cap).is_err() {
            bounding_left += 1;
        }
    }
    if bounding_left > 0 {
        failed.push(format!("{bounding_left} left in the bounding set"));
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
        tracing::info!("privileges dropped: only CAP_NET_ADMIN kept, no_new_privs set");
    } else {
        tracing::warn!(
            "could not drop every privilege ({}); running with what remains",
            failed.join("; ")
        );
    }
}
