//! The TLS side of a connection after its handshake: the socket (non-blocking), the record
//! layer (`records.rs`) and one buffer per direction. Used by the forwarding relay
//! (`relay.rs`) and the WireGuard-over-TLS bridge (`datagrams.rs`).
//!
//! Going out, the user fills the plaintext slots of up to `SLOTS` records laid end to end
//! (`slots`: a `readv` straight from a socket, or a copy), which are sealed where they lie
//! and written as one run. Coming in, one large read is opened in place and its plaintext
//! handed out as pieces of the receive buffer (`pending`, `take`); only the start of a
//! record left at its end moves to the front before the next read. One buffer each way is
//! also the backpressure: nothing more is sealed until the socket has taken the last run,
//! nothing more is read until the pieces have been taken.

use super::handshake::{Established, CHUNK};
use super::records::{self, Records};
use anyhow::{bail, Context};
use std::io::{self, ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;

/// Record slots in the send buffer.
pub const SLOTS: usize = CHUNK / records::MAX_PLAINTEXT;
/// The plaintext the slots hold.
pub const SLOTS_BYTES: usize = SLOTS * records::MAX_PLAINTEXT;

/// The receive low-water mark (`SO_RCVLOWAT`) of a socket in bulk: readiness is signalled
/// once this much has arrived, not on every arrival.
///
/// Measured with one bulk stream (docs/benchmarks.md, 2026-11-27): the receiving relay
/// woke for every burst the veth delivered and read 98 KB on average, an `epoll_wait`, a
/// context switch and a window update per read; with the mark raised it reads more per
/// wake-up, and the proxies' Gbit per CPU-second rose by a quarter. A static mark stalls
/// request/response traffic (a reply shorter than the mark never signals), so the mark is
/// raised only while a socket is in bulk ([`Lowat`]) and the relay workers read a socket
/// with a raised mark anyway after `pool::LOWAT_FALLBACK` without an event, so the tail
/// of a burst waits at most that long.
pub const LOWAT_BULK: usize = 64 * 1024;
/// Consecutive reads of at least [`LOWAT_BULK`] that make a socket count as in bulk: a
/// reply of a few hundred kilobytes (a request/response exchange) does not raise the mark,
/// and so never waits for the fallback.
const BULK_READS: u8 = 4;

/// A socket's adaptive receive low-water mark: raised to [`LOWAT_BULK`] after
/// [`BULK_READS`] reads of at least that much, back to 1 (the default) at the first read
/// short of it, or one that found nothing.
#[derive(Default)]
pub struct Lowat {
    bulk_reads: u8,
    raised: bool,
}

impl Lowat {
    /// Notes a read of `n` bytes (0: it would have blocked) from `sock`.
    pub fn after_read(&mut self, sock: &TcpStream, n: usize) {
        if n >= LOWAT_BULK {
            self.bulk_reads = self.bulk_reads.saturating_add(1);
            if self.bulk_reads >= BULK_READS && !self.raised {
                self.raised = set_rcvlowat(sock, LOWAT_BULK);
            }
        } else {
            self.bulk_reads = 0;
            if self.raised {
                // Should this fail, the socket keeps the raised mark and the fallback
                // reads it: slower, never stuck.
                self.raised = !set_rcvlowat(sock, 1);
            }
        }
    }

    /// Whether the mark is raised (then the socket must be read without an event, now
    /// and then: what is left below the mark signals nothing).
    pub fn raised(&self) -> bool {
        self.raised
    }
}

/// `setsockopt(SO_RCVLOWAT)`; whether it took.
fn set_rcvlowat(sock: &TcpStream, bytes: usize) -> bool {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    tunneld_dataplane::udp::setsockopt(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, value).is_ok()
}

pub struct RecordStream {
    tls: TcpStream,
    records: Records,
    /// Sealed records waiting for the socket: `sealed[sealed_at..sealed_end]`.
    sealed: Box<[u8]>,
    sealed_at: usize,
    sealed_end: usize,
    /// Bytes read: `received[..received_end]`, whole records opened up to
    /// `received_opened`.
    received: Box<[u8]>,
    received_end: usize,
    received_opened: usize,
    /// Plaintext in `received` not yet taken: (start, length) pieces from `piece`, the first
    /// of them `piece_taken` bytes in.
    pieces: Vec<(usize, usize)>,
    piece: usize,
    piece_taken: usize,
    eof: bool,
    /// The other side's close_notify has come.
    closed: bool,
    /// Whether a read may find something: set by readiness, cleared by `WouldBlock` or by
    /// a read short of its room (see `receive`).
    readable: bool,
    /// A readiness event said the other side closed (or the socket failed): an end of
    /// stream may wait behind the data, which no further event announces.
    hangup: bool,
    /// The socket's low-water mark, when the user adapts it ([`RecordStream::adapt_lowat`]).
    lowat: Option<Lowat>,
}

impl RecordStream {
    /// The stream of an established connection, and the plaintext rustls decrypted with the
    /// handshake's last messages (to be delivered before anything `pending` gives).
    pub fn new(tls: TcpStream, established: Established) -> io::Result<(RecordStream, Vec<u8>)> {
        tls.set_nonblocking(true)?;
        let Established {
            records,
            received,
            received_end,
            early,
            peer_closed,
        } = established;
        let stream = RecordStream {
            tls,
            records,
            sealed: vec![0; SLOTS * records::FULL_RECORD].into_boxed_slice(),
            sealed_at: 0,
            sealed_end: 0,
            received,
            received_end,
            received_opened: 0,
            pieces: Vec::with_capacity(64),
            piece: 0,
            piece_taken: 0,
            eof: false,
            closed: peer_closed,
            readable: true,
            hangup: false,
            lowat: None,
        };
        Ok((stream, early))
    }

    pub fn socket(&self) -> &TcpStream {
        &self.tls
    }

    /// Raises the socket's receive low-water mark while reads come in bulk ([`Lowat`]).
    /// Only for a user that reads a socket whose mark is raised ([`Self::lowat_raised`])
    /// now and then without an event.
    pub fn adapt_lowat(&mut self) {
        self.lowat = Some(Lowat::default());
    }

    /// Whether the socket's low-water mark is raised.
    pub fn lowat_raised(&self) -> bool {
        self.lowat.as_ref().is_some_and(Lowat::raised)
    }

    /// Notes that the socket may have something to read; `hangup`: the event said the other
    /// side closed, or the socket failed.
    pub fn mark_readable(&mut self, hangup: bool) {
        self.readable = true;
        self.hangup |= hangup;
    }

    /// Whether the other side's close_notify has come (nothing after it is read).
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Whether sealed records still wait for the socket (then nothing more may be sealed).
    pub fn sending(&self) -> bool {
        self.sealed_at < self.sealed_end
    }

    /// Writes sealed records until the socket takes no more. Returns whether it took any.
    pub fn flush(&mut self) -> anyhow::Result<bool> {
        let mut wrote = false;
        while self.sending() {
            match self
                .tls
                .write(&self.sealed[self.sealed_at..self.sealed_end])
            {
                Ok(0) => bail!("the TLS socket accepts no more data"),
                Ok(n) => {
                    self.sealed_at += n;
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("TLS write"),
            }
        }
        Ok(wrote)
    }

    /// Seals a KeyUpdate if one is due (asked for, or the key has sealed enough); it must be
    /// flushed before more is sealed. Call only when not `sending`.
    pub fn seal_due(&mut self) -> anyhow::Result<bool> {
        let n = self.records.due(&mut self.sealed, SLOTS as u64)?;
        (self.sealed_at, self.sealed_end) = (0, n);
        Ok(n > 0)
    }

    /// The plaintext slots of the next run of records, to fill in order (each whole before
    /// the next), then [`RecordStream::seal`]. Call only when not `sending`.
    pub fn slots(&mut self) -> [IoSliceMut<'_>; SLOTS] {
        let mut slots: [IoSliceMut<'_>; SLOTS] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
        for (slot, record) in slots
            .iter_mut()
            .zip(self.sealed.chunks_exact_mut(records::FULL_RECORD))
        {
            *slot = IoSliceMut::new(
                &mut record[records::HEADER..records::HEADER + records::MAX_PLAINTEXT],
            );
        }
        slots
    }

    /// Seals the `n` bytes of plaintext put in the slots and queues them for the socket.
    pub fn seal(&mut self, n: usize) -> anyhow::Result<()> {
        (self.sealed_at, self.sealed_end) = (0, 0);
        let mut left = n;
        // Every slot before the last is full, so the records lie end to end.
        for record in self.sealed.chunks_exact_mut(records::FULL_RECORD) {
            if left == 0 {
                break;
            }
            let len = left.min(records::MAX_PLAINTEXT);
            self.sealed_end += self.records.seal(record, len, records::APPLICATION_DATA)?;
            left -= len;
        }
        Ok(())
    }

    /// Queues a close_notify (the end of what this side sends).
    pub fn seal_close_notify(&mut self) -> anyhow::Result<()> {
        let n = self.records.close_notify(&mut self.sealed)?;
        (self.sealed_at, self.sealed_end) = (0, n);
        Ok(())
    }

    /// Reads and opens the next records, once every piece before has been taken. Returns
    /// whether anything came. A stream cut without close_notify is an error, and so is a
    /// record that breaks the protocol (the other side is told why, best effort).
    pub fn receive(&mut self) -> anyhow::Result<bool> {
        if self.piece < self.pieces.len() || self.closed {
            return Ok(false);
        }
        self.pieces.clear();
        (self.piece, self.piece_taken) = (0, 0);
        self.received
            .copy_within(self.received_opened..self.received_end, 0);
        self.received_end -= self.received_opened;
        self.received_opened = 0;
        let mut came = false;
        if !self.eof && self.readable {
            let before = self.received_end;
            match self.tls.read(&mut self.received[self.received_end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.received_end += n;
                    // A read that did not fill the room drained the socket: what comes
                    // later is a new readiness event (edge-triggered epoll signals each
                    // arrival), so reading again now would only return WouldBlock (a
                    // system call per wake-up, measured: a fifth of the receiving side's
                    // reads). Not after a hang-up: the end of the stream that came with
                    // the data shows only to the next read.
                    self.readable = self.hangup || self.received_end == self.received.len();
                    if let Some(lowat) = &mut self.lowat {
                        lowat.after_read(&self.tls, n);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.readable = false;
                    if let Some(lowat) = &mut self.lowat {
                        lowat.after_read(&self.tls, 0);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("TLS read"),
            }
            came = self.eof || self.received_end > before;
        }
        let opened = match self
            .records
            .open(&mut self.received[..self.received_end], &mut self.pieces)
        {
            Ok(opened) => opened,
            Err(e) => return Err(self.refused(e)),
        };
        self.received_opened = opened.consumed;
        self.closed = opened.close_notify;
        if self.eof && !self.closed {
            bail!("the TLS stream ended without close_notify (cut short)");
        }
        Ok(came)
    }

    /// Tells the other side, best effort, why its record ends the connection: the alert,
    /// then our FIN. What it sent after the record is read and dropped first (without
    /// waiting), since closing a socket with unread data resets the connection, and a reset
    /// can overtake the alert.
    ///
    /// Records sealed before the alert (a session ticket or KeyUpdate owed) go first: the
    /// alert's sequence number follows theirs, so it cannot be read without them.
    fn refused(&mut self, e: records::RecordError) -> anyhow::Error {
        if let Some(alert) = e.alert_owed() {
            let mut buf = [0; 64];
            if let Ok(n) = self.records.alert(&mut buf, alert) {
                let pending = &self.sealed[self.sealed_at..self.sealed_end];
                if write_some(&self.tls, pending) == pending.len() {
                    let _ = write_some(&self.tls, &buf[..n]);
                }
                self.sealed_at = self.sealed_end;
            }
            let _ = self.tls.shutdown(std::net::Shutdown::Write);
            super::drain(&self.tls, &mut self.received);
        }
        anyhow::Error::new(e).context("TLS")
    }

    /// Whether opened plaintext waits to be taken.
    pub fn has_pending(&self) -> bool {
        self.piece < self.pieces.len()
    }

    /// The plaintext not yet taken, in order, as up to `iov.len()` slices; returns how many.
    pub fn pending<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        let mut count = 0;
        for (i, &(start, len)) in self.pieces[self.piece..].iter().enumerate() {
            if count == iov.len() {
                break;
            }
            let skip = if i == 0 { self.piece_taken } else { 0 };
            iov[count] = IoSlice::new(&self.received[start + skip..start + len]);
            count += 1;
        }
        count
    }

    /// Marks the first `n` bytes of the pending plaintext taken.
    pub fn take(&mut self, mut n: usize) {
        while n > 0 && self.piece < self.pieces.len() {
            let left = self.pieces[self.piece].1 - self.piece_taken;
            if n < left {
                self.piece_taken += n;
                return;
            }
            n -= left;
            self.piece += 1;
            self.piece_taken = 0;
        }
    }
}

/// Writes what the non-blocking socket takes of `bytes` now, without waiting; returns how
/// much.
fn write_some(mut sock: &TcpStream, bytes: &[u8]) -> usize {
    let mut done = 0;
    while done < bytes.len() {
        match sock.write(&bytes[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    done
}
