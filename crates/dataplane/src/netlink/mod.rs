//! tunneld's one netlink layer: every question to the kernel over netlink and every byte of
//! its answers goes through here. Interface configuration (`tunneld`'s links, MTU,
//! addresses, routes), the AF_XDP path's next hops, addresses and event monitor
//! (`xdp/nexthop.rs`), its XDP attach (`xdp/program.rs`) and its `netdev` generic-netlink
//! query (`xdp/device.rs`) all use [`Netlink`].
//!
//! - [`wire`]: the bytes, each way once: [`Request`] (a request built in place, no
//!   allocation), [`Exchange`] (the reply scanner: sequence matching, multi-part dumps,
//!   `NLM_F_DUMP_INTR`, ACK/ERROR/DONE/OVERRUN, truncation), [`Attributes`] (attributes by
//!   number), [`Failure`] (the one error: the errno and the kernel's extended-ACK reason,
//!   named with the operation in one line).
//! - [`route`]: rtnetlink: the typed parsers of routes, neighbours, links, addresses, XDP
//!   state and events, and the requests over them.
//! - [`generic`]: generic netlink: a family's number, the `netdev` family's device query.
//!
//! **Why nothing the kernel sends can panic here** (the argument, made once): replies are
//! read with netlink-packet-core's checked buffers only (`NetlinkBuffer::new_checked`,
//! `NlasIterator`), which refuse a length that points past the datagram; fixed-offset
//! fields are read with `get`; a datagram larger than the buffer (which the kernel does not
//! send) is an error, never a cut reply read as whole. The crate's typed decoders (netlink-packet-route) are not used on replies: they
//! fail a whole message on an attribute they cannot decode. A malformed reply ends its
//! request with an error; the parsers answer `None`. `fuzz/fuzz_targets/netlink.rs` feeds
//! arbitrary bytes to the scanner and to every parser.
//!
//! Sockets belong to the network namespace of the thread that opens them.

pub mod generic;
pub mod route;
pub mod wire;

pub use route::{Link, Neighbour, Route, XdpPrograms};
pub use wire::{Attributes, Exchange, Failure, Request};

use netlink_sys::{protocols::NETLINK_GENERIC, protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// How long a query waits for the kernel's answer before it fails (never in practice: the
/// kernel answers a get request before the send returns).
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// Room for any single reply and for a datagram of a dump (the kernel fills dump datagrams
/// to at most 32 KiB), so one `recv` reads every datagram whole.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// How often a dump cut short by a concurrent change is asked again.
const DUMP_TRIES: usize = 4;
/// The receive queue of an event socket: deep, so bursts (a link flap removes many routes)
/// rarely overrun it; an overrun is noticed (ENOBUFS) and handled, only slower.
const EVENT_BUFFER: usize = 4 * 1024 * 1024;

/// A netlink socket (NETLINK_ROUTE or NETLINK_GENERIC) and its receive buffer: the one
/// socket type every netlink client here uses.
pub struct Netlink {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("fd", &self.socket.as_raw_fd())
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

impl AsRawFd for Netlink {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl Netlink {
    /// A NETLINK_ROUTE socket in the calling thread's network namespace, for configuring
    /// links (no receive timeout: a change waits for its ACK). Errors read
    /// `netlink: {step} socket: ...`.
    pub fn open() -> io::Result<Netlink> {
        Netlink::connected(NETLINK_ROUTE, None)
            .map_err(|(step, e)| io::Error::new(e.kind(), format!("netlink: {step} socket: {e}")))
    }

    /// A NETLINK_ROUTE socket for questions (the next-hop resolver's): a receive timeout,
    /// so a lost answer fails the question rather than stalling the caller.
    pub fn open_query() -> io::Result<Netlink> {
        Netlink::connected(NETLINK_ROUTE, Some(QUERY_TIMEOUT)).map_err(|(_, e)| e)
    }

    /// A NETLINK_GENERIC socket for questions.
    pub fn open_generic() -> io::Result<Netlink> {
        Netlink::connected(NETLINK_GENERIC, Some(QUERY_TIMEOUT)).map_err(|(_, e)| e)
    }

    /// A NETLINK_ROUTE socket subscribed to the multicast `groups` (`RTNLGRP_*`) and, where
    /// the kernel has them, to `optional` ones; non-blocking, with a deep receive queue.
    /// Read it with [`Netlink::receive`].
    pub fn subscribe(groups: &[u32], optional: &[u32]) -> io::Result<Netlink> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        for &group in groups {
            socket.add_membership(group)?;
        }
        for &group in optional {
            let _ = socket.add_membership(group);
        }
        socket.set_non_blocking(true)?;
        let _ = socket.set_rx_buf_sz(EVENT_BUFFER);
        Ok(Netlink::with(socket))
    }

    fn with(socket: Socket) -> Netlink {
        Netlink {
            socket,
            sequence: 0,
            buf: Vec::with_capacity(RECEIVE_BUFFER),
        }
    }

    /// A socket of `protocol` connected to the kernel; the error names the step that failed.
    fn connected(
        protocol: isize,
        timeout: Option<Duration>,
    ) -> Result<Netlink, (&'static str, io::Error)> {
        let mut socket = Socket::new(protocol).map_err(|e| ("open", e))?;
        socket.bind_auto().map_err(|e| ("bind", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| ("connect", e))?;
        // Both best effort (older kernels lack them): the kernel's reason in words in an
        // error, and errors that do not echo the whole request back.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        if let Some(timeout) = timeout {
            set_receive_timeout(&socket, timeout).map_err(|e| ("configure", e))?;
        }
        Ok(Netlink::with(socket))
    }

    /// Sends `request` and reads the replies until its answer (a get: the first reply; a
    /// change: the ACK; a dump: DONE), handing each reply's type and payload to `on_reply`.
    pub fn exchange(
        &mut self,
        request: &mut Request,
        mut on_reply: impl FnMut(u16, &[u8]),
    ) -> Result<(), Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut exchange = Exchange::new(self.sequence, request.flags());
        self.send(request.finish(self.sequence)?)?;
        loop {
            let datagram = match self.receive(0) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Failure::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no answer from the kernel",
                    )))
                }
                other => other?,
            };
            if let Some(result) = exchange.scan(datagram, &mut on_reply) {
                return result;
            }
        }
    }

    /// Sends every request of `requests` in one datagram (the kernel handles them in order,
    /// each whether or not one before it failed), then reads until each is answered: their
    /// outcomes, in order. An error of the socket fails them all. Keep batches small enough
    /// that their ACKs fit the socket's receive queue (a few dozen), or the kernel drops ACKs.
    pub fn exchange_batch(
        &mut self,
        requests: &mut [Request],
    ) -> Result<Vec<Result<(), Failure>>, Failure> {
        let mut datagram = Vec::with_capacity(requests.len() * wire::REQUEST_MAX);
        let mut pending = Vec::with_capacity(requests.len());
        for request in requests.iter_mut() {
            self.sequence = self.sequence.wrapping_add(1);
            pending.push(Exchange::new(self.sequence, request.flags()));
            datagram.extend_from_slice(request.finish(self.sequence)?);
        }
        let mut outcomes: Vec<Option<Result<(), Failure>>> = std::iter::repeat_with(|| None)
            .take(requests.len())
            .collect();
        if !datagram.is_empty() {
            self.send(&datagram)?;
        }
        while outcomes.iter().any(Option::is_none) {
            let datagram = self.receive(0)?;
            for (exchange, outcome) in pending.iter_mut().zip(outcomes.iter_mut()) {
                if outcome.is_none() {
                    *outcome = exchange.scan(datagram, &mut |_, _| {});
                }
            }
        }
        Ok(outcomes.into_iter().flatten().collect())
    }

    /// A dump ([`Request::dump`], made by `request`) asked again while a concurrent change
    /// cuts it short (at most a few times); `on_reply` is told when it starts over
    /// (`None`) and then gets each reply (`Some`).
    pub fn dump(
        &mut self,
        request: impl Fn() -> Request,
        mut on_reply: impl FnMut(Option<(u16, &[u8])>),
    ) -> Result<(), Failure> {
        let mut tries = 0;
        loop {
            on_reply(None);
            let result = self.exchange(&mut request(), |kind, payload| {
                on_reply(Some((kind, payload)))
            });
            tries += 1;
            match result {
                Err(Failure::Interrupted) if tries < DUMP_TRIES => {}
                other => return other,
            }
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        loop {
            match self.socket.send(bytes, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(_) => return Ok(()),
            }
        }
    }

    /// Reads one datagram in one system call. `MSG_TRUNC` makes the kernel say a datagram's
    /// whole length, so one longer than the buffer is an error rather than a cut reply (the
    /// next read has room for it). `flags`: `MSG_DONTWAIT` for an event socket's drain.
    pub fn receive(&mut self, flags: libc::c_int) -> io::Result<&[u8]> {
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, flags | libc::MSG_TRUNC) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(n) if n > self.buf.len() => {
                    let had = self.buf.len();
                    self.buf.reserve(n);
                    return Err(io::Error::other(format!(
                        "netlink: a datagram of {n} bytes was cut to the {had} bytes read"
                    )));
                }
                Ok(n) => return Ok(self.buf.get(..n).unwrap_or(&self.buf)),
            }
        }
    }
}

fn set_receive_timeout(socket: &Socket, timeout: Duration) -> io::Result<()> {
    let timeout = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: SO_RCVTIMEO reads a timeval of the given size from a valid pointer.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
