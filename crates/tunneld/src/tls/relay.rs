//! One forwarded connection: the TLS handshake, then both directions relayed until each side
//! has closed its half.
//!
//! Backpressure is by construction: plaintext is read only once everything encrypted before
//! it has left for the TLS socket, and TLS is read only once the plaintext it held has left
//! for the plain socket. So a connection holds at most one chunk per direction, whatever the
//! speeds of the two ends. Reads and writes are large (`CHUNK`), and rustls writes many
//! records with one vectored call, to keep system calls few.
//!
//! Half-close: EOF on the plaintext side becomes a TLS close_notify (and a shutdown of the
//! TLS socket's write side); a close_notify received becomes a shutdown of the plaintext
//! socket's write side. The connection ends when both directions have closed, or at once on
//! an error or on a TLS stream cut without close_notify (a truncation that must not pass for
//! a clean end).

use super::records::{self, Kernel, Records};
use super::ListenerStats;
use anyhow::{bail, Context};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::Connection;
use std::io::{self, ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes read from the plaintext side at once, and held for it at most.
pub const CHUNK: usize = 256 * 1024;
/// How long the handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The other side closed the connection during the handshake: what port probes and health
/// checks do, so it is not worth a warning.
#[derive(Debug)]
pub struct ClosedEarly;

impl std::fmt::Display for ClosedEarly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the other side closed the connection during the TLS handshake")
    }
}

impl std::error::Error for ClosedEarly {}

/// Runs the handshake on a blocking socket, with a deadline.
pub fn handshake(conn: &mut Connection, sock: &TcpStream) -> anyhow::Result<()> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut sock = sock;
    while conn.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer within {HANDSHAKE_TIMEOUT:?}");
        }
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))?;
        match conn.complete_io(&mut sock) {
            Ok((0, 0)) if conn.is_handshaking() => return Err(ClosedEarly.into()),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Err(ClosedEarly.into()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                bail!("no answer within {HANDSHAKE_TIMEOUT:?}")
            }
            Err(e) => {
                // Tell the other side why, when rustls has an alert queued.
                let _ = conn.write_tls(&mut sock);
                return Err(e.into());
            }
        }
    }
    // Leftover handshake bytes (a TLS 1.3 server's session tickets) go in the relay.
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
    Ok(())
}

/// A TLS connection whose handshake is done, ready for [`Relay::new`].
pub struct Established {
    records: Records,
    /// The receive buffer, holding `received_end` bytes read past the handshake.
    received: Box<[u8]>,
    received_end: usize,
    /// Application data rustls decrypted with the handshake's last messages.
    early: Vec<u8>,
}

#[cfg(test)]
impl Established {
    /// The record layer, and the bytes read past the handshake.
    pub fn into_parts(self) -> (Records, Vec<u8>) {
        (self.records, self.received[..self.received_end].to_vec())
    }
}

/// A connection to run the handshake of with [`handshake_for_records`].
pub enum Unbuffered {
    Client(UnbufferedClientConnection),
    Server(UnbufferedServerConnection),
}

/// Runs the handshake on a blocking socket, with a deadline, then moves the connection's
/// secrets from rustls to this module's own record layer (`records.rs`).
pub fn handshake_for_records(
    conn: Unbuffered,
    sock: &TcpStream,
    use_ring: bool,
) -> anyhow::Result<Established> {
    let mut received = vec![0; CHUNK].into_boxed_slice();
    let mut early = Vec::new();
    let (received_end, secrets, kernel) = match conn {
        Unbuffered::Client(mut conn) => {
            let end = drive_handshake(&mut *conn, sock, &mut received, &mut early)?;
            let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
            (end, secrets, Kernel::Client(kernel))
        }
        Unbuffered::Server(mut conn) => {
            let end = drive_handshake(&mut *conn, sock, &mut received, &mut early)?;
            let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
            (end, secrets, Kernel::Server(kernel))
        }
    };
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
    Ok(Established {
        records: Records::new(secrets, kernel, use_ring)?,
        received,
        received_end,
        early,
    })
}

/// Drives rustls's unbuffered state machine until the handshake is over and nothing is
/// left to send. Returns how many bytes at the front of `received` are past the handshake
/// (the start of the records that follow).
fn drive_handshake<C: Process>(
    conn: &mut C,
    sock: &TcpStream,
    received: &mut [u8],
    early: &mut Vec<u8>,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut sock = sock;
    let mut received_end = 0;
    let mut outgoing = vec![0; 4096];
    let mut outgoing_end = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer within {HANDSHAKE_TIMEOUT:?}");
        }
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))?;
        let UnbufferedStatus { mut discard, state } = conn.process(&mut received[..received_end]);
        let state = match state {
            Ok(state) => state,
            Err(e) => {
                received.copy_within(discard..received_end, 0);
                received_end -= discard;
                send_queued_alert(conn, sock, &mut received[..received_end]);
                return Err(e.into());
            }
        };
        let mut read_more = false;
        match state {
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = record?;
                    discard += record.discard;
                    early.extend_from_slice(record.payload);
                }
            }
            ConnectionState::EncodeTlsData(mut data) => loop {
                match data.encode(&mut outgoing[outgoing_end..]) {
                    Ok(n) => {
                        outgoing_end += n;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                        outgoing.resize(outgoing_end + required_size, 0)
                    }
                    Err(e) => bail!("TLS: {e}"),
                }
            },
            ConnectionState::TransmitTlsData(transmit) => {
                sock.write_all(&outgoing[..outgoing_end])
                    .map_err(|e| timed_out(e, "sending"))?;
                outgoing_end = 0;
                transmit.done();
            }
            ConnectionState::WriteTraffic(_) => {
                // A server may write once its own flight is out, before the client's last
                // message: the handshake is over only when that has come too.
                if !conn.handshaking() {
                    return Ok(received_end);
                }
                read_more = true;
            }
            ConnectionState::BlockedHandshake => read_more = true,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(ClosedEarly.into()),
            other => bail!("TLS: unexpected handshake state {other:?}"),
        }
        if discard > 0 {
            received.copy_within(discard..received_end, 0);
            received_end -= discard;
        }
        if read_more {
            if received_end == received.len() {
                bail!(
                    "TLS: a handshake message larger than {} bytes",
                    received.len()
                );
            }
            match sock.read(&mut received[received_end..]) {
                Ok(0) => return Err(ClosedEarly.into()),
                Ok(n) => received_end += n,
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Err(ClosedEarly.into()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(timed_out(e, "receiving")),
            }
        }
    }
}

/// rustls's unbuffered connection, client or server side (two types with the same calls).
trait Process {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn handshaking(&self) -> bool;
}

impl Process for UnbufferedConnectionCommon<ClientConnectionData> {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(received)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

impl Process for UnbufferedConnectionCommon<ServerConnectionData> {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(received)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

/// A socket error during the handshake; a timeout says so plainly.
fn timed_out(e: io::Error, doing: &str) -> anyhow::Error {
    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
        anyhow::anyhow!("no answer within {HANDSHAKE_TIMEOUT:?}")
    } else {
        anyhow::Error::new(e).context(format!("{doing} the TLS handshake"))
    }
}

/// After a handshake error, sends the alert rustls queued for it (best effort), so the
/// other side learns why.
fn send_queued_alert<C: Process>(conn: &mut C, sock: &TcpStream, received: &mut [u8]) {
    let mut sock = sock;
    for _ in 0..4 {
        // The bytes rustls has seen go back in: it may hold positions in them.
        match conn.process(received).state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => {
                let mut alert = [0; 256];
                if let Ok(n) = data.encode(&mut alert) {
                    let _ = sock.write_all(&alert[..n]);
                }
            }
            Ok(ConnectionState::TransmitTlsData(transmit)) => transmit.done(),
            _ => return,
        }
    }
}

/// Record slots in the send buffer: plaintext is read into up to this many records at once.
const SLOTS: usize = CHUNK / records::MAX_PLAINTEXT;
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

/// One connection's relay after its handshake: both sockets (non-blocking), the record
/// layer and the two buffers, one per direction. A relay worker (`pool.rs`) calls
/// [`Relay::step`] whenever either socket reports readiness.
///
/// Towards TLS, plaintext is read (`readv`) straight into the plaintext slots of up to
/// `SLOTS` records laid end to end in `sealed`, sealed in place, and written as one run.
/// From TLS, bytes are read into `received`, whose whole records are opened in place, and
/// their plaintext pieces written (`writev`) from there; only the start of a record left
/// at the end moves to the front.
pub struct Relay {
    plain: TcpStream,
    tls: TcpStream,
    records: Records,
    /// Sealed records waiting for the TLS socket: `sealed[sealed_at..sealed_end]`.
    sealed: Box<[u8]>,
    sealed_at: usize,
    sealed_end: usize,
    /// TLS bytes read: `received[..received_end]`, whole records opened up to
    /// `received_opened`.
    received: Box<[u8]>,
    received_end: usize,
    received_opened: usize,
    /// Plaintext in `received` not yet written: (start, length) pieces from `piece`, the
    /// first of them `piece_written` bytes in.
    pieces: Vec<(usize, usize)>,
    piece: usize,
    piece_written: usize,
    /// Plaintext rustls decrypted during the handshake, written before the rest.
    early: Vec<u8>,
    tls_eof: bool,
    /// Plaintext side sent EOF (and close_notify is sealed).
    plain_done: bool,
    /// TLS side sent close_notify (and, once written, the plain write side is shut).
    tls_done: bool,
    plain_shut: bool,
    tls_shut: bool,
    /// Whether a read of each socket may find something: set by readiness, cleared by
    /// `WouldBlock`, so that a step does not spend a system call on a socket known empty.
    plain_readable: bool,
    tls_readable: bool,
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
        tls.set_nonblocking(true)?;
        let Established {
            records,
            received,
            received_end,
            early,
        } = established;
        Ok(Relay {
            plain,
            tls,
            records,
            sealed: vec![0; SLOTS * records::FULL_RECORD].into_boxed_slice(),
            sealed_at: 0,
            sealed_end: 0,
            received,
            received_end,
            received_opened: 0,
            pieces: Vec::with_capacity(PIECES_PER_WRITE),
            piece: 0,
            piece_written: 0,
            early,
            tls_eof: false,
            plain_done: false,
            tls_done: false,
            plain_shut: false,
            tls_shut: false,
            plain_readable: true,
            tls_readable: true,
            stats,
        })
    }

    /// The two sockets, for registering with a poller.
    pub fn sockets(&self) -> (&TcpStream, &TcpStream) {
        (&self.plain, &self.tls)
    }

    /// Notes that the plaintext (`plain`) or the TLS socket may have something to read.
    pub fn mark_readable(&mut self, plain: bool) {
        if plain {
            self.plain_readable = true;
        } else {
            self.tls_readable = true;
        }
    }

    /// Moves what can move now, until no socket takes or gives more or `ROUNDS_PER_STEP`
    /// rounds are done. With edge-triggered readiness an `Idle` connection needs nothing
    /// until its next event: a step stops only where a socket said `WouldBlock` (which
    /// re-arms its edge) or where a direction waits for the other one. A `Busy` one must be
    /// stepped again soon, without an event.
    pub fn step(&mut self) -> anyhow::Result<Step> {
        for _ in 0..ROUNDS_PER_STEP {
            let mut progress = self.sealed_out()?;
            if self.plain_done && self.sealed_at == self.sealed_end && !self.tls_shut {
                // close_notify is out: half-close the TCP stream too.
                let _ = self.tls.shutdown(Shutdown::Write);
                self.tls_shut = true;
            }
            progress |= self.plaintext_in()?;
            progress |= match self.plaintext_out() {
                Err(e) => return Err(self.refused(e)),
                Ok(p) => p,
            };
            if self.plain_done && self.tls_done && self.tls_shut && self.plain_shut {
                return Ok(Step::Done);
            }
            if !progress {
                return Ok(Step::Idle);
            }
        }
        Ok(Step::Busy)
    }

    /// Tells the other side, best effort, why a record of its ends the connection.
    fn refused(&mut self, e: anyhow::Error) -> anyhow::Error {
        if let Some(refused) = e.downcast_ref::<records::Refused>() {
            let mut alert = [0; 64];
            if let Ok(n) = self.records.alert(&mut alert, refused.alert) {
                let _ = self.tls.write(&alert[..n]);
            }
        }
        e.context("TLS")
    }

    /// Writes sealed records to the TLS socket until it takes no more. Returns whether
    /// anything was written.
    fn sealed_out(&mut self) -> anyhow::Result<bool> {
        let mut wrote = false;
        while self.sealed_at < self.sealed_end {
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

    /// Plaintext in, sealed into records, once the TLS side has taken everything before it.
    /// A KeyUpdate that is due goes first, on its own.
    fn plaintext_in(&mut self) -> anyhow::Result<bool> {
        if self.plain_done || self.sealed_at < self.sealed_end || !self.plain_readable {
            return Ok(false);
        }
        (self.sealed_at, self.sealed_end) = (0, 0);
        let due = self.records.due(&mut self.sealed, SLOTS as u64)?;
        if due > 0 {
            self.sealed_end = due;
            return Ok(true);
        }
        let read = {
            let mut slots: [IoSliceMut<'_>; SLOTS] =
                std::array::from_fn(|_| IoSliceMut::new(&mut []));
            for (slot, record) in slots
                .iter_mut()
                .zip(self.sealed.chunks_exact_mut(records::FULL_RECORD))
            {
                *slot = IoSliceMut::new(&mut record[5..5 + records::MAX_PLAINTEXT]);
            }
            self.plain.read_vectored(&mut slots)
        };
        match read {
            Ok(0) => {
                self.plain_done = true;
                self.sealed_end = self.records.close_notify(&mut self.sealed)?;
            }
            Ok(n) => {
                // The read filled whole slots before the last, so the records lie end to end.
                let mut left = n;
                for record in self.sealed.chunks_exact_mut(records::FULL_RECORD) {
                    if left == 0 {
                        break;
                    }
                    let len = left.min(records::MAX_PLAINTEXT);
                    let size = self.records.seal(record, len, records::APPLICATION_DATA)?;
                    self.sealed_end += size;
                    left -= len;
                }
                self.stats
                    .to_tls_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.plain_readable = false;
                return Ok(false);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("plaintext read"),
        }
        Ok(true)
    }

    /// Plaintext out: what the handshake left, the pieces of records already opened, and
    /// (once both are written) one large read from the TLS socket, its whole records opened.
    fn plaintext_out(&mut self) -> anyhow::Result<bool> {
        let mut progress = self.write_early()?;
        if !self.early.is_empty() {
            return Ok(progress);
        }
        progress |= self.write_pieces()?;
        if self.piece < self.pieces.len() {
            return Ok(progress);
        }
        if !self.tls_done {
            // Every piece is out: keep only the start of a record, then read behind it.
            self.pieces.clear();
            (self.piece, self.piece_written) = (0, 0);
            self.received
                .copy_within(self.received_opened..self.received_end, 0);
            self.received_end -= self.received_opened;
            self.received_opened = 0;
            if !self.tls_eof && self.tls_readable {
                let before = self.received_end;
                match self.tls.read(&mut self.received[self.received_end..]) {
                    Ok(0) => self.tls_eof = true,
                    Ok(n) => self.received_end += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.tls_readable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("TLS read"),
                }
                progress |= self.tls_eof || self.received_end > before;
            }
            let opened = self
                .records
                .open(&mut self.received[..self.received_end], &mut self.pieces)?;
            self.received_opened = opened.consumed;
            self.tls_done = opened.close_notify;
            if self.tls_eof && !self.tls_done {
                // A clean end comes with close_notify; without it the stream was cut.
                bail!("the TLS stream ended without close_notify (cut short)");
            }
            progress |= self.write_pieces()?;
        }
        if self.tls_done && self.piece == self.pieces.len() && !self.plain_shut {
            let _ = self.plain.shutdown(Shutdown::Write);
            self.plain_shut = true;
            progress = true;
        }
        Ok(progress)
    }

    fn write_early(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        while !self.early.is_empty() {
            match self.plain.write(&self.early) {
                Ok(0) => bail!("the plaintext socket accepts no more data"),
                Ok(n) => {
                    self.early.drain(..n);
                    self.stats
                        .from_tls_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("plaintext write"),
            }
        }
        Ok(progress)
    }

    /// Writes the opened plaintext pieces until the socket takes no more.
    fn write_pieces(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        while self.piece < self.pieces.len() {
            let mut iov = [IoSlice::new(&[]); PIECES_PER_WRITE];
            let mut count = 0;
            for (i, &(start, len)) in self.pieces[self.piece..]
                .iter()
                .take(PIECES_PER_WRITE)
                .enumerate()
            {
                let skip = if i == 0 { self.piece_written } else { 0 };
                iov[i] = IoSlice::new(&self.received[start + skip..start + len]);
                count += 1;
            }
            match self.plain.write_vectored(&iov[..count]) {
                Ok(0) => bail!("the plaintext socket accepts no more data"),
                Ok(mut n) => {
                    self.stats
                        .from_tls_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    progress = true;
                    while n > 0 {
                        let left = self.pieces[self.piece].1 - self.piece_written;
                        if n < left {
                            self.piece_written += n;
                            break;
                        }
                        n -= left;
                        self.piece += 1;
                        self.piece_written = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("plaintext write"),
            }
        }
        Ok(progress)
    }
}

/// Writes the TLS records rustls has ready to the non-blocking `tls` socket until it takes no
/// more. Returns whether anything was written.
pub fn flush_tls(conn: &mut Connection, tls: &mut TcpStream) -> anyhow::Result<bool> {
    let mut wrote = false;
    while conn.wants_write() {
        match conn.write_tls(tls) {
            Ok(0) => bail!("the TLS socket accepts no more data"),
            Ok(_) => wrote = true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("TLS write"),
        }
    }
    Ok(wrote)
}
