//! One forwarded connection: the TLS handshake, then both directions relayed until each side
//! has closed its half.
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

use super::records::{Kernel, Records};
use super::stream::RecordStream;
use super::ListenerStats;
use anyhow::{bail, Context};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use std::io::{self, ErrorKind, IoSlice, Read, Write};
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

/// A TLS connection whose handshake is done, ready for [`Relay::new`] (through
/// `stream.rs`).
pub struct Established {
    pub(super) records: Records,
    /// The receive buffer, holding `received_end` bytes read past the handshake.
    pub(super) received: Box<[u8]>,
    pub(super) received_end: usize,
    /// Application data rustls decrypted with the handshake's last messages.
    pub(super) early: Vec<u8>,
    /// The other side's close_notify came with them too (a short request and its
    /// half-close can arrive with the client's Finished).
    pub(super) peer_closed: bool,
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
    let ((received_end, peer_closed), secrets, kernel) = match conn {
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
        peer_closed,
    })
}

/// Drives rustls's unbuffered state machine until the handshake is over and nothing is
/// left to send. Returns how many bytes at the front of `received` are past the handshake
/// (the start of the records that follow), and whether the other side's close_notify has
/// already come.
fn drive_handshake<C: Process>(
    conn: &mut C,
    sock: &TcpStream,
    received: &mut [u8],
    early: &mut Vec<u8>,
) -> anyhow::Result<(usize, bool)> {
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
        let (mut read_more, mut peer_closed) = (false, false);
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
                    return Ok((received_end, false));
                }
                read_more = true;
            }
            ConnectionState::BlockedHandshake => read_more = true,
            ConnectionState::PeerClosed => peer_closed = true,
            ConnectionState::Closed => return Err(ClosedEarly.into()),
            other => bail!("TLS: unexpected handshake state {other:?}"),
        }
        if discard > 0 {
            received.copy_within(discard..received_end, 0);
            received_end -= discard;
        }
        if peer_closed {
            // Closed in the handshake: a probe. After it: a request sent with the client's
            // last handshake message, already complete.
            if conn.handshaking() {
                return Err(ClosedEarly.into());
            }
            return Ok((received_end, true));
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
/// other side learns why. rustls hands a queued record out before it looks at the input
/// again; asking once more would make it read the offending bytes a second time.
fn send_queued_alert<C: Process>(conn: &mut C, sock: &TcpStream, received: &mut [u8]) {
    let mut sock = sock;
    // The bytes rustls has seen go back in: it may hold positions in them.
    if let Ok(ConnectionState::EncodeTlsData(mut data)) = conn.process(received).state {
        let mut alert = [0; 256];
        if let Ok(n) = data.encode(&mut alert) {
            let _ = sock.write_all(&alert[..n]);
        }
    }
}

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
        let (stream, early) = RecordStream::new(tls, established)?;
        Ok(Relay {
            plain,
            stream,
            early,
            plain_done: false,
            plain_shut: false,
            tls_shut: false,
            plain_readable: true,
            stats,
        })
    }

    /// The two sockets, for registering with a poller.
    pub fn sockets(&self) -> (&TcpStream, &TcpStream) {
        (&self.plain, self.stream.socket())
    }

    /// Notes that the plaintext (`plain`) or the TLS socket may have something to read.
    pub fn mark_readable(&mut self, plain: bool) {
        if plain {
            self.plain_readable = true;
        } else {
            self.stream.mark_readable();
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
    /// A KeyUpdate that is due goes first, on its own.
    fn plaintext_in(&mut self) -> anyhow::Result<bool> {
        if self.plain_done || self.stream.sending() || !self.plain_readable {
            return Ok(false);
        }
        if self.stream.seal_due()? {
            return Ok(true);
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
