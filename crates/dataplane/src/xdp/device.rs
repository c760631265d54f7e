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

use super::nexthop::{malformed, Failure, Netlink, Request};
use netlink_packet_core::NlasIterator;
use netlink_sys::protocols::NETLINK_GENERIC;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// linux/genetlink.h, linux/netdev.h, linux/ethtool.h.
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;
/// `NETDEV_XSK_FLAGS_TX_CHECKSUM`: the driver computes checksums asked for in TX metadata.
pub const XSK_TX_CHECKSUM: u64 = 2;
/// `struct genlmsghdr`: command, version, reserved.
const GENLMSGHDR_LEN: usize = 4;
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
    let mut netlink = Netlink::open(NETLINK_GENERIC, true)?;
    let Some(family) = netdev_family(&mut netlink)? else {
        return Ok(0);
    };
    let mut request = Request::new(family, 0, &[NETDEV_CMD_DEV_GET, 1, 0, 0]);
    request.attribute(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let mut features = Ok(0);
    netlink
        .exchange(request, false, |kind, payload| {
            if kind == family {
                features = parse_xsk_features(payload).ok_or_else(|| malformed("dev-get"));
            }
        })
        .map_err(|e| e.named("cannot ask the netdev family about the interface"))?;
    features.map_err(|e| e.named("cannot read the interface's AF_XDP features"))
}

/// The `netdev` family's number, or `None` where the kernel has no such family.
fn netdev_family(netlink: &mut Netlink) -> io::Result<Option<u16>> {
    let mut request = Request::new(GENL_ID_CTRL, 0, &[CTRL_CMD_GETFAMILY, 1, 0, 0]);
    request.attribute(CTRL_ATTR_FAMILY_NAME, b"netdev\0");
    let mut family = None;
    match netlink.exchange(request, false, |kind, payload| {
        if kind == GENL_ID_CTRL {
            family = parse_family_id(payload);
        }
    }) {
        Ok(()) => {
            Ok(Some(family.ok_or_else(|| {
                malformed("no family id").named("netdev family")
            })?))
        }
        Err(Failure::Refused { errno }) if errno == libc::ENOENT => Ok(None),
        Err(e) => Err(e.named("cannot look up the netdev netlink family")),
    }
}

fn parse_family_id(payload: &[u8]) -> Option<u16> {
    NlasIterator::new(payload.get(GENLMSGHDR_LEN..)?)
        .filter_map(Result::ok)
        .find(|a| a.kind() == CTRL_ATTR_FAMILY_ID)
        .and_then(|a| Some(u16::from_ne_bytes(a.value().try_into().ok()?)))
}

/// The `xsk-features` of a dev-get answer; 0 when absent (kernels before the attribute).
fn parse_xsk_features(payload: &[u8]) -> Option<u64> {
    let mut features = 0;
    for attribute in NlasIterator::new(payload.get(GENLMSGHDR_LEN..)?) {
        let attribute = attribute.ok()?;
        if attribute.kind() == NETDEV_A_DEV_XSK_FEATURES {
            features = u64::from_ne_bytes(attribute.value().try_into().ok()?);
        }
    }
    Some(features)
}

#[cfg(test)]
mod tests {
    use super::super::nexthop::tests::attribute;
    use super::*;

    #[test]
    fn answers_parse_and_nothing_in_them_can_panic() {
        let mut family = vec![1, 2, 0, 0];
        family.extend(attribute(CTRL_ATTR_FAMILY_NAME, b"netdev\0"));
        family.extend(attribute(CTRL_ATTR_FAMILY_ID, &33u16.to_ne_bytes()));
        assert_eq!(parse_family_id(&family), Some(33));
        let mut dev = vec![1, 1, 0, 0];
        dev.extend(attribute(NETDEV_A_DEV_IFINDEX, &7u32.to_ne_bytes()));
        assert_eq!(parse_xsk_features(&dev), Some(0));
        dev.extend(attribute(NETDEV_A_DEV_XSK_FEATURES, &3u64.to_ne_bytes()));
        assert_eq!(parse_xsk_features(&dev), Some(3));
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (state >> (i % 8 * 8)) as u8).collect();
            let _ = (parse_family_id(&bytes), parse_xsk_features(&bytes));
        }
    }
}
