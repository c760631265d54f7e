//! What the underlay interface's driver does for the AF_XDP path: how many queues it has
//! ([`interface_queues`]), and whether it computes TX checksums, asked the two ways the
//! kernel answers:
//!
//! - **Copy mode** sends each frame as an skb. With `XDP_TXMD_FLAGS_CHECKSUM` metadata the
//!   kernel marks it `CHECKSUM_PARTIAL`, like its own UDP sockets' datagrams, and the
//!   device's TX checksumming (`ethtool -k`: tx-checksumming) completes it. Were that off, the
//!   kernel would complete it in software (no gain), or refuse it on a device that takes
//!   frames as page fragments only, so the offload is used only when it is on: asked with
//!   `ETHTOOL_GTXCSUM`.
//! - **Zero-copy** hands the frame to the driver, which honours the request only if it
//!   implements AF_XDP TX checksums, and ignores it otherwise (the frame would leave with a
//!   wrong checksum): asked of the `netdev` generic netlink family (`xsk-features`, as
//!   `ynl --family netdev --do dev-get` shows it). A kernel without the family has no such
//!   drivers.
//!
//! Both are asked in the calling thread's network namespace.

use crate::netlink::{wire::malformed, Netlink};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// linux/netdev.h, linux/ethtool.h.
/// `NETDEV_XSK_FLAGS_TX_CHECKSUM`: the driver computes checksums asked for in TX metadata.
pub const XSK_TX_CHECKSUM: u64 = 2;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// Whether interface `ifindex`'s TX checksumming is on (`ETHTOOL_GTXCSUM`).
pub fn tx_checksumming(ifindex: u32) -> io::Result<bool> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_GTXCSUM,
        data: 0,
    };
    ethtool(ifindex, (&mut value as *mut EthtoolValue).cast())?;
    Ok(value.data != 0)
}

/// The receive queues of interface `ifindex` (`ETHTOOL_GCHANNELS`), or 1 when the driver
/// does not say.
pub fn interface_queues(ifindex: u32) -> u32 {
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    let mut channels = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Channels::default()
    };
    match ethtool(ifindex, (&mut channels as *mut Channels).cast()) {
        Ok(()) => channels.rx_count.max(channels.combined_count).max(1),
        Err(_) => 1,
    }
}

/// One `SIOCETHTOOL` request about interface `ifindex`: `data` points at the command's
/// structure (its first field the command), which the kernel reads and fills in.
fn ethtool(ifindex: u32, data: *mut libc::c_char) -> io::Result<()> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname writes at most.
    if unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain socket(2); the result is checked. Any socket takes SIOCETHTOOL.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid ifreq.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    request.ifr_name = name;
    request.ifr_ifru.ifru_data = data;
    // SAFETY: SIOCETHTOOL reads the ifreq and the command structure behind `data`, which
    // the caller keeps alive for the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut request) } < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: if_indextoname wrote a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
        return Err(io::Error::new(e.kind(), format!("{name}: {e}")));
    }
    Ok(())
}

/// The driver's AF_XDP features (`NETDEV_XSK_FLAGS_*`) for interface `ifindex`: 0 when the
/// kernel has no `netdev` family or does not report them.
pub fn xsk_features(ifindex: u32) -> io::Result<u64> {
    let mut netlink = Netlink::open_generic()?;
    let family = match netlink.family(c"netdev") {
        Ok(Some(family)) => family,
        Ok(None) => return Ok(0),
        Err(e) => return Err(e.named("cannot look up the netdev netlink family")),
    };
    match netlink.xsk_features(family, ifindex) {
        Ok(Some(features)) => Ok(features),
        Ok(None) => Err(malformed("dev-get").named("cannot read the interface's AF_XDP features")),
        Err(e) => Err(e.named("cannot ask the netdev family about the interface")),
    }
}
