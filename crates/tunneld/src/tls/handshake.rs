//! The TLS handshake of one connection (rustls, blocking, with a deadline), after which the
//! connection's secrets move to tunneld's own record layer (`records.rs`): what a relay
//! (`relay.rs`), a record stream (`stream.rs`) and a WireGuard-over-TLS bridge
//! (`datagrams.rs`) start from.

use super::records::{Kernel, Records};
use anyhow::bail;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
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

/// A TLS connection whose handshake is done, ready for `relay::Relay::new` (through
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
    // rustls sees `received[..offered]`: whole records, one more each time it asks for more,
    // so that what the other side sent after its last handshake message (with it, in one
    // read) stays raw for the record layer and its alerts, rather than reaching rustls.
    let mut offered = 0;
    let mut outgoing = vec![0; 4096];
    let mut outgoing_end = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer within {HANDSHAKE_TIMEOUT:?}");
        }
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))?;
        let UnbufferedStatus { mut discard, state } = conn.process(&mut received[..offered]);
        let state = match state {
            Ok(state) => state,
            Err(e) => {
                received.copy_within(discard..offered, 0);
                offered -= discard;
                send_queued_alert(conn, sock, received, offered);
                return Err(e.into());
            }
        };
        let (mut read_more, mut peer_closed, mut done) = (false, false, false);
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
                done = !conn.handshaking();
                read_more = !done;
            }
            ConnectionState::BlockedHandshake => read_more = true,
            ConnectionState::PeerClosed => peer_closed = true,
            ConnectionState::Closed => return Err(ClosedEarly.into()),
            other => bail!("TLS: unexpected handshake state {other:?}"),
        }
        // Every state, the last included, may come with bytes rustls has used: a server
        // that sends no session tickets (the client offered no psk_dhe_ke) learns that the
        // handshake is over together with the discard of the client's Finished, which rustls
        // has decrypted in place and which must not reach the record layer.
        if discard > 0 {
            received.copy_within(discard..received_end, 0);
            received_end -= discard;
            offered -= discard;
        }
        if done {
            return Ok((received_end, false));
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
            // Bounded: each turn reads at least a byte into a buffer of fixed size, or ends.
            while next_offer(&received[offered..received_end]).is_none() {
                if received_end == received.len() {
                    bail!(
                        "TLS: a handshake message larger than {} bytes",
                        received.len()
                    );
                }
                match sock.read(&mut received[received_end..]) {
                    Ok(0) => return Err(ClosedEarly.into()),
                    Ok(n) => received_end += n,
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                        return Err(ClosedEarly.into())
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(timed_out(e, "receiving")),
                }
            }
            offered += next_offer(&received[offered..received_end]).unwrap_or(0);
        }
    }
}

/// The largest record length (the header's) rustls accepts: 2^14 + 2048 (RFC 8446 5.2).
const MAX_RECORD_LENGTH: usize = (1 << 14) + 2048;

/// How many of `bytes` (raw records) to offer rustls next: the first whole record, or,
/// when its header names a length over [`MAX_RECORD_LENGTH`], all there is (rustls refuses
/// it at once, with record_overflow, instead of waiting for it whole). `None`: read more.
fn next_offer(bytes: &[u8]) -> Option<usize> {
    let header = bytes.get(..5)?;
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if length > MAX_RECORD_LENGTH {
        Some(bytes.len())
    } else {
        (bytes.len() >= 5 + length).then_some(5 + length)
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
fn send_queued_alert<C: Process>(conn: &mut C, sock: &TcpStream, received: &mut [u8], seen: usize) {
    let mut sock = sock;
    // The bytes rustls has seen go back in: it may hold positions in them.
    if let Ok(ConnectionState::EncodeTlsData(mut data)) = conn.process(&mut received[..seen]).state
    {
        let mut alert = [0; 256];
        if let Ok(n) = data.encode(&mut alert) {
            let _ = sock.write_all(&alert[..n]);
        }
    }
    // Our FIN after the alert; then what the other side sent after the bytes that failed is
    // read and dropped, since closing with unread data sends a reset, which can overtake
    // the alert.
    let _ = sock.shutdown(std::net::Shutdown::Write);
    if sock.set_nonblocking(true).is_ok() {
        super::drain(sock, received);
    }
}
