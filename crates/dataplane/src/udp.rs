//! The UDP underlay: one dual-stack socket, a batch per `recvmmsg`/`sendmmsg` call.
//!
//! The message headers, iovecs, address and control buffers are allocated once, with the
//! socket; a call only fills them in. Sends put runs of equal-size datagrams to one address
//! into one message with `UDP_SEGMENT` (GSO). Receives take `UDP_GRO`: the kernel may hand over
//! several datagrams of one sender as one buffer with their size in a control message; the
//! frame then records that size and the worker walks the datagrams in place (no copy).

use crate::{Batch, DatagramIo, BATCH_SIZE, FRAME_PAYLOAD};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

/// Socket buffer size asked for; the kernel may grant less (SO_RCVBUF is capped by rmem_max).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// How many pending socket errors (ICMP reports) one `recv_batch` consumes before giving up.
const ERROR_RETRIES: usize = 8;
/// Most datagrams one GSO send may carry (the kernel's UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes one GSO send may carry: the whole run must fit one IP packet.
const GSO_MAX_BYTES: usize = 65_000;

/// Room for one control message carrying a u16 (UDP_SEGMENT) or an int (UDP_GRO), aligned for
/// `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct SegmentCmsg([u8; 32]);

/// A non-blocking UDP socket, normally dual-stack (`[::]:port`, IPv4 peers appear as plain
/// IPv4 addresses).
pub struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
    pub(crate) scratch: Box<Scratch>,
    /// Whether runs of equal-size datagrams to one address go out as one UDP_SEGMENT send.
    gso: bool,
    /// Whether the kernel may merge received datagrams (UDP_GRO).
    gro: bool,
}

impl std::fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpSocket")
            .field("fd", &self.fd.as_raw_fd())
            .field("local", &self.local)
            .finish()
    }
}

/// The arrays the vectored calls use, one entry per frame.
pub(crate) struct Scratch {
    pub(crate) hdrs: [libc::mmsghdr; BATCH_SIZE],
    iovs: [libc::iovec; BATCH_SIZE],
    names: [libc::sockaddr_storage; BATCH_SIZE],
    /// Send side: the UDP_SEGMENT control message of each message that carries a GSO run,
    /// the index in the batch of its first datagram, and how many datagrams it carries.
    cmsgs: [SegmentCmsg; BATCH_SIZE],
    pub(crate) first: [usize; BATCH_SIZE],
    pub(crate) segments: [usize; BATCH_SIZE],
}

// SAFETY: the raw pointers inside `hdrs` and `iovs` are rewritten at the start of every call
// before the kernel sees them and point only into this struct or into the batch borrowed for
// that call; nothing is shared between threads through them, so moving the struct is sound.
unsafe impl Send for Scratch {}

impl Scratch {
    fn new() -> Box<Scratch> {
        // SAFETY: mmsghdr, iovec and sockaddr_storage are plain C structs for which all zeroes
        // (null pointers, zero lengths, AF_UNSPEC) is a valid value.
        Box::new(unsafe { zeroed() })
    }

    /// Points message `j` at its address buffer, its control buffer (if `control`) and at `len`
    /// bytes at `buf`.
    fn prepare(
        &mut self,
        j: usize,
        buf: *mut u8,
        len: usize,
        namelen: libc::socklen_t,
        control: bool,
    ) {
        self.iovs[j] = libc::iovec {
            iov_base: buf.cast(),
            iov_len: len,
        };
        let hdr = &mut self.hdrs[j].msg_hdr;
        hdr.msg_name = ptr::addr_of_mut!(self.names[j]).cast();
        hdr.msg_namelen = namelen;
        hdr.msg_iov = ptr::addr_of_mut!(self.iovs[j]);
        hdr.msg_iovlen = 1;
        if control {
            hdr.msg_control = self.cmsgs[j].0.as_mut_ptr().cast();
            hdr.msg_controllen = size_of::<SegmentCmsg>() as _;
        } else {
            hdr.msg_control = ptr::null_mut();
            hdr.msg_controllen = 0;
        }
        hdr.msg_flags = 0;
        self.hdrs[j].msg_len = 0;
    }

    /// The datagram size of message `j` if the kernel merged several (a UDP_GRO control
    /// message), else 0.
    fn gro_size(&self, j: usize) -> u16 {
        let hdr = &self.hdrs[j].msg_hdr;
        if hdr.msg_control.is_null() || hdr.msg_controllen < size_of::<libc::cmsghdr>() as _ {
            return 0;
        }
        // SAFETY: msg_control points at this message's control buffer and msg_controllen is
        // what the kernel wrote into it, so the CMSG_* walk stays inside it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    let size: libc::c_int = ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    return u16::try_from(size).unwrap_or(0);
                }
                c = libc::CMSG_NXTHDR(hdr, c);
            }
        }
        0
    }
}

impl UdpSocket {
    /// Binds `[::]:port` with IPV6_V6ONLY off, so IPv4 and IPv6 peers share the socket (port 0:
    /// any free port). Falls back to `0.0.0.0:port` where the kernel has no IPv6.
    pub fn bind(port: u16) -> io::Result<UdpSocket> {
        let any6 = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0));
        match UdpSocket::bind_addr(any6) {
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => UdpSocket::bind_addr(
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
            ),
            other => other,
        }
    }

    /// Binds a given address. An IPv6 socket is made dual-stack as in [`UdpSocket::bind`]; an
    /// IPv4 socket can only reach IPv4 peers (datagrams to IPv6 addresses are dropped).
    pub fn bind_addr(addr: SocketAddr) -> io::Result<UdpSocket> {
        UdpSocket::bind_with(addr, false)
    }

    /// Binds `workers` sockets to `addr` in one `SO_REUSEPORT` group, in worker order, with
    /// the steering program attached (see [`crate::steering`]): each datagram naming a
    /// session goes to the socket of the worker that owns it. Port 0: the first socket's.
    pub fn bind_group(addr: SocketAddr, workers: usize) -> io::Result<Vec<UdpSocket>> {
        let count = u32::try_from(workers.max(1))
            .map_err(|_| io::Error::other("too many workers for one socket group"))?;
        let first = UdpSocket::bind_with(addr, true)?;
        let addr = SocketAddr::new(addr.ip(), first.local_addr().port());
        let mut group = vec![first];
        for _ in 1..count {
            group.push(UdpSocket::bind_with(addr, true)?);
        }
        crate::steering::attach(&group[0].fd, count)?;
        Ok(group)
    }

    fn bind_with(addr: SocketAddr, reuseport: bool) -> io::Result<UdpSocket> {
        let fail = |what: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("cannot {what} UDP socket {addr}: {e}"))
        };
        let v6 = addr.is_ipv6();
        let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: socket() has no memory preconditions.
        let raw = unsafe {
            libc::socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(fail("create", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a descriptor socket() just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        if v6 {
            setsockopt(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)
                .map_err(|e| fail("make dual-stack", e))?;
        }
        if reuseport {
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)
                .map_err(|e| fail("share (SO_REUSEPORT)", e))?;
        }
        // Big buffers absorb bursts between worker turns. The FORCE variants ignore rmem_max
        // and wmem_max but need CAP_NET_ADMIN; without it, take what the plain ones give.
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt(&fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = setsockopt(&fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }

        // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = write_sockaddr(addr, v6, &mut storage)
            .ok_or_else(|| fail("bind", io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: `storage` holds a sockaddr of `len` bytes of the socket's family.
        let rc = unsafe { libc::bind(fd.as_raw_fd(), ptr::addr_of!(storage).cast(), len) };
        if rc < 0 {
            return Err(fail("bind", io::Error::last_os_error()));
        }

        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getsockname writes at most `len` bytes into `storage` and updates `len`.
        let rc = unsafe {
            libc::getsockname(fd.as_raw_fd(), ptr::addr_of_mut!(storage).cast(), &mut len)
        };
        if rc < 0 {
            return Err(fail("inspect", io::Error::last_os_error()));
        }
        let local = read_sockaddr(&storage, len)
            .ok_or_else(|| fail("inspect", io::Error::from(io::ErrorKind::InvalidData)))?;
        let gso = gso_supported(&fd);
        let gro = setsockopt(&fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        Ok(UdpSocket {
            fd,
            local,
            scratch: Scratch::new(),
            gso,
            gro,
        })
    }

    /// Blocks until a datagram waits or `timeout` passes (whole milliseconds); whether one
    /// waits. For a thread that serves this socket alone (the fleet's relay).
    pub fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        let mut fd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fd` is one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut fd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        Ok(rc > 0)
    }

    /// The address the socket is bound to (`[::]:port` for a dual-stack socket).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether sends use UDP GSO (on by default where the kernel has it).
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Turns UDP GSO off (or back on, where the kernel has it), e.g. to measure its gain.
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on && gso_supported(&self.fd);
    }

    /// Whether receives take merged datagrams (UDP GRO, on by default where the kernel has it).
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Turns UDP GRO off (or back on, where the kernel has it).
    pub fn set_gro(&mut self, on: bool) {
        let ok = setsockopt(
            &self.fd,
            libc::SOL_UDP,
            libc::UDP_GRO,
            libc::c_int::from(on),
        )
        .is_ok();
        self.gro = on && ok;
    }

    /// Builds the send messages for datagrams `from..` of `batch`: one message per datagram,
    /// or, with GSO, one per run of datagrams to the same address whose sizes are equal (the
    /// last may be shorter). Returns the number of messages.
    pub(crate) fn build_send(&mut self, batch: &Batch, from: usize) -> usize {
        let v6 = self.is_v6();
        let gso = self.gso;
        let s = &mut *self.scratch;
        // SAFETY: CMSG_* only compute sizes.
        let (space, cmsg_len) = unsafe {
            (
                libc::CMSG_SPACE(size_of::<u16>() as u32) as usize,
                libc::CMSG_LEN(size_of::<u16>() as u32) as usize,
            )
        };
        let (mut m, mut k, mut i) = (0, 0, from);
        while i < batch.len() {
            let addr = batch.addr(i);
            let Some(namelen) = write_sockaddr(addr, v6, &mut s.names[m]) else {
                i += 1; // this socket's family cannot reach it
                continue;
            };
            let (first, first_iov) = (i, k);
            let merged = usize::from(batch.segment_size(i));
            if merged > 0 && batch.payload(i).len() > merged && !gso {
                // Without GSO it cannot leave as its datagrams: never as one big one.
                i += 1;
                continue;
            }
            if merged > 0 && batch.payload(i).len() > merged {
                // A frame that holds several datagrams, as UDP GRO received them, leaves as
                // those datagrams in one GSO send (a relay forwards them so, unchanged).
                let p = batch.payload(i);
                s.iovs[k] = libc::iovec {
                    // The kernel only reads through this pointer (sendmmsg).
                    iov_base: p.as_ptr().cast_mut().cast(),
                    iov_len: p.len(),
                };
                let hdr = &mut s.hdrs[m].msg_hdr;
                hdr.msg_name = ptr::addr_of_mut!(s.names[m]).cast();
                hdr.msg_namelen = namelen;
                hdr.msg_iov = ptr::addr_of_mut!(s.iovs[k]);
                hdr.msg_iovlen = 1;
                hdr.msg_flags = 0;
                hdr.msg_control = s.cmsgs[m].0.as_mut_ptr().cast();
                hdr.msg_controllen = space as _;
                // SAFETY: as below: the control buffer has room for CMSG_SPACE(2).
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = cmsg_len as _;
                    ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), merged as u16);
                }
                s.hdrs[m].msg_len = 0;
                s.first[m] = i;
                s.segments[m] = p.len().div_ceil(merged);
                k += 1;
                i += 1;
                m += 1;
                continue;
            }
            let segment = batch.payload(i).len();
            let mut total = 0;
            loop {
                let p = batch.payload(i);
                s.iovs[k] = libc::iovec {
                    // The kernel only reads through this pointer (sendmmsg).
                    iov_base: p.as_ptr().cast_mut().cast(),
                    iov_len: p.len(),
                };
                k += 1;
                i += 1;
                total += p.len();
                let run = i - first;
                let next_fits = i < batch.len()
                    && batch.addr(i) == addr
                    && (1..=segment).contains(&batch.payload(i).len())
                    && total + batch.payload(i).len() <= GSO_MAX_BYTES;
                // A shorter datagram can only end a run.
                if !gso || p.len() < segment || run == GSO_MAX_SEGMENTS || !next_fits {
                    break;
                }
            }
            let run = i - first;
            let hdr = &mut s.hdrs[m].msg_hdr;
            hdr.msg_name = ptr::addr_of_mut!(s.names[m]).cast();
            hdr.msg_namelen = namelen;
            hdr.msg_iov = ptr::addr_of_mut!(s.iovs[first_iov]);
            hdr.msg_iovlen = run as _;
            hdr.msg_flags = 0;
            if run > 1 {
                hdr.msg_control = s.cmsgs[m].0.as_mut_ptr().cast();
                hdr.msg_controllen = space as _;
                // SAFETY: the control buffer is 32 aligned bytes, more than CMSG_SPACE(2), so
                // CMSG_FIRSTHDR is non-null and the header and its u16 fit inside it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = cmsg_len as _;
                    ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment as u16);
                }
            } else {
                hdr.msg_control = ptr::null_mut();
                hdr.msg_controllen = 0;
            }
            s.hdrs[m].msg_len = 0;
            s.first[m] = first;
            s.segments[m] = run;
            m += 1;
        }
        m
    }

    /// Marks every datagram the socket sends (SO_MARK), for policy routing; 0 clears it.
    pub fn set_mark(&self, mark: u32) -> io::Result<()> {
        setsockopt(
            &self.fd,
            libc::SOL_SOCKET,
            libc::SO_MARK,
            mark as libc::c_int,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("cannot set fwmark {mark}: {e}")))
    }

    /// The socket's `SO_MARK` (0: none).
    pub fn mark(&self) -> io::Result<u32> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(value as u32)
    }

    fn is_v6(&self) -> bool {
        self.local.is_ipv6()
    }
}

/// Whether the kernel takes UDP_SEGMENT on this socket (Linux 4.18 and later).
fn gso_supported(fd: &OwnedFd) -> bool {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value` and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            ptr::addr_of_mut!(value).cast(),
            &mut len,
        )
    };
    rc == 0
}

/// `setsockopt` of an integer option on any socket (the TLS relay's TCP sockets use it too).
pub fn setsockopt(
    fd: impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    let fd = fd.as_fd();
    // SAFETY: the option value is a c_int that lives across the call, and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::addr_of!(value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `addr` as the sockaddr a socket of the given family takes (IPv4 addresses become
/// `::ffff:a.b.c.d` on an IPv6 socket). `None` when the family cannot carry it (IPv6 on IPv4).
fn write_sockaddr(
    addr: SocketAddr,
    v6_socket: bool,
    storage: &mut libc::sockaddr_storage,
) -> Option<libc::socklen_t> {
    let v6 = match (addr, v6_socket) {
        (SocketAddr::V4(a), false) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned at least as, sockaddr_in.
            unsafe { ptr::write(ptr::addr_of_mut!(*storage).cast::<libc::sockaddr_in>(), sin) };
            return Some(size_of::<libc::sockaddr_in>() as libc::socklen_t);
        }
        (SocketAddr::V6(_), false) => return None,
        (SocketAddr::V4(a), true) => SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
        (SocketAddr::V6(a), true) => a,
    };
    let sin6 = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: v6.port().to_be(),
        sin6_flowinfo: v6.flowinfo(),
        sin6_addr: libc::in6_addr {
            s6_addr: v6.ip().octets(),
        },
        sin6_scope_id: v6.scope_id(),
    };
    // SAFETY: sockaddr_storage is larger than, and aligned at least as, sockaddr_in6.
    unsafe {
        ptr::write(
            ptr::addr_of_mut!(*storage).cast::<libc::sockaddr_in6>(),
            sin6,
        )
    };
    Some(size_of::<libc::sockaddr_in6>() as libc::socklen_t)
}

/// Reads the address the kernel wrote (`len` bytes); `::ffff:a.b.c.d` comes back as IPv4.
/// `None` for an unknown family or a short address.
pub(crate) fn read_sockaddr(
    storage: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, `len` says it is all
            // there, and sockaddr_storage is aligned for it.
            let sin: libc::sockaddr_in =
                unsafe { ptr::read(ptr::addr_of!(*storage).cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { ptr::read(ptr::addr_of!(*storage).cast::<libc::sockaddr_in6>()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// Errors that mean the socket (or our call) is broken, rather than a report about some
/// earlier datagram (ICMP errors) or a refusal of one datagram.
pub(crate) fn is_fatal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::ENOTSOCK | libc::EFAULT)
    )
}

/// The bytes waiting in `fd`'s receive queue and the queue's size (`SO_MEMINFO`).
pub(crate) fn receive_backlog(fd: RawFd) -> Option<(usize, usize)> {
    let mut info = [0u32; 9];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info` and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let rcvbuf = libc::SK_MEMINFO_RCVBUF as usize;
    if rc < 0 || (len as usize) < (rcvbuf + 1) * 4 {
        return None;
    }
    Some((
        info[libc::SK_MEMINFO_RMEM_ALLOC as usize] as usize,
        info[rcvbuf] as usize,
    ))
}

impl DatagramIo for UdpSocket {
    fn backlog(&self) -> Option<(usize, usize)> {
        receive_backlog(self.fd.as_raw_fd())
    }

    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let start = batch.len();
        let free = BATCH_SIZE - start;
        if free == 0 {
            return Ok(0);
        }
        let frames = batch.payload_ptrs();
        let scratch = &mut *self.scratch;
        let namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        for j in 0..free {
            scratch.prepare(j, frames[start + j], FRAME_PAYLOAD, namelen, self.gro);
        }

        let mut retries = 0;
        let received = loop {
            // SAFETY: the first `free` headers point at their own address buffer and iovec in
            // `scratch`, and each iovec at a distinct, unused frame of `batch` with
            // FRAME_PAYLOAD writable bytes; `scratch` and `batch` are borrowed mutably for the
            // whole call and nothing else touches them.
            let rc = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    scratch.hdrs.as_mut_ptr(),
                    free as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    ptr::null_mut(),
                )
            };
            if rc >= 0 {
                break rc.unsigned_abs() as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ if is_fatal(&e) => return Err(e),
                // A pending error about an earlier datagram (ICMP unreachable, ...): the call
                // consumed it; try again for data.
                _ if retries < ERROR_RETRIES => retries += 1,
                _ => return Ok(0),
            }
        };

        // Keep the well-formed datagrams, moving them down over any dropped one.
        let mut kept = 0;
        for j in 0..received.min(free) {
            let hdr = &scratch.hdrs[j];
            let len = hdr.msg_len as usize;
            let truncated = hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let from = read_sockaddr(&scratch.names[j], hdr.msg_hdr.msg_namelen);
            let (Some(from), false, true) = (from, truncated, len <= FRAME_PAYLOAD) else {
                continue;
            };
            if kept != j {
                // SAFETY: both pointers are frames of `batch` (distinct, so not overlapping)
                // with FRAME_PAYLOAD bytes each, and len <= FRAME_PAYLOAD.
                unsafe { ptr::copy_nonoverlapping(frames[start + j], frames[start + kept], len) };
            }
            batch.set(start + kept, len, from);
            batch.set_segment_size(start + kept, scratch.gro_size(j));
            kept += 1;
        }
        batch.set_len(start + kept);
        Ok(kept)
    }

    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let mut count = self.build_send(batch, 0);
        let mut pos = 0;
        let mut sent = 0;
        while pos < count {
            // SAFETY: headers pos..count point at their own address buffer, control buffer and
            // iovecs in `scratch`, each iovec at a frame payload of `batch`, which is borrowed
            // for the call; the kernel only reads them.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    self.scratch.hdrs[pos..].as_mut_ptr(),
                    (count - pos) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if rc > 0 {
                let n = rc.unsigned_abs() as usize;
                sent += self.scratch.segments[pos..pos + n].iter().sum::<usize>();
                pos += n;
                continue;
            }
            if rc == 0 {
                break; // Not expected; do not spin.
            }
            let e = io::Error::last_os_error();
            let gso_refused = self.scratch.segments[pos] > 1
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::ENOPROTOOPT)
                );
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                // The send buffer is full: the rest is dropped, the caller counts it.
                io::ErrorKind::WouldBlock => break,
                _ if gso_refused => {
                    // Degrade, never fail: send datagram by datagram from here on.
                    tracing::warn!("UDP GSO refused by the kernel ({e}); sending without it");
                    self.gso = false;
                    let from = self.scratch.first[pos];
                    count = self.build_send(batch, from);
                    pos = 0;
                }
                _ if is_fatal(&e) => return if sent == 0 { Err(e) } else { Ok(sent) },
                // The kernel refused the datagram at `pos` (EHOSTUNREACH, EINVAL, EMSGSIZE,
                // EPERM from a firewall, ...): skip it.
                _ => pos += 1,
            }
        }
        Ok(sent)
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn local_port(&self) -> u16 {
        self.local.port()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(addr: SocketAddr, v6_socket: bool) -> Option<SocketAddr> {
        // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = write_sockaddr(addr, v6_socket, &mut storage)?;
        read_sockaddr(&storage, len)
    }

    #[test]
    fn addresses_convert_both_ways() {
        let v4: SocketAddr = "192.0.2.7:51820".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        assert_eq!(roundtrip(v4, false), Some(v4));
        assert_eq!(roundtrip(v4, true), Some(v4), "mapped and back");
        assert_eq!(roundtrip(v6, true), Some(v6));
        assert_eq!(
            roundtrip(v6, false),
            None,
            "IPv6 cannot go on an IPv4 socket"
        );
        let scoped = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 9, 0, 3));
        assert_eq!(roundtrip(scoped, true), Some(scoped));

        // SAFETY: as above.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = write_sockaddr(v4, true, &mut storage).unwrap();
        assert_eq!(storage.ss_family, libc::AF_INET6 as libc::sa_family_t);
        assert_eq!(read_sockaddr(&storage, len - 1), None, "short address");
        storage.ss_family = libc::AF_UNIX as libc::sa_family_t;
        assert_eq!(read_sockaddr(&storage, len), None, "unknown family");
    }
}
