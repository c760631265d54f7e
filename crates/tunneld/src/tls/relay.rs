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

use super::ListenerStats;
use anyhow::{bail, Context};
use rustls::Connection;
use std::io::{self, ErrorKind, Read, Write};
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

/// A buffer of bytes waiting to be written: `data[start..end]`.
struct Pending {
    data: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            data: vec![0; CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

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

/// One connection's relay after its handshake: both sockets (non-blocking), the rustls
/// connection and what is held for each direction. A relay worker (`pool.rs`) calls
/// [`Relay::step`] whenever either socket reports readiness.
pub struct Relay {
    plain: TcpStream,
    tls: TcpStream,
    conn: Connection,
    to_plain: Pending,
    /// TLS bytes read from the socket, not yet handed to rustls.
    tls_in: Pending,
    tls_eof: bool,
    /// Plaintext side sent EOF (and close_notify is queued).
    plain_done: bool,
    /// TLS side sent close_notify (and, once flushed, the plain write side is shut).
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
    /// A relay between `plain` and `tls` (whose handshake is done).
    pub fn new(
        plain: TcpStream,
        tls: TcpStream,
        mut conn: Connection,
        stats: Arc<ListenerStats>,
    ) -> io::Result<Relay> {
        plain.set_nonblocking(true)?;
        tls.set_nonblocking(true)?;
        // The chunk-at-a-time rule above bounds what rustls holds; its own limit would make
        // `write_all` of a chunk fail instead.
        conn.set_buffer_limit(None);
        Ok(Relay {
            plain,
            tls,
            conn,
            to_plain: Pending::new(),
            tls_in: Pending::new(),
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
    /// stepped again soon, without an event. `scratch` is the worker's buffer for plaintext
    /// on its way into rustls.
    pub fn step(&mut self, scratch: &mut [u8]) -> anyhow::Result<Step> {
        for _ in 0..ROUNDS_PER_STEP {
            let mut progress = flush_tls(&mut self.conn, &mut self.tls)?;
            if self.plain_done && !self.conn.wants_write() && !self.tls_shut {
                // close_notify is out: half-close the TCP stream too.
                let _ = self.tls.shutdown(Shutdown::Write);
                self.tls_shut = true;
            }
            progress |= self.plaintext_in(scratch)?;
            progress |= self.plaintext_out()?;
            if self.plain_done && self.tls_done && self.tls_shut && self.plain_shut {
                return Ok(Step::Done);
            }
            if !progress {
                return Ok(Step::Idle);
            }
        }
        Ok(Step::Busy)
    }

    /// Plaintext in, once the TLS side has taken everything before it.
    fn plaintext_in(&mut self, scratch: &mut [u8]) -> anyhow::Result<bool> {
        if self.plain_done || self.conn.wants_write() || !self.plain_readable {
            return Ok(false);
        }
        match self.plain.read(scratch) {
            Ok(0) => {
                self.plain_done = true;
                self.conn.send_close_notify();
            }
            Ok(n) => {
                self.conn
                    .writer()
                    .write_all(&scratch[..n])
                    .context("TLS encrypt")?;
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

    /// Plaintext out: what rustls already decrypted, then the TLS bytes read but not yet
    /// decrypted, then (once both are used up) one large read from the TLS socket. Reading
    /// the socket here rather than through rustls's `read_tls` on it matters: that reads at
    /// most 4 KiB per system call.
    fn plaintext_out(&mut self) -> anyhow::Result<bool> {
        let mut progress = false;
        if self.to_plain.is_empty() && !self.tls_done {
            let (_, closed) = take_plaintext(&mut self.conn, &mut self.to_plain)?;
            self.tls_done |= closed;
            if self.to_plain.is_empty()
                && !self.tls_done
                && self.tls_in.is_empty()
                && !self.tls_eof
                && self.tls_readable
            {
                match self.tls.read(&mut self.tls_in.data) {
                    Ok(0) => self.tls_eof = true,
                    Ok(n) => (self.tls_in.start, self.tls_in.end) = (0, n),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.tls_readable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("TLS read"),
                }
                progress |= self.tls_eof || !self.tls_in.is_empty();
            }
            // Decrypt while there is room for the plaintext.
            while !self.tls_done
                && !self.tls_in.is_empty()
                && self.to_plain.end < self.to_plain.data.len()
            {
                let mut bytes = &self.tls_in.data[self.tls_in.start..self.tls_in.end];
                let n = self.conn.read_tls(&mut bytes).context("TLS")?;
                self.tls_in.start += n;
                if let Err(e) = self.conn.process_new_packets() {
                    // Send the alert before giving up.
                    let _ = self.conn.write_tls(&mut self.tls);
                    return Err(e).context("TLS");
                }
                let (_, closed) = take_plaintext(&mut self.conn, &mut self.to_plain)?;
                self.tls_done |= closed;
                progress = true;
                if n == 0 {
                    break;
                }
            }
            if self.tls_eof && self.tls_in.is_empty() && !self.tls_done && self.to_plain.is_empty()
            {
                // EOF. A clean end came with close_notify, which `take_plaintext` reports;
                // without it the stream was cut.
                self.conn.read_tls(&mut &[][..]).context("TLS")?;
                self.conn.process_new_packets().context("TLS")?;
                let (_, closed) = take_plaintext(&mut self.conn, &mut self.to_plain)?;
                if !closed {
                    bail!("the TLS stream ended without close_notify (cut short)");
                }
                self.tls_done = true;
                progress = true;
            }
        }
        let to_plain = &mut self.to_plain;
        while !to_plain.is_empty() {
            match self
                .plain
                .write(&to_plain.data[to_plain.start..to_plain.end])
            {
                Ok(0) => bail!("the plaintext socket accepts no more data"),
                Ok(n) => {
                    to_plain.start += n;
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
        if to_plain.is_empty() {
            to_plain.start = 0;
            to_plain.end = 0;
            if self.tls_done && !self.plain_shut {
                let _ = self.plain.shutdown(Shutdown::Write);
                self.plain_shut = true;
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

/// Moves decrypted plaintext from rustls into `out` (which is empty). Returns the bytes moved
/// and whether the other side's close_notify has been reached.
fn take_plaintext(conn: &mut Connection, out: &mut Pending) -> anyhow::Result<(usize, bool)> {
    let mut moved = 0;
    while out.end < out.data.len() {
        match conn.reader().read(&mut out.data[out.end..]) {
            Ok(0) => return Ok((moved, true)),
            Ok(n) => {
                out.end += n;
                moved += n;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // rustls reports a TCP EOF without close_notify as UnexpectedEof.
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                bail!("the TLS stream ended without close_notify (cut short)")
            }
            Err(e) => return Err(e).context("TLS read"),
        }
    }
    Ok((moved, false))
}
