//! One forwarded connection after its TLS handshake (`handshake.rs`): both directions
//! relayed until each side has closed its half.
//!
//! Backpressure is by construction: plaintext is read only once everything encrypted before
//! it has left for the TLS socket, and TLS is read only once the plaintext it held has left
//! for the plain socket. So a connection holds at most one chunk per direction, whatever the
//! speeds of the two ends. Reads and writes are large (`CHUNK`, many records per system
//! call), to keep system calls few.
//!
//! Half-close: EOF on the plaintext side becomes a TLS close_notify (and a shutdown of the
//! TLS socket's write side); a close_notify received becomes a shutdown of the plaintext
//! socket's write side. The connection ends when both directions have closed, or at once on
//! an error or on a TLS stream cut without close_notify (a truncation that must not pass for
//! a clean end).

use super::handshake::Established;
use super::stream::{self, Lowat, RecordStream};
use super::ListenerStats;
use anyhow::{bail, Context};
use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Plaintext pieces written to the plaintext socket by one `writev`.
const PIECES_PER_WRITE: usize = 64;

/// Rounds of [`Relay::step`] (each up to a chunk per direction) before a busy connection
/// lets the others on its worker have a turn.
const ROUNDS_PER_STEP: usize = 8;

/// Where a connection stands after a [`Relay::step`].
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for its sockets.
    Idle,
    /// Had more to move when its turn ended.
    Busy,
    /// Both directions have closed.
    Done,
}

/// One connection's relay after its handshake: the plaintext socket and the TLS stream
/// (`stream.rs`), both non-blocking. A relay worker (`pool.rs`) calls [`Relay::step`]
/// whenever either socket reports readiness. Plaintext is read (`readv`) straight into the
/// stream's record slots, and the stream's opened plaintext written (`writev`) from where
/// it was received: no copy between the system calls.
pub struct Relay {
    plain: TcpStream,
    stream: RecordStream,
    /// Plaintext rustls decrypted during the handshake, written before the rest.
    early: Vec<u8>,
    /// Plaintext side sent EOF (and close_notify is sealed).
    plain_done: bool,
    plain_shut: bool,
    tls_shut: bool,
    /// Whether a read of the plaintext socket may find something: set by readiness,
    /// cleared by `WouldBlock`, so that a step does not spend a system call on a socket
    /// known empty.
    plain_readable: bool,
    /// A readiness event on the plaintext socket said its other side closed (or it failed).
    plain_hangup: bool,
    /// The plaintext socket's adaptive receive low-water mark.
    plain_lowat: Lowat,
    /// The listener's counters, which the relay adds its bytes to.
    stats: Arc<ListenerStats>,
}

impl Relay {
    /// A relay between `plain` and `tls`, whose handshake `established` is.
    pub fn new(
        plain: TcpStream,
        tls: TcpStream,
        established: Established,
        stats: Arc<ListenerStats>,
    ) -> io::Result<Relay> {
        plain.set_nonblocking(true)?;
        let (mut stream, early) = RecordStream::new(tls, established)?;
        stream.adapt_lowat();
        Ok(Relay {
            plain,
            stream,
            early,
            plain_done: false,
            plain_shut: false,
            tls_shut: false,
            plain_readable: true,
            plain_hangup: false,
            plain_lowat: Lowat::default(),
            stats,
        })
    }

    /// The two sockets, for registering with a poller.
    pub fn sockets(&self) -> (&TcpStream, &TcpStream) {
        (&self.plain, self.stream.socket())
    }

    /// Notes that the plaintext (`plain`) or the TLS socket may have something to read.
    /// `hangup`: the event said the other side closed, or the socket failed.
    pub fn mark_readable(&mut self, plain: bool, hangup: bool) {
        if plain {
            self.plain_readable = true;
            self.plain_hangup |= hangup;
        } else {
            self.stream.mark_readable(hangup);
        }
    }

    /// Whether a socket's receive low-water mark is raised: then the worker reads it
    /// ([`Relay::read_anyway`]) when no event has come for a while, since what is left below
    /// the mark raises none.
    pub fn lowat_raised(&self) -> bool {
        self.plain_lowat.raised() || self.stream.lowat_raised()
    }

    /// Marks the sockets whose low-water mark is raised readable, so that the next step
    /// reads what waits below the mark (and lowers it, should that be little).
    pub fn read_anyway(&mut self) {
        if self.plain_lowat.raised() {
            self.plain_readable = true;
        }
        if self.stream.lowat_raised() {
            self.stream.mark_readable(false);
        }
    }

    /// Moves what can move now, until no socket takes or gives more or `ROUNDS_PER_STEP`
    /// rounds are done. With edge-triggered readiness an `Idle` connection needs nothing
    /// until its next event: a step stops only where a socket said `WouldBlock` (which
    /// re-arms its edge) or where a direction waits for the other one. A `Busy` one must be
    /// stepped again soon, without an event.
    pub fn step(&mut self) -> anyhow::Result<Step> {
        for _ in 0..ROUNDS_PER_STEP {
            let mut progress = self.stream.flush()?;
            if self.plain_done && !self.stream.sending() && !self.tls_shut {
                // close_notify is out: half-close the TCP stream too.
                let _ = self.stream.socket().shutdown(Shutdown::Write);
                self.tls_shut = true;
            }
            progress |= self.plaintext_in()?;
            progress |= self.plaintext_out()?;
            if self.plain_done && self.stream.closed() && self.tls_shut && self.plain_shut {
                return Ok(Step::Done);
            }
            if !progress {
                return Ok(Step::Idle);
            }
        }
        Ok(Step::Busy)
    }

    /// Plaintext in, sealed into records, once the TLS side has taken everything before it.
    /// A KeyUpdate that is due goes first, on its own, whether or not the plaintext side has
    /// anything: one the other side asked for is owed at once, not with the next data.
    fn plaintext_in(&mut self) -> anyhow::Result<bool> {
        if self.plain_done || self.stream.sending() {
            return Ok(false);
        }
        if self.stream.seal_due()? {
            return Ok(true);
        }
        if !self.plain_readable {
            return Ok(false);
        }
        let read = self.plain.read_vectored(&mut self.stream.slots());
        match read {
            Ok(0) => {
                self.plain_done = true;
                self.stream.seal_close_notify()?;
            }
            Ok(n) => {
                self.stream.seal(n)?;
                self.stats
                    .to_tls_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
                // Short of the slots: the socket is drained until its next readiness
                // event, unless an end of stream may wait behind the data (see
                // `RecordStream::receive`).
                self.plain_readable = self.plain_hangup || n == stream::SLOTS_BYTES;
                self.plain_lowat.after_read(&self.plain, n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.plain_readable = false;
                self.plain_lowat.after_read(&self.plain, 0);
                return Ok(false);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("plaintext read"),
        }
        Ok(true)
    }

    /// Plaintext out: what the handshake left, the stream's opened pieces, and (once both
    /// are written) the next records from the TLS socket.
    fn plaintext_out(&mut self) -> anyhow::Result<bool> {
        let mut progress = self.write_early()?;
        if !self.early.is_empty() {
            return Ok(progress);
        }
        progress |= self.write_pending()?;
        if !self.stream.has_pending() && !self.stream.closed() {
            progress |= self.stream.receive()?;
            progress |= self.write_pending()?;
        }
        if self.stream.closed() && !self.stream.has_pending() && !self.plain_shut {
            let _ = self.plain.shutdown(Shutdown::Write);
            self.plain_shut = true;
            progress = true;
        }
        Ok(progress)
    }

    fn write_early(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        while !self.early.is_empty() {
            let iov = [IoSlice::new(&self.early)];
            let Some(n) = write_plain(&mut self.plain, &self.stats, &iov)? else {
                break;
            };
            self.early.drain(..n);
            progress = true;
        }
        Ok(progress)
    }

    /// Writes the stream's opened plaintext until the socket takes no more.
    fn write_pending(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        while self.stream.has_pending() {
            let mut iov = [IoSlice::new(&[]); PIECES_PER_WRITE];
            let count = self.stream.pending(&mut iov);
            let Some(n) = write_plain(&mut self.plain, &self.stats, &iov[..count])? else {
                break;
            };
            self.stream.take(n);
            progress = true;
        }
        Ok(progress)
    }
}

/// One `writev` to the plaintext socket, counted; `None` when it would block.
fn write_plain(
    plain: &mut TcpStream,
    stats: &ListenerStats,
    iov: &[IoSlice<'_>],
) -> anyhow::Result<Option<usize>> {
    loop {
        match plain.write_vectored(iov) {
            Ok(0) => bail!("the plaintext socket accepts no more data"),
            Ok(n) => {
                stats.from_tls_bytes.fetch_add(n as u64, Ordering::Relaxed);
                return Ok(Some(n));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("plaintext write"),
        }
    }
}
