//! The TLS handshake of one connection (rustls, blocking, with a deadline), after which the
//! connection's secrets move to tunneld's own record layer (`records.rs`): what a relay
//! (`relay.rs`), a record stream (`stream.rs`) and a WireGuard-over-TLS bridge
//! (`datagrams.rs`) start from.

use super::records::{
    Kernel, Records, ALERT, APPLICATION_DATA, HANDSHAKE, HEADER, MAX_PLAINTEXT, TAG,
};
use anyhow::bail;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::AlertDescription;
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
    let mut screen = Screen::default();
    // The start of the last record offered, while rustls has neither used nor discarded it
    // and it may be early data rustls is skipping (see `skipped`).
    let mut unanswered: Option<usize> = None;
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
                screen.sending(&outgoing[..outgoing_end]);
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
            unanswered = None;
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
            // A record of refused early data that rustls skipped goes now, before rustls is
            // offered the next one: rustls would try to decrypt it again with each offer,
            // until a later record of the same offer is used, and take its length from its
            // budget for skipping each time.
            if let Some(start) = unanswered.take() {
                if skipped(&received[start..offered]) {
                    received.copy_within(offered..received_end, start);
                    received_end -= offered - start;
                    offered = start;
                }
            }
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
            let next = next_offer(&received[offered..received_end]).unwrap_or(0);
            if let Err(refusal) = screen.check(&received[offered..offered + next]) {
                refuse(sock, refusal.alert, received);
                bail!("TLS: {} (sent {:?})", refusal.why, refusal.alert);
            }
            // Only once this side has sent its encrypted flight: rustls skips early data
            // from then on, until the client's first handshake message under its key.
            unanswered = (screen.sent_encrypted
                && maybe_skipped(&received[offered..offered + next]))
            .then_some(offered);
            offered += next;
        }
    }
}

/// The part of a protected record that a failed AEAD open overwrites: its payload without
/// the tag (nothing when the record holds no more than a tag).
fn opened_part(record: &[u8]) -> &[u8] {
    let payload = record.get(HEADER..).unwrap_or(&[]);
    payload
        .get(..payload.len().saturating_sub(TAG))
        .unwrap_or(&[])
}

/// Whether `record` (whole, about to be offered) can later be told apart by [`skipped`]:
/// it has something besides its tag, and not only zeros.
fn maybe_skipped(record: &[u8]) -> bool {
    opened_part(record).iter().any(|&b| b != 0)
}

/// Whether rustls skipped `record`, the last record it was offered, which it has neither
/// used nor discarded (it blocked for more): refused early data, which rustls tries to
/// decrypt under the client's handshake key and drops when that fails (trial decryption,
/// RFC 8446 4.2.10). rustls does not say so (a skipped record at the end of an offer is
/// not in its discard count), and the other case looks the same from outside: the first
/// fragment of a handshake message, which rustls has decrypted and holds in place. The
/// bytes tell them apart: rustls decrypts in place, and both of its providers' AEADs
/// (ring, aws-lc) zero the output when the tag does not match, so a record that was not
/// all zeros before (see [`maybe_skipped`]) is all zeros after a failed open, while one
/// that opened holds its content type, never zero, in that part. A provider that left the
/// bytes otherwise would only make rustls try the record again, as before.
fn skipped(record: &[u8]) -> bool {
    let part = opened_part(record);
    !part.is_empty() && part.iter().all(|&b| b == 0)
}

/// A record tunneld refuses before rustls sees it, and the alert it gets.
#[derive(Debug, PartialEq)]
struct Refusal {
    alert: AlertDescription,
    why: &'static str,
}

/// The checks tunneld makes on each record of the handshake before offering it to rustls,
/// where rustls 0.23 would refuse the record without an alert, or with another one than
/// RFC 8446 names: a record of another type between the fragments of a plaintext handshake
/// message (rustls: `MessageInterleavedWithHandshakeMessage`, no alert; the RFC, section 5.1:
/// unexpected_message), and a plaintext record over 2^14 bytes (rustls takes up to
/// 2^14 + 2048, the limit of a protected record; section 5.1: record_overflow).
///
/// Only while this side has sent nothing encrypted: its alert then goes out in plaintext,
/// which is what the other side can read. Afterwards the other side's records are
/// encrypted, and what is left to refuse is rustls's to refuse with its keys.
#[derive(Debug, Default)]
struct Screen {
    /// A record of type application data (an encrypted one) has gone out.
    sent_encrypted: bool,
    /// The plaintext handshake message in progress: its header bytes seen so far (while
    /// fewer than 4) and the body bytes still to come.
    header: Vec<u8>,
    body_left: usize,
}

impl Screen {
    /// Notes the records about to be sent (whole ones: rustls encodes records).
    fn sending(&mut self, mut records: &[u8]) {
        while let Some(header) = records.get(..HEADER) {
            self.sent_encrypted |= header[0] == APPLICATION_DATA;
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            records = records.get(HEADER + len..).unwrap_or(&[]);
        }
    }

    /// Checks the next record (whole, or at least its header when it is over the limit).
    fn check(&mut self, record: &[u8]) -> Result<(), Refusal> {
        let Some(header) = record.get(..HEADER) else {
            return Ok(());
        };
        if self.sent_encrypted {
            return Ok(());
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if header[0] != HANDSHAKE {
            if self.header.is_empty() && self.body_left == 0 {
                return Ok(());
            }
            return Err(Refusal {
                alert: AlertDescription::UnexpectedMessage,
                why: "a record between the fragments of a handshake message",
            });
        }
        if len > MAX_PLAINTEXT {
            return Err(Refusal {
                alert: AlertDescription::RecordOverflow,
                why: "a plaintext record over 2^14 bytes",
            });
        }
        let mut body = record.get(HEADER..).unwrap_or(&[]);
        while !body.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(body.len());
                self.body_left -= n;
                body = &body[n..];
            } else {
                self.header.push(body[0]);
                body = &body[1..];
                if let &[_, a, b, c] = self.header.as_slice() {
                    self.body_left = u32::from_be_bytes([0, a, b, c]) as usize;
                    self.header.clear();
                }
            }
        }
        Ok(())
    }
}

/// Sends a fatal alert in plaintext (best effort), then closes as [`send_queued_alert`] does.
fn refuse(sock: &TcpStream, alert: AlertDescription, buf: &mut [u8]) {
    let record = [ALERT, 3, 3, 0, 2, 2, u8::from(alert)];
    let mut sock = sock;
    let _ = sock.write_all(&record);
    close_after_alert(sock, buf);
}

/// The lowest TLS content type (20); alert, handshake and application data follow it.
const CHANGE_CIPHER_SPEC: u8 = 20;

/// The largest record length (the header's) rustls accepts: 2^14 + 2048 (RFC 8446 5.2).
const MAX_RECORD_LENGTH: usize = (1 << 14) + 2048;

/// How many of `bytes` (raw records) to offer rustls next: the first whole record, or,
/// when its header names a length over [`MAX_RECORD_LENGTH`] or is no TLS record header
/// (no content type TLS knows, as in an SSL 2.0 ClientHello), all there is: rustls refuses
/// it at once, with record_overflow or decode_error, instead of waiting for the length the
/// header seems to name. `None`: read more.
fn next_offer(bytes: &[u8]) -> Option<usize> {
    let header = bytes.get(..5)?;
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let known_type = (CHANGE_CIPHER_SPEC..=APPLICATION_DATA).contains(&header[0]);
    if length > MAX_RECORD_LENGTH || !known_type {
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
    close_after_alert(sock, received);
}

/// Our FIN after an alert; then what the other side sent after the bytes that failed is
/// read and dropped, since closing with unread data sends a reset, which can overtake the
/// alert.
fn close_after_alert(sock: &TcpStream, buf: &mut [u8]) {
    let _ = sock.shutdown(std::net::Shutdown::Write);
    if sock.set_nonblocking(true).is_ok() {
        super::drain(sock, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    fn server_config() -> rustls::ServerConfig {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let mut server = rustls::ServerConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        server.enable_secret_extraction = true;
        server
    }

    /// A rustls client's ClientHello record, whole.
    fn client_hello() -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).unwrap();
        hello
    }

    /// Sends `bytes` to a server handshake; returns the handshake's error and every byte the
    /// server sent before it closed.
    fn server_answer(bytes: &[u8]) -> (String, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn =
                rustls::server::UnbufferedServerConnection::new(Arc::new(server_config())).unwrap();
            match handshake_for_records(Unbuffered::Server(conn), &sock, true) {
                Ok(_) => "no error".to_string(),
                Err(e) => format!("{e:#}"),
            }
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.write_all(bytes).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = Vec::new();
        // Ends at the server's FIN: a reset or a timeout fails the test.
        sock.read_to_end(&mut answer).unwrap();
        (server.join().unwrap(), answer)
    }

    /// tlsfuzzer's `zero-length app data interleaved in handshake` (and its padded twins, the
    /// same bytes in plaintext): rustls refuses the record without queuing an alert, so the
    /// client saw only the close. tunneld now answers unexpected_message itself.
    #[test]
    fn a_record_between_the_fragments_of_a_client_hello_gets_unexpected_message() {
        let hello = client_hello();
        let body = &hello[HEADER..];
        let (first, second) = body.split_at(body.len() / 2);
        let mut bytes = Vec::new();
        let fragment = |out: &mut Vec<u8>, piece: &[u8]| {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            out.extend_from_slice(piece);
        };
        fragment(&mut bytes, first);
        bytes.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
        fragment(&mut bytes, second);
        let (error, answer) = server_answer(&bytes);
        assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 10], "{error}");
        assert!(error.contains("between the fragments"), "{error}");
    }

    /// The same ClientHello in two fragments, with nothing between, gets a ServerHello.
    #[test]
    fn a_client_hello_in_two_fragments_is_answered() {
        let hello = client_hello();
        let body = &hello[HEADER..];
        let mut bytes = Vec::new();
        for piece in [&body[..body.len() / 2], &body[body.len() / 2..]] {
            bytes.extend_from_slice(&[HANDSHAKE, 3, 1]);
            bytes.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            bytes.extend_from_slice(piece);
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn =
                rustls::server::UnbufferedServerConnection::new(Arc::new(server_config())).unwrap();
            // Fails when the client goes away after the ServerHello.
            let _ = handshake_for_records(Unbuffered::Server(conn), &sock, true);
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.write_all(&bytes).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut first = [0; 1];
        sock.read_exact(&mut first).unwrap();
        assert_eq!(first[0], HANDSHAKE, "no ServerHello");
        drop(sock);
        server.join().unwrap();
    }

    /// tlsfuzzer's `too big ClientHello msg`: a plaintext record over 2^14 bytes (rustls takes
    /// up to 2^14 + 2048) is record_overflow.
    #[test]
    fn a_plaintext_record_over_2_14_bytes_gets_record_overflow() {
        let hello = client_hello();
        let mut bytes = vec![HANDSHAKE, 3, 1, 0x40, 0x01];
        bytes.extend_from_slice(&hello[HEADER..]);
        bytes.resize(HEADER + MAX_PLAINTEXT + 1, 0);
        let (error, answer) = server_answer(&bytes);
        assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 22], "{error}");
        assert!(error.contains("over 2^14"), "{error}");
    }

    /// tlsfuzzer's `SSL 2.0 ClientHello with TLS 1.3 version ...`: a header that is no TLS
    /// record's went unanswered until the handshake's deadline (the driver waited for the
    /// length it seemed to name); it is refused at once now, with an alert.
    #[test]
    fn an_ssl2_client_hello_is_refused_at_once() {
        // SSL 2.0: two-byte length with the top bit set, CLIENT-HELLO, version 3.4, ...
        let mut hello = vec![0x80, 0x2e, 1, 3, 4, 0, 0x15, 0, 0, 0, 0x10];
        hello.extend_from_slice(&[0x13, 0x01, 0x13, 0x02]);
        hello.resize(2 + 0x2e, 0x5a);
        let started = std::time::Instant::now();
        let (error, answer) = server_answer(&hello);
        assert!(started.elapsed() < Duration::from_secs(5), "{error}");
        assert_eq!(answer.first(), Some(&ALERT), "{error}: {answer:?}");
    }

    /// A client and two servers with one certificate, for resumption: the first server issues
    /// tickets that allow `early` bytes of early data; the second (`enable_secret_extraction`,
    /// as the listener's) knows none of them, so it refuses the PSK and the early data, which
    /// rustls then skips by trial decryption. Only `suite` is offered.
    fn early_data_configs(
        provider: rustls::crypto::CryptoProvider,
        suite: rustls::SupportedCipherSuite,
        early: u32,
    ) -> (
        rustls::ServerConfig,
        rustls::ServerConfig,
        rustls::ClientConfig,
    ) {
        let provider = Arc::new(rustls::crypto::CryptoProvider {
            cipher_suites: vec![suite],
            ..provider
        });
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let server = || {
            let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
                .unwrap();
            rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![der.clone()], key)
                .unwrap()
        };
        let mut issuer = server();
        issuer.max_early_data_size = early;
        let mut refuser = server();
        refuser.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.clone()).unwrap();
        let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_early_data = true;
        (issuer, refuser, client)
    }

    /// A full handshake in memory, the tickets included, so that `client` holds a ticket from
    /// `server`.
    fn get_ticket(server: rustls::ServerConfig, client: &Arc<rustls::ClientConfig>) {
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(client.clone(), name).unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        let mut bytes = Vec::new();
        for _ in 0..10 {
            bytes.clear();
            while client.wants_write() {
                client.write_tls(&mut bytes).unwrap();
            }
            server.read_tls(&mut &bytes[..]).unwrap();
            server.process_new_packets().unwrap();
            bytes.clear();
            while server.wants_write() {
                server.write_tls(&mut bytes).unwrap();
            }
            client.read_tls(&mut &bytes[..]).unwrap();
            client.process_new_packets().unwrap();
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
    }

    /// tlsfuzzer's `handshake with invalid 0-RTT` and its variants (`0rtt-garbage`): early
    /// data the server refuses, which rustls skips by trial decryption within a budget of
    /// 2^14 bytes. The driver offered rustls one record more each time, and rustls, which
    /// consumes a skipped record only when a later record of the same offer is used, tried
    /// the same early data again with each offer, until the budget ran out:
    /// bad_record_mac. Here a real rustls client resumes with a ticket the server does not
    /// know and sends early data, in one record of 10,000 bytes (two tries do not fit) or in
    /// 32-byte records (its Finished then comes in fragments too, which rustls holds while
    /// the driver offers the rest); with every TLS 1.3 suite, from both providers, since
    /// telling a skipped record from a held one relies on how a failed AEAD open leaves it.
    #[test]
    fn refused_early_data_is_skipped_once() {
        let providers = [
            ("aws-lc-rs", rustls::crypto::aws_lc_rs::default_provider()),
            ("ring", rustls::crypto::ring::default_provider()),
        ];
        for (library, provider) in providers {
            for suite in provider.cipher_suites.clone() {
                for (early, fragment) in [(10_000, None), (4_000, Some(32))] {
                    let what = format!("{library} {suite:?}, {early} bytes, {fragment:?}");
                    let (issuer, refuser, mut client) =
                        early_data_configs(provider.clone(), suite, 16_384);
                    client.max_fragment_size = fragment;
                    let client = Arc::new(client);
                    get_ticket(issuer, &client);
                    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                    let addr = listener.local_addr().unwrap();
                    let server = std::thread::spawn(move || {
                        let (sock, _) = listener.accept().unwrap();
                        let conn = UnbufferedServerConnection::new(Arc::new(refuser)).unwrap();
                        handshake_for_records(Unbuffered::Server(conn), &sock, true)
                            .map_err(|e| format!("{e:#}"))
                    });
                    let mut sock = TcpStream::connect(addr).unwrap();
                    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                    let mut conn = rustls::ClientConnection::new(client, name).unwrap();
                    let written = conn.early_data().expect(&what).write(&vec![b'e'; early]);
                    assert_eq!(written.unwrap(), early, "{what}");
                    let mut failed = None;
                    while conn.is_handshaking() && failed.is_none() {
                        while conn.wants_write() {
                            conn.write_tls(&mut sock).unwrap();
                        }
                        if conn.is_handshaking() {
                            match conn.read_tls(&mut sock) {
                                Ok(0) => failed = Some("closed".to_string()),
                                Ok(_) => {
                                    failed = conn.process_new_packets().err().map(|e| e.to_string())
                                }
                                Err(e) => failed = Some(e.to_string()),
                            }
                        }
                    }
                    while conn.wants_write() {
                        conn.write_tls(&mut sock).unwrap();
                    }
                    let established = server.join().unwrap();
                    let established = match established {
                        Ok(established) => established,
                        Err(e) => panic!("{what}: server: {e} (client: {failed:?})"),
                    };
                    assert!(failed.is_none(), "{what}: {failed:?}");
                    assert!(!conn.is_early_data_accepted(), "{what}");
                    assert!(established.early.is_empty(), "{what}");
                    assert_eq!(established.received_end, 0, "{what}");
                }
            }
        }
    }
}
