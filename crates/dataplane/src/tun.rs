//! The TUN device: IP packets to and from the kernel through `/dev/net/tun`.
//!
//! One read or write per packet for now. Offloads (`IFF_VNET_HDR`, a `virtio_net_hdr` in front
//! of every packet) and `IFF_MULTI_QUEUE` come later; the header will then live in the frame's
//! headroom, right in front of the payload, so reads and writes stay in place (see
//! `Tun::vnet_hdr_len`).

use crate::{Batch, PacketIo, HEADROOM};
use std::ffi::CStr;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const CLONE_DEVICE: &CStr = c"/dev/net/tun";

/// Packets from the TUN side carry no peer address.
const NO_ADDR: SocketAddr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));

/// A TUN interface (layer 3, no packet information header), non-blocking. The interface exists
/// while this value does: it is not persistent and disappears when dropped.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
    /// Bytes of `virtio_net_hdr` in front of every packet on the descriptor: 0 until
    /// `IFF_VNET_HDR` is enabled, and never more than `HEADROOM`. Reads land this many bytes
    /// before the payload, in the headroom, so the payload starts where the batch expects it.
    vnet_hdr_len: usize,
}

impl Tun {
    /// Creates (or attaches to a free, existing) TUN interface `name`. An empty name, or one with
    /// `%d`, lets the kernel choose; [`Tun::name`] tells which it chose.
    ///
    /// The interface is created down and without addresses; configure it with netlink.
    pub fn open(name: &str) -> io::Result<Tun> {
        validate_name(name)?;
        let fail = |e: io::Error| {
            io::Error::new(e.kind(), format!("cannot create TUN device {name}: {e}"))
        };

        // SAFETY: CLONE_DEVICE is a NUL-terminated path; open has no other preconditions.
        let raw = unsafe {
            libc::open(
                CLONE_DEVICE.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(fail(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor open() just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // SAFETY: ifreq is plain old data (arrays, integers, a union of those and a pointer);
        // all zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        // IFF_TUN | IFF_NO_PI is 0x1001: fits a c_short.
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `ifr` is and outlives the
        // call; the name is NUL-terminated because validate_name keeps it under IFNAMSIZ bytes.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        if rc < 0 {
            return Err(fail(io::Error::last_os_error()));
        }

        // The kernel writes back the name it used (it differs when it chose one).
        let len = ifr
            .ifr_name
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(ifr.ifr_name.len());
        let bytes: Vec<u8> = ifr.ifr_name[..len].iter().map(|&c| c as u8).collect();
        let name = String::from_utf8_lossy(&bytes).into_owned();
        Ok(Tun {
            fd,
            name,
            vnet_hdr_len: 0,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The kernel's rule for interface names (`dev_valid_name`), checked here for a clear error.
fn validate_name(name: &str) -> io::Result<()> {
    let invalid = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid TUN device name {name:?}: {why}"),
        ))
    };
    if name.len() >= libc::IFNAMSIZ {
        return invalid(&format!("longer than {} bytes", libc::IFNAMSIZ - 1));
    }
    if name == "." || name == ".." {
        return invalid("not a usable name");
    }
    if name
        .chars()
        .any(|c| c == '\0' || c == '/' || c == ':' || c.is_whitespace())
    {
        return invalid("must not contain '/', ':', whitespace or NUL");
    }
    Ok(())
}

/// Errors that mean the descriptor itself is unusable, not just this packet.
fn is_fatal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::EBADFD | libc::EFAULT)
    )
}

impl PacketIo for Tun {
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let hdr = self.vnet_hdr_len.min(HEADROOM);
        let mut got = 0;
        while !batch.is_full() {
            let i = batch.len();
            // The read starts `hdr` bytes into the headroom: the header lands there and the
            // packet in the payload area.
            let frame = &mut batch.raw_frame_mut(i)[HEADROOM - hdr..];
            // SAFETY: `frame` is a valid, writable buffer of `frame.len()` bytes for the call.
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), frame.as_mut_ptr().cast(), frame.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    // Report the error only when there is nothing to hand over; it will recur.
                    _ if got == 0 => return Err(e),
                    _ => break,
                }
            }
            // n >= 0 here, and at most frame.len() = hdr + FRAME_PAYLOAD.
            let n = n.unsigned_abs();
            if n == 0 {
                // TUN never yields empty packets; do not spin on one.
                break;
            }
            if n <= hdr {
                // A header without a packet: nothing to deliver.
                continue;
            }
            batch.commit(n - hdr, NO_ADDR);
            got += 1;
        }
        Ok(got)
    }

    fn send_batch(&mut self, batch: &Batch) -> io::Result<usize> {
        let mut sent = 0;
        for i in 0..batch.len() {
            // With IFF_VNET_HDR this becomes a writev of [header, payload].
            let packet = batch.payload(i);
            loop {
                // SAFETY: `packet` is a valid, readable buffer of `packet.len()` bytes.
                let n = unsafe {
                    libc::write(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len())
                };
                if n >= 0 {
                    sent += 1;
                    break;
                }
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    // The device queue is full: the rest of the batch is dropped.
                    io::ErrorKind::WouldBlock => return Ok(sent),
                    _ if is_fatal(&e) => return if sent == 0 { Err(e) } else { Ok(sent) },
                    // Refused (EINVAL for a packet that is not IPv4/IPv6, EIO, ...): skip it.
                    _ => break,
                }
            }
        }
        Ok(sent)
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_before_the_kernel_sees_them() {
        let e = Tun::open("a-name-that-is-too-long").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "invalid TUN device name \"a-name-that-is-too-long\": longer than 15 bytes"
        );
        for bad in ["a/b", "a:b", "a b", "a\0b", ".", ".."] {
            let e = Tun::open(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains("invalid TUN device name"), "{e}");
        }
        assert!(validate_name("wg0").is_ok());
        assert!(validate_name("fifteen-bytes-x").is_ok());
        assert!(validate_name("").is_ok());
    }
}
