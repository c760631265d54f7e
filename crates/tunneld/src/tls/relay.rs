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

use anyhow::{bail, Context};
use rustls::Connection;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Bytes read from the plaintext side at once, and held for it at most.
const CHUNK: usize = 256 * 1024;
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

/// Relays between `plain` and `tls` (whose handshake is done) until both directions close.
pub fn relay(mut plain: TcpStream, mut tls: TcpStream, mut conn: Connection) -> anyhow::Result<()> {
    plain.set_nonblocking(true)?;
    tls.set_nonblocking(true)?;
    // The chunk-at-a-time rule above bounds what rustls holds; its own limit would make
    // `write_all` of a chunk fail instead.
    conn.set_buffer_limit(None);
    let mut from_plain = vec![0u8; CHUNK].into_boxed_slice();
    let mut to_plain = Pending::new();
    // TLS bytes read from the socket, not yet handed to rustls.
    let mut tls_in = Pending::new();
    let mut tls_eof = false;
    // Plaintext side sent EOF (and close_notify is queued).
    let mut plain_done = false;
    // TLS side sent close_notify (and, once flushed, the plain write side is shut).
    let mut tls_done = false;
    let mut plain_shut = false;
    let mut tls_shut = false;

    loop {
        let mut progress = false;

        progress |= flush_tls(&mut conn, &mut tls)?;
        if plain_done && !conn.wants_write() && !tls_shut {
            // close_notify is out: half-close the TCP stream too.
            let _ = tls.shutdown(Shutdown::Write);
            tls_shut = true;
        }

        // Plaintext in, once the TLS side has taken everything before it.
        if !plain_done && !conn.wants_write() {
            match plain.read(&mut from_plain) {
                Ok(0) => {
                    plain_done = true;
                    conn.send_close_notify();
                    progress = true;
                }
                Ok(n) => {
                    conn.writer()
                        .write_all(&from_plain[..n])
                        .context("TLS encrypt")?;
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => progress = true,
                Err(e) => return Err(e).context("plaintext read"),
            }
        }

        // Plaintext out: what rustls already decrypted, then the TLS bytes read but not yet
        // decrypted, then (once both are used up) one large read from the TLS socket. Reading
        // the socket here rather than through rustls's `read_tls` on it matters: that reads
        // at most 4 KiB per system call.
        if to_plain.is_empty() && !tls_done {
            let (_, closed) = take_plaintext(&mut conn, &mut to_plain)?;
            tls_done |= closed;
            if to_plain.is_empty() && !tls_done && tls_in.is_empty() && !tls_eof {
                match tls.read(&mut tls_in.data) {
                    Ok(0) => tls_eof = true,
                    Ok(n) => (tls_in.start, tls_in.end) = (0, n),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("TLS read"),
                }
                progress |= tls_eof || !tls_in.is_empty();
            }
            // Decrypt while there is room for the plaintext.
            while !tls_done && !tls_in.is_empty() && to_plain.end < to_plain.data.len() {
                let mut bytes = &tls_in.data[tls_in.start..tls_in.end];
                let n = conn.read_tls(&mut bytes).context("TLS")?;
                tls_in.start += n;
                if let Err(e) = conn.process_new_packets() {
                    // Send the alert before giving up.
                    let _ = conn.write_tls(&mut tls);
                    return Err(e).context("TLS");
                }
                let (_, closed) = take_plaintext(&mut conn, &mut to_plain)?;
                tls_done |= closed;
                progress = true;
                if n == 0 {
                    break;
                }
            }
            if tls_eof && tls_in.is_empty() && !tls_done && to_plain.is_empty() {
                // EOF. A clean end came with close_notify, which `take_plaintext` reports;
                // without it the stream was cut.
                conn.read_tls(&mut &[][..]).context("TLS")?;
                conn.process_new_packets().context("TLS")?;
                let (_, closed) = take_plaintext(&mut conn, &mut to_plain)?;
                if !closed {
                    bail!("the TLS stream ended without close_notify (cut short)");
                }
                tls_done = true;
                progress = true;
            }
        }
        while !to_plain.is_empty() {
            match plain.write(&to_plain.data[to_plain.start..to_plain.end]) {
                Ok(0) => bail!("the plaintext socket accepts no more data"),
                Ok(n) => {
                    to_plain.start += n;
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
            if tls_done && !plain_shut {
                let _ = plain.shutdown(Shutdown::Write);
                plain_shut = true;
            }
        }

        if plain_done && tls_done && tls_shut && plain_shut {
            return Ok(());
        }
        if progress {
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: plain.as_raw_fd(),
                events: 0,
                revents: 0,
            },
            libc::pollfd {
                fd: tls.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        if !plain_done && !conn.wants_write() {
            fds[0].events |= libc::POLLIN;
        }
        if !to_plain.is_empty() {
            fds[0].events |= libc::POLLOUT;
        }
        if to_plain.is_empty() && tls_in.is_empty() && !tls_done && !tls_eof {
            fds[1].events |= libc::POLLIN;
        }
        if conn.wants_write() {
            fds[1].events |= libc::POLLOUT;
        }
        // SAFETY: two valid pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
        }
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
