//! The TUN device: IP packets to and from the kernel through `/dev/net/tun`.
//!
//! One read or write per packet, or, with offloads ([`Tun::open_with_offloads`]), per
//! super-packet: the kernel hands over TCP/UDP packets of up to 64 KiB (TSO/USO) which the worker
//! cuts into segments ([`crate::offload::segment`]), and `send_batch` writes the packets of a
//! batch that continue one flow as one super-packet ([`crate::offload::Coalescer`]). The
//! `virtio_net_hdr` in front of every packet lives in the frame's headroom, right in front of
//! the payload, so reads and writes stay in place.

use crate::offload::{Coalescer, VnetHdr, VNET_HDR_LEN};
use crate::{Batch, PacketIo, BATCH_SIZE, HEADROOM};
use std::ffi::CStr;
use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const CLONE_DEVICE: &CStr = c"/dev/net/tun";

/// Packets from the TUN side carry no peer address.
const NO_ADDR: SocketAddr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));

/// Which offloads the kernel accepted on a TUN device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offloads {
    /// TCP segmentation (TSO4/6) with checksum offload: reads may be TCP super-packets, and
    /// writes may coalesce TCP segments.
    pub tcp: bool,
    /// UDP segmentation (USO4/6, Linux 6.2 and later): the same for UDP.
    pub udp: bool,
}

/// A TUN interface (layer 3, no packet information header), non-blocking. The interface exists
/// while this value does: it is not persistent and disappears when dropped.
pub struct Tun {
    fd: OwnedFd,
    name: String,
    /// Bytes of `virtio_net_hdr` in front of every packet on the descriptor: 0 without
    /// `IFF_VNET_HDR`, and never more than `HEADROOM`. Reads land this many bytes before the
    /// payload, in the headroom, so the payload starts where the batch expects it.
    pub(crate) vnet_hdr_len: usize,
    offloads: Offloads,
    /// Plans super-packets for writes (with offloads only).
    pub(crate) coalescer: Box<Coalescer>,
    /// The iovecs of one super-packet write: the head, then each member's payload.
    iovs: Box<[libc::iovec; BATCH_SIZE]>,
    /// Packets written as part of a super-packet (of two or more).
    pub(crate) coalesced: u64,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun")
            .field("fd", &self.fd.as_raw_fd())
            .field("name", &self.name)
            .field("offloads", &self.offloads)
            .finish()
    }
}

// SAFETY: the raw pointers in `iovs` are rewritten before every write and point only into the
// batch borrowed for that call; nothing is shared between threads through them.
unsafe impl Send for Tun {}

impl Tun {
    /// Creates (or attaches to a free, existing) TUN interface `name`. An empty name, or one with
    /// `%d`, lets the kernel choose; [`Tun::name`] tells which it chose.
    ///
    /// The interface is created down and without addresses; configure it with netlink.
    pub fn open(name: &str) -> io::Result<Tun> {
        Tun::create(name, false, false)
    }

    /// Like [`Tun::open`], with a `virtio_net_hdr` on every packet and as many offloads as the
    /// kernel accepts (checksum and TSO4/6, then USO4/6 on Linux 6.2 and later).
    /// [`Tun::offloads`] says which it got; with none, packets still carry the header.
    pub fn open_with_offloads(name: &str) -> io::Result<Tun> {
        let mut tun = Tun::create(name, true, false)?;
        tun.enable_offloads();
        Ok(tun)
    }

    /// Asks for checksum and TSO4/6 offloads, then USO4/6 too, keeping what the kernel gives.
    fn enable_offloads(&mut self) {
        let tcp = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
        let udp = libc::TUN_F_USO4 | libc::TUN_F_USO6;
        if self.set_offload(tcp | udp).is_ok() {
            self.offloads = Offloads {
                tcp: true,
                udp: true,
            };
        } else if self.set_offload(tcp).is_ok() {
            self.offloads.tcp = true;
        }
        *self.coalescer = Coalescer::new(self.offloads.udp);
    }

    /// Opens `queues` queues of one multi-queue TUN interface `name` (`IFF_MULTI_QUEUE`), one
    /// per worker: each is a descriptor of its own, the kernel spreads the packets it routes
    /// into the interface over them by flow (each flow to one queue), and a write on any
    /// queue goes up the stack. With `offloads`, as [`Tun::open_with_offloads`] on each.
    pub fn open_queues(name: &str, queues: usize, offloads: bool) -> io::Result<Vec<Tun>> {
        let mut opened: Vec<Tun> = Vec::with_capacity(queues);
        for _ in 0..queues.max(1) {
            // The first queue fixes the name (the kernel may have chosen it).
            let name = opened.first().map_or(name, |t| t.name.as_str()).to_string();
            let mut tun = Tun::create(&name, offloads, true)?;
            if offloads {
                tun.enable_offloads();
            }
            opened.push(tun);
        }
        Ok(opened)
    }

    fn set_offload(&self, flags: libc::c_uint) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value; no memory is passed.
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// The offloads in use (none for [`Tun::open`]).
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// How many packets so far were written as part of a super-packet.
    pub fn coalesced(&self) -> u64 {
        self.coalesced
    }

    fn create(name: &str, vnet_hdr: bool, multi_queue: bool) -> io::Result<Tun> {
        validate_name(name)?;
        let fail = |e: io::Error, hint: String| {
            io::Error::new(
                e.kind(),
                format!("cannot create TUN device {name}: {e}{hint}"),
            )
        };

        // SAFETY: CLONE_DEVICE is a NUL-terminated path; open has no other preconditions.
        let raw = unsafe {
            libc::open(
                CLONE_DEVICE.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let hint = open_hint(&e);
            return Err(fail(e, hint));
        }
        // SAFETY: `raw` is a descriptor open() just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // SAFETY: ifreq is plain old data (arrays, integers, a union of those and a pointer);
        // all zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }
        if multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        // IFF_TUN | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE is 0x5101: fits a c_short.
        ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `ifr` is and outlives the
        // call; the name is NUL-terminated because validate_name keeps it under IFNAMSIZ bytes.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::EPERM) {
                " (creating an interface needs CAP_NET_ADMIN)".to_string()
            } else {
                String::new()
            };
            return Err(fail(e, hint));
        }

        // The kernel writes back the name it used (it differs when it chose one).
        let len = ifr
            .ifr_name
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(ifr.ifr_name.len());
        let bytes: Vec<u8> = ifr.ifr_name[..len].iter().map(|&c| c as u8).collect();
        let name = String::from_utf8_lossy(&bytes).into_owned();
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Ok(Tun {
            fd,
            name,
            vnet_hdr_len: if vnet_hdr { VNET_HDR_LEN } else { 0 },
            offloads: Offloads::default(),
            coalescer: Box::new(Coalescer::new(false)),
            iovs: Box::new([empty; BATCH_SIZE]),
            coalesced: 0,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// What to change when the clone device cannot be opened: "Permission denied" alone does not
/// say that the device's mode is the cause (CAP_NET_ADMIN does not bypass it), and hosts
/// differ: udev's default rule makes it 0666, a container or a host without udev may leave
/// it 0600 root's.
fn open_hint(e: &io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    let device = "/dev/net/tun";
    match e.raw_os_error() {
        // Refused by a device cgroup (systemd's DevicePolicy=) or a security module, not by
        // the mode.
        Some(libc::EPERM) => format!(
            " (the device controller or a security module refused {device}: a systemd unit \
             needs DeviceAllow={device} rw)"
        ),
        Some(libc::EACCES) => match std::fs::metadata(device) {
            Ok(meta) => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                let uid = unsafe { libc::geteuid() };
                format!(
                    " ({device} is mode {:04o}, owner {}:{}, and uid {uid} may not open it \
                     for reading and writing: make it 0666, as udev's default rule does, or \
                     0660 with a group of this user's)",
                    meta.mode() & 0o7777,
                    meta.uid(),
                    meta.gid(),
                )
            }
            Err(_) => format!(" ({device} cannot be read by this user)"),
        },
        Some(libc::ENOENT) => format!(
            " (there is no {device}: load the tun module, or pass the device into the container)"
        ),
        Some(libc::ENODEV | libc::ENXIO) => {
            " (the kernel has no TUN driver: load the tun module)".to_string()
        }
        _ => String::new(),
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
pub(crate) fn is_fatal(e: &io::Error) -> bool {
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
            let offload = (hdr == VNET_HDR_LEN).then(|| {
                let raw = &batch.raw_frame_mut(i)[HEADROOM - VNET_HDR_LEN..HEADROOM];
                VnetHdr::decode(raw.try_into().unwrap_or(&[0; VNET_HDR_LEN]))
            });
            batch.commit(n - hdr, NO_ADDR);
            if let Some(offload) = offload {
                batch.set_offload(i, offload);
            }
            got += 1;
        }
        Ok(got)
    }

    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if self.vnet_hdr_len == 0 {
            return self.send_plain(batch);
        }
        let groups = self.coalescer.plan(batch);
        for g in 0..groups {
            let planned = self.coalescer.planned(g);
            let raw = batch.raw_frame_mut(planned.head);
            raw[HEADROOM - VNET_HDR_LEN..HEADROOM].copy_from_slice(&planned.hdr.encode());
        }
        // From here on the frames are only read, through pointers from one borrow.
        let frames = batch.payload_ptrs();
        let mut sent = 0;
        for g in 0..groups {
            let planned = self.coalescer.planned(g);
            let head = planned.head;
            self.iovs[0] = libc::iovec {
                // The header sits in the headroom right in front of the payload.
                iov_base: frames[head].wrapping_sub(VNET_HDR_LEN).cast(),
                iov_len: VNET_HDR_LEN + batch.payload_len(head),
            };
            let mut count = 1;
            for m in self.coalescer.members(g) {
                self.iovs[count] = libc::iovec {
                    iov_base: frames[m].wrapping_add(planned.member_hl).cast(),
                    iov_len: batch.payload_len(m).saturating_sub(planned.member_hl),
                };
                count += 1;
            }
            // SAFETY: the first `count` iovecs point at frames of `batch`, which is borrowed
            // for the whole call and not touched while the kernel reads them.
            match self.write_retrying(|fd, iovs| unsafe {
                libc::writev(fd, iovs.as_ptr(), count as libc::c_int)
            }) {
                Ok(true) => {
                    sent += planned.count;
                    if planned.count > 1 {
                        self.coalesced += planned.count as u64;
                    }
                }
                // Degrade, never fail: a kernel that refuses one kind of super-packet gets
                // that kind packet by packet from now on (this group is lost, and counted).
                Ok(false) if planned.count > 1 && self.coalescer.disable(planned.hdr.gso_type) => {
                    tracing::warn!(
                        "the kernel refused a coalesced packet (GSO type {}); writing that kind packet by packet",
                        planned.hdr.gso_type
                    );
                }
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
                Err(e) => return if sent == 0 { Err(e) } else { Ok(sent) },
            }
        }
        Ok(sent)
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
}

impl Tun {
    /// One write per packet (no `virtio_net_hdr` on this descriptor).
    fn send_plain(&mut self, batch: &Batch) -> io::Result<usize> {
        let mut sent = 0;
        for i in 0..batch.len() {
            let packet = batch.payload(i);
            // SAFETY: `packet` is a valid, readable buffer of `packet.len()` bytes.
            match self.write_retrying(|fd, _| unsafe {
                libc::write(fd, packet.as_ptr().cast(), packet.len())
            }) {
                Ok(true) => sent += 1,
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
                Err(e) => return if sent == 0 { Err(e) } else { Ok(sent) },
            }
        }
        Ok(sent)
    }

    /// Runs one write, retrying on EINTR. `Ok(false)`: the kernel refused this packet (EINVAL
    /// for a packet that is not IPv4/IPv6, EIO, ...), skip it. `Err` with `WouldBlock`: the
    /// device queue is full and the rest of the batch is dropped; other errors are fatal.
    fn write_retrying(
        &self,
        mut write: impl FnMut(RawFd, &[libc::iovec]) -> isize,
    ) -> io::Result<bool> {
        loop {
            if write(self.fd.as_raw_fd(), &self.iovs[..]) >= 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Err(e),
                _ if is_fatal(&e) => return Err(e),
                _ => return Ok(false),
            }
        }
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
