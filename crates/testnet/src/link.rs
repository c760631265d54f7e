//! What a test does to and sees on an interface of its own: a device setting flipped, the
//! frames that cross it. Both act in the calling thread's network namespace; run them
//! through [`crate::NetNs::in_ns`] or [`crate::NetNs::spawn_in_ns`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const ETHTOOL_STXCSUM: u32 = 0x17;
const ETH_P_ALL: u16 = 0x0003;

/// Turns interface `ifname`'s TX checksumming on or off (`ethtool -K IF tx on|off`).
pub fn set_tx_checksumming(ifname: &str, on: bool) -> io::Result<()> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    let socket = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: all-zero is a valid ifreq.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if ifname.len() >= request.ifr_name.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    for (dst, src) in request.ifr_name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: SIOCETHTOOL reads the ifreq and the ethtool_value, both live for the call.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The frames interface `ifname` receives (not those it sends) for up to `time` or until
/// `max` frames have come, whole from the Ethernet header on, as a packet socket sees them.
pub fn capture_received(ifname: &str, time: Duration, max: usize) -> io::Result<Vec<Vec<u8>>> {
    let protocol = ETH_P_ALL.to_be();
    let socket = socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol))?;
    let name = std::ffi::CString::new(ifname)?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol;
    addr.sll_ifindex = ifindex as i32;
    // SAFETY: binds our socket to a valid sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: SO_RCVTIMEO reads a timeval of the size passed.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let deadline = Instant::now() + time;
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 65536];
    while frames.len() < max && Instant::now() < deadline {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf` and `from` are writable for the sizes passed.
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        if from.sll_pkttype != libc::PACKET_OUTGOING {
            frames.push(buf[..n as usize].to_vec());
        }
    }
    Ok(frames)
}

fn socket(family: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked.
    let raw = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, protocol) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}
