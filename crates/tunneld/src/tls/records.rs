//! TLS 1.3 records after the handshake, sealed and opened in place in the relay's own
//! buffers.
//!
//! rustls runs the handshake; then its secrets move here (`dangerous_into_kernel_connection`,
//! the API meant for kTLS) and the relay frames, seals and opens records itself: plaintext is
//! read from its socket straight into the record slots it will be sent in, and received
//! records are opened where the socket read put them, their plaintext written out from
//! there. No copy between the system calls, no allocation per record. rustls stays the
//! authority for everything after the handshake that needs its state: a key update's next
//! secret (`update_tx_secret`/`update_rx_secret`) and a server's session tickets.
//!
//! What this layer does itself, per RFC 8446 section 5: record framing, the per-record nonce
//! (the IV XOR the sequence number), the inner content type and its zero padding, alerts
//! (close_notify is the clean end; any other alert ends the connection), KeyUpdate in both
//! directions (answering one that asks for it before the next record, and sending its own
//! before the cipher's confidentiality limit), and refusing anything else.

use anyhow::{anyhow, bail, Context};
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets, ExtractedSecrets, SupportedCipherSuite};

/// A record header's size: type, legacy version, length.
pub const HEADER: usize = 5;
const TAG: usize = 16;
/// The most plaintext one record carries.
pub const MAX_PLAINTEXT: usize = 16 * 1024;
/// A record carrying `MAX_PLAINTEXT` bytes: header, plaintext, inner content type, tag.
pub const FULL_RECORD: usize = HEADER + MAX_PLAINTEXT + 1 + TAG;
/// The largest record a peer may send (2^14 + 256 bytes after the header).
pub const MAX_RECORD: usize = HEADER + MAX_PLAINTEXT + 256;

const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
/// The content type of application data.
pub const APPLICATION_DATA: u8 = 23;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// Handshake bytes held for a message split over records, at most: a session ticket is far
/// smaller, and nothing else may arrive after the handshake.
const MAX_HANDSHAKE_HELD: usize = 64 * 1024;

/// One direction's AEAD key, from whichever library does it faster here (see
/// `tls::ring_has_faster_aes_gcm`; both are the same algorithm).
enum Aead {
    // Boxed: ring's expanded AES key is large, and a connection holds two of them.
    Ring(Box<ring::aead::LessSafeKey>),
    AwsLc(aws_lc_rs::aead::LessSafeKey),
}

/// One direction: its key, IV and the sequence number of its next record.
struct Direction {
    aead: Aead,
    iv: [u8; 12],
    seq: u64,
}

impl Direction {
    fn new(
        (seq, secrets): (u64, ConnectionTrafficSecrets),
        use_ring: bool,
    ) -> anyhow::Result<Self> {
        let (ring_alg, lc_alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (
                &ring::aead::AES_128_GCM,
                &aws_lc_rs::aead::AES_128_GCM,
                key,
                iv,
            ),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (
                &ring::aead::AES_256_GCM,
                &aws_lc_rs::aead::AES_256_GCM,
                key,
                iv,
            ),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (
                &ring::aead::CHACHA20_POLY1305,
                &aws_lc_rs::aead::CHACHA20_POLY1305,
                key,
                iv,
            ),
            _ => bail!("a cipher suite this record layer does not know"),
        };
        let aead = if use_ring {
            let key = ring::aead::UnboundKey::new(ring_alg, key.as_ref())
                .map_err(|_| anyhow!("bad traffic key length"))?;
            Aead::Ring(Box::new(ring::aead::LessSafeKey::new(key)))
        } else {
            let key = aws_lc_rs::aead::UnboundKey::new(lc_alg, key.as_ref())
                .map_err(|_| anyhow!("bad traffic key length"))?;
            Aead::AwsLc(aws_lc_rs::aead::LessSafeKey::new(key))
        };
        let iv: [u8; 12] = iv
            .as_ref()
            .try_into()
            .map_err(|_| anyhow!("bad traffic IV length"))?;
        Ok(Direction { aead, iv, seq })
    }

    /// The next record's nonce (RFC 8446 5.3), and the sequence number moved on.
    fn next_nonce(&mut self) -> anyhow::Result<[u8; 12]> {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self
            .seq
            .checked_add(1)
            .context("the record sequence number ran out")?;
        Ok(nonce)
    }

    /// Encrypts `in_out` in place; returns the tag.
    fn seal(&mut self, header: [u8; HEADER], in_out: &mut [u8]) -> anyhow::Result<[u8; TAG]> {
        let nonce = self.next_nonce()?;
        let mut out = [0; TAG];
        match &self.aead {
            Aead::Ring(key) => {
                let tag = key
                    .seal_in_place_separate_tag(
                        ring::aead::Nonce::assume_unique_for_key(nonce),
                        ring::aead::Aad::from(header),
                        in_out,
                    )
                    .map_err(|_| anyhow!("TLS record encryption failed"))?;
                out.copy_from_slice(tag.as_ref());
            }
            Aead::AwsLc(key) => {
                let tag = key
                    .seal_in_place_separate_tag(
                        aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                        aws_lc_rs::aead::Aad::from(header),
                        in_out,
                    )
                    .map_err(|_| anyhow!("TLS record encryption failed"))?;
                out.copy_from_slice(tag.as_ref());
            }
        }
        Ok(out)
    }

    /// Decrypts and authenticates `in_out` (ciphertext and tag) in place; returns the length
    /// of the plaintext at its front, or `None` for a record that is not authentic.
    fn open(&mut self, header: [u8; HEADER], in_out: &mut [u8]) -> anyhow::Result<Option<usize>> {
        let nonce = self.next_nonce()?;
        let opened = match &self.aead {
            Aead::Ring(key) => key
                .open_in_place(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    ring::aead::Aad::from(header),
                    in_out,
                )
                .map(|p| p.len())
                .ok(),
            Aead::AwsLc(key) => key
                .open_in_place(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
                    aws_lc_rs::aead::Aad::from(header),
                    in_out,
                )
                .map(|p| p.len())
                .ok(),
        };
        Ok(opened)
    }
}

/// rustls's side of a connection after the handshake.
pub enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        }
    }

    fn next_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
    }

    fn next_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
        }
    }
}

/// A record the other side sent that ends the connection, with the alert owed to it.
#[derive(Debug)]
pub struct Refused {
    pub alert: AlertDescription,
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl std::error::Error for Refused {}

fn refuse<T>(alert: AlertDescription, why: impl Into<String>) -> anyhow::Result<T> {
    Err(Refused {
        alert,
        why: why.into(),
    }
    .into())
}

/// What [`Records::open`] found in a buffer of TLS bytes.
#[derive(Debug)]
pub struct Opened {
    /// Bytes of whole records used; the rest is the start of a record.
    pub consumed: usize,
    /// The other side's close_notify came (nothing after it counts).
    pub close_notify: bool,
}

/// The record layer of one connection.
pub struct Records {
    kernel: Kernel,
    tx: Direction,
    rx: Direction,
    use_ring: bool,
    /// Records sealed under one key before ours must change (the suite's confidentiality
    /// limit, with room for the records in flight and the KeyUpdate itself).
    tx_key_limit: u64,
    /// The other side asked for a KeyUpdate: ours goes before our next record.
    key_update_owed: bool,
    /// Handshake bytes of a message not yet whole.
    handshake: Vec<u8>,
}

impl Records {
    /// Takes over from rustls at the end of a handshake.
    pub fn new(secrets: ExtractedSecrets, kernel: Kernel, use_ring: bool) -> anyhow::Result<Self> {
        let SupportedCipherSuite::Tls13(suite) = kernel.suite();
        let limit = suite.common.confidentiality_limit;
        Ok(Records {
            tx: Direction::new(secrets.tx, use_ring)?,
            rx: Direction::new(secrets.rx, use_ring)?,
            kernel,
            use_ring,
            tx_key_limit: limit.saturating_sub(1024),
            key_update_owed: false,
            handshake: Vec::new(),
        })
    }

    /// Seals the `len` bytes of plaintext at `buf[HEADER..HEADER + len]` into one record of type
    /// `content_type` at the front of `buf`, in place (`buf` has room for 17 more bytes after
    /// them; `len` is at most [`MAX_PLAINTEXT`]). Returns the record's size.
    pub fn seal(&mut self, buf: &mut [u8], len: usize, content_type: u8) -> anyhow::Result<usize> {
        debug_assert!(len <= MAX_PLAINTEXT);
        let inner = len + 1;
        let size = HEADER + inner + TAG;
        if buf.len() < size {
            bail!("no room for a TLS record");
        }
        let wire_len = (inner + TAG) as u16;
        let header = [
            APPLICATION_DATA,
            3,
            3,
            (wire_len >> 8) as u8,
            wire_len as u8,
        ];
        buf[..HEADER].copy_from_slice(&header);
        buf[HEADER + len] = content_type;
        let tag = self.tx.seal(header, &mut buf[HEADER..HEADER + inner])?;
        buf[HEADER + inner..size].copy_from_slice(&tag);
        Ok(size)
    }

    /// Seals `plaintext` (small: an alert or a handshake message) into `buf` as one record.
    fn seal_message(
        &mut self,
        buf: &mut [u8],
        content_type: u8,
        plaintext: &[u8],
    ) -> anyhow::Result<usize> {
        buf.get_mut(HEADER..HEADER + plaintext.len())
            .context("no room for a TLS record")?
            .copy_from_slice(plaintext);
        self.seal(buf, plaintext.len(), content_type)
    }

    /// The records that must go out before the next application data, sealed into `buf`:
    /// a KeyUpdate the other side asked for, or ours when the key has sealed enough.
    /// Returns their size (0: none due).
    pub fn due(&mut self, buf: &mut [u8], records_next: u64) -> anyhow::Result<usize> {
        let worn = self.tx.seq.saturating_add(records_next) >= self.tx_key_limit;
        if !self.key_update_owed && !worn {
            return Ok(0);
        }
        // update_not_requested: our key changes; the other side's need not.
        let size = self.seal_message(buf, HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0])?;
        self.tx = Direction::new(self.kernel.next_tx()?, self.use_ring)?;
        self.key_update_owed = false;
        Ok(size)
    }

    /// A close_notify alert sealed into `buf`; returns its size.
    pub fn close_notify(&mut self, buf: &mut [u8]) -> anyhow::Result<usize> {
        self.alert(buf, AlertDescription::CloseNotify)
    }

    /// An alert (fatal unless close_notify) sealed into `buf`; returns its size.
    pub fn alert(&mut self, buf: &mut [u8], alert: AlertDescription) -> anyhow::Result<usize> {
        let level = if alert == AlertDescription::CloseNotify {
            1
        } else {
            2
        };
        self.seal_message(buf, ALERT, &[level, u8::from(alert)])
    }

    /// Opens, in place, every whole record at the front of `buf`, and appends the position
    /// and length of each one's application data to `plaintext`. Stops after a
    /// close_notify. An error is a [`Refused`] when the other side broke the protocol.
    pub fn open(
        &mut self,
        buf: &mut [u8],
        plaintext: &mut Vec<(usize, usize)>,
    ) -> anyhow::Result<Opened> {
        let mut at = 0;
        while let Some(header) = buf.get(at..at + HEADER) {
            // `get` gave exactly HEADER bytes.
            let Ok(header) = <[u8; HEADER]>::try_from(header) else {
                break;
            };
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if header[0] != APPLICATION_DATA {
                return refuse(
                    AlertDescription::UnexpectedMessage,
                    format!("a TLS record of type {} after the handshake", header[0]),
                );
            }
            if len > MAX_RECORD - HEADER {
                return refuse(
                    AlertDescription::RecordOverflow,
                    format!("a TLS record of {len} bytes, over the limit"),
                );
            }
            if len < 1 + TAG {
                return refuse(
                    AlertDescription::DecodeError,
                    format!("a TLS record of {len} bytes, too short"),
                );
            }
            let Some(body) = buf.get_mut(at + HEADER..at + HEADER + len) else {
                break; // not whole yet
            };
            let Some(opened) = self.rx.open(header, body)? else {
                return refuse(
                    AlertDescription::BadRecordMac,
                    "a TLS record that does not authenticate (corrupt, or not from the other side)",
                );
            };
            let start = at + HEADER;
            at += HEADER + len;
            // The content type is the last non-zero byte; zeros after it are padding.
            let Some(typed) = body[..opened].iter().rposition(|&b| b != 0) else {
                return refuse(
                    AlertDescription::UnexpectedMessage,
                    "a TLS record with no content type",
                );
            };
            if typed > MAX_PLAINTEXT {
                return refuse(
                    AlertDescription::RecordOverflow,
                    "a TLS record with too much plaintext",
                );
            }
            match body[typed] {
                APPLICATION_DATA => {
                    if typed > 0 {
                        plaintext.push((start, typed));
                    }
                }
                ALERT => {
                    if self.alert_received(&body[..typed])? {
                        return Ok(Opened {
                            consumed: at,
                            close_notify: true,
                        });
                    }
                }
                HANDSHAKE => {
                    if typed == 0 {
                        return refuse(
                            AlertDescription::UnexpectedMessage,
                            "an empty TLS handshake record",
                        );
                    }
                    self.handshake.extend_from_slice(&body[..typed]);
                    self.handshake_received()?;
                }
                other => {
                    return refuse(
                        AlertDescription::UnexpectedMessage,
                        format!("a TLS record of content type {other} after the handshake"),
                    )
                }
            }
        }
        Ok(Opened {
            consumed: at,
            close_notify: false,
        })
    }

    /// Whether the alert is close_notify; any other alert but user_canceled (which comes
    /// before a close_notify) ends the connection.
    fn alert_received(&mut self, alert: &[u8]) -> anyhow::Result<bool> {
        let &[_level, description] = alert else {
            return refuse(AlertDescription::DecodeError, "a malformed TLS alert");
        };
        match AlertDescription::from(description) {
            AlertDescription::CloseNotify => Ok(true),
            AlertDescription::UserCanceled => Ok(false),
            other => bail!("the other side sent the TLS alert {other:?}"),
        }
    }

    /// Acts on every whole handshake message held: a session ticket (to rustls's store), a
    /// KeyUpdate (the next receive key, and ours owed if asked for).
    fn handshake_received(&mut self) -> anyhow::Result<()> {
        let mut at = 0;
        while let Some(&[kind, a, b, c]) = self.handshake.get(at..at + 4) {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            let Some(body) = self.handshake.get(at + 4..at + 4 + len) else {
                break;
            };
            match kind {
                KEY_UPDATE => {
                    let &[request] = body else {
                        return refuse(AlertDescription::DecodeError, "a malformed KeyUpdate");
                    };
                    if request > 1 {
                        return refuse(AlertDescription::IllegalParameter, "a malformed KeyUpdate");
                    }
                    // A key change must end its record (RFC 8446 5.1).
                    if at + 4 + len != self.handshake.len() {
                        return refuse(
                            AlertDescription::UnexpectedMessage,
                            "a KeyUpdate not at the end of its record",
                        );
                    }
                    self.rx = Direction::new(self.kernel.next_rx()?, self.use_ring)?;
                    self.key_update_owed |= request == 1;
                }
                NEW_SESSION_TICKET if matches!(self.kernel, Kernel::Client(_)) => {
                    if let Kernel::Client(kernel) = &mut self.kernel {
                        // A ticket rustls cannot use costs nothing but a later full handshake.
                        if let Err(e) = kernel.handle_new_session_ticket(body) {
                            tracing::debug!("TLS session ticket ignored: {e}");
                        }
                    }
                }
                kind => {
                    return refuse(
                        AlertDescription::UnexpectedMessage,
                        format!("the TLS handshake message {kind} after the handshake"),
                    )
                }
            }
            at += 4 + len;
        }
        self.handshake.drain(..at);
        if self.handshake.len() > MAX_HANDSHAKE_HELD {
            return refuse(
                AlertDescription::DecodeError,
                "a TLS handshake message too large",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::handshake::{handshake_for_records, Unbuffered};
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::time::Duration;

    /// A server config with a fresh self-signed certificate and a client config that
    /// trusts it, both for tunneld's record layer.
    fn configs() -> (rustls::ServerConfig, rustls::ClientConfig) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let mut server = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        server.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.enable_secret_extraction = true;
        (server, client)
    }

    /// Both ends of a real handshake over loopback (rustls, the production handshake code),
    /// as record layers, the client's having taken the server's session tickets.
    fn pair() -> (Records, Records) {
        let (server, client) = configs();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn = rustls::server::UnbufferedServerConnection::new(Arc::new(server)).unwrap();
            handshake_for_records(Unbuffered::Server(conn), &sock, true).unwrap()
        });
        let sock = TcpStream::connect(addr).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::client::UnbufferedClientConnection::new(Arc::new(client), name).unwrap();
        let client = handshake_for_records(Unbuffered::Client(conn), &sock, true).unwrap();
        let mut read = client.received[..client.received_end].to_vec();
        let client = client.records;
        let server = server.join().unwrap().records;
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0; 4096];
        while let Ok(n @ 1..) = (&sock).read(&mut buf) {
            read.extend_from_slice(&buf[..n]);
        }
        let mut client = client;
        // What followed the client's handshake is the server's session tickets: no data.
        assert!(!read.is_empty(), "rustls servers send session tickets");
        assert_eq!(opened(&mut client, &mut read), b"");
        (client, server)
    }

    /// `text` sealed by `from` as one application-data record.
    fn sealed(from: &mut Records, text: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; HEADER + text.len() + 1 + TAG];
        buf[HEADER..HEADER + text.len()].copy_from_slice(text);
        let n = from.seal(&mut buf, text.len(), APPLICATION_DATA).unwrap();
        buf.truncate(n);
        buf
    }

    /// The plaintext `to` opens from `records`, which must all be whole.
    fn opened(to: &mut Records, records: &mut [u8]) -> Vec<u8> {
        let mut pieces = Vec::new();
        let found = to.open(records, &mut pieces).unwrap();
        assert_eq!(found.consumed, records.len());
        pieces
            .iter()
            .flat_map(|&(at, len)| records[at..at + len].to_vec())
            .collect()
    }

    fn refusal(to: &mut Records, records: &mut [u8]) -> AlertDescription {
        let e = to.open(records, &mut Vec::new()).unwrap_err();
        e.downcast_ref::<Refused>()
            .unwrap_or_else(|| panic!("not a refusal: {e:#}"))
            .alert
    }

    #[test]
    fn a_request_and_its_close_sent_with_the_clients_finished_are_kept() {
        let (server, client) = configs();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn = rustls::server::UnbufferedServerConnection::new(Arc::new(server)).unwrap();
            handshake_for_records(Unbuffered::Server(conn), &sock, true)
        });
        // rustls's buffered client, held back so that its Finished, what was written
        // early and the close_notify leave in one write.
        let mut sock = TcpStream::connect(addr).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        std::io::Write::write_all(&mut conn.writer(), b"request").unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        while conn.is_handshaking() {
            conn.read_tls(&mut sock).unwrap();
            conn.process_new_packets().unwrap();
        }
        conn.send_close_notify();
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        let established = server.join().unwrap().expect("the handshake completes");
        assert_eq!(established.early, b"request");
        assert!(established.peer_closed);
    }

    /// tlsfuzzer's client offers no psk_dhe_ke, so the server sends no session tickets, and
    /// it sends its Finished alone and its first record in a later write. rustls then says
    /// that the handshake is over in the same step that discards the Finished, which it has
    /// decrypted in place: the record layer once got that Finished as if it were the first
    /// record, and answered the real one with bad_record_mac.
    #[test]
    fn the_first_record_after_a_finished_that_came_alone_opens() {
        let (mut server, client) = configs();
        server.send_tls13_tickets = 0;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn = rustls::server::UnbufferedServerConnection::new(Arc::new(server)).unwrap();
            let established = handshake_for_records(Unbuffered::Server(conn), &sock, true);
            (established.unwrap(), sock)
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        while conn.is_handshaking() {
            while conn.wants_write() {
                conn.write_tls(&mut sock).unwrap();
            }
            if conn.is_handshaking() {
                conn.read_tls(&mut sock).unwrap();
                conn.process_new_packets().unwrap();
            }
        }
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        // The Finished went alone: the server is done with it before the request leaves.
        let (established, server_sock) = server.join().unwrap();
        assert_eq!(
            established.received_end, 0,
            "nothing of the handshake is left"
        );
        assert!(established.early.is_empty());
        std::io::Write::write_all(&mut conn.writer(), b"GET / HTTP/1.0\r\n\r\n").unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        let mut records = established.records;
        let mut received = established.received.to_vec();
        let mut end = established.received_end;
        let want = HEADER + 18 + 1 + TAG;
        while end < want {
            end += (&server_sock).read(&mut received[end..]).unwrap();
        }
        assert_eq!(
            opened(&mut records, &mut received[..end]),
            b"GET / HTTP/1.0\r\n\r\n"
        );
    }

    #[test]
    fn records_cross_both_ways_after_the_session_tickets() {
        let (mut client, mut server) = pair();
        let mut two = sealed(&mut client, b"hello, ");
        two.extend(sealed(&mut client, b"server"));
        assert_eq!(opened(&mut server, &mut two), b"hello, server");
        let mut back = sealed(&mut server, &[7; MAX_PLAINTEXT]);
        assert_eq!(opened(&mut client, &mut back), vec![7; MAX_PLAINTEXT]);
    }

    #[test]
    fn a_record_not_yet_whole_waits_and_close_notify_ends_the_stream() {
        let (mut client, mut server) = pair();
        let mut record = sealed(&mut client, b"in two reads");
        let mut pieces = Vec::new();
        let partial = server.open(&mut record[..9], &mut pieces).unwrap();
        assert_eq!((partial.consumed, pieces.len()), (0, 0));
        assert_eq!(opened(&mut server, &mut record), b"in two reads");

        let mut end = vec![0; 64];
        let n = client.close_notify(&mut end).unwrap();
        end.truncate(n);
        end.extend(sealed(&mut client, b"after the end"));
        let found = server.open(&mut end, &mut pieces).unwrap();
        assert!(found.close_notify);
        assert_eq!(found.consumed, n, "nothing after close_notify is read");
    }

    #[test]
    fn key_updates_change_keys_on_both_sides_in_step() {
        let (mut client, mut server) = pair();
        // The client's key is worn: its KeyUpdate goes first, then records under the new key.
        let mut buf = vec![0; 64];
        let n = client.due(&mut buf, u64::MAX).unwrap();
        assert!(n > 0);
        buf.truncate(n);
        buf.extend(sealed(&mut client, b"new key"));
        assert_eq!(opened(&mut server, &mut buf), b"new key");
        assert!(!server.key_update_owed, "update_not_requested");

        // A KeyUpdate asking for one back: the server owes its own before its next record.
        let mut ask = vec![0; 64];
        let n = client
            .seal_message(&mut ask, HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 1])
            .unwrap();
        ask.truncate(n);
        client.tx = Direction::new(client.kernel.next_tx().unwrap(), true).unwrap();
        assert_eq!(opened(&mut server, &mut ask), b"");
        let mut answer = vec![0; 64];
        let n = server.due(&mut answer, 1).unwrap();
        assert!(
            n > 0 && server.due(&mut answer, 1).unwrap() == 0,
            "owed once"
        );
        answer.truncate(n);
        answer.extend(sealed(&mut server, b"both new"));
        assert_eq!(opened(&mut client, &mut answer), b"both new");
        let mut more = sealed(&mut client, b"still fine");
        assert_eq!(opened(&mut server, &mut more), b"still fine");
    }

    #[test]
    fn broken_records_are_refused_with_the_right_alert() {
        let (mut client, mut server) = pair();
        let mut tampered = sealed(&mut client, b"payload");
        tampered[HEADER + 2] ^= 1;
        assert_eq!(
            refusal(&mut server, &mut tampered),
            AlertDescription::BadRecordMac
        );

        let (mut client, mut server) = pair();
        let mut typed = sealed(&mut client, b"payload");
        typed[0] = HANDSHAKE;
        assert_eq!(
            refusal(&mut server, &mut typed),
            AlertDescription::UnexpectedMessage
        );

        let mut huge = vec![APPLICATION_DATA, 3, 3, 0x41, 0x01];
        huge.resize(HEADER + 0x4101, 0);
        assert_eq!(
            refusal(&mut server, &mut huge),
            AlertDescription::RecordOverflow
        );
        let mut tiny = vec![APPLICATION_DATA, 3, 3, 0, 16];
        tiny.resize(HEADER + 16, 0);
        assert_eq!(
            refusal(&mut server, &mut tiny),
            AlertDescription::DecodeError
        );

        // All padding, no content type.
        let (mut client, mut server) = pair();
        let mut buf = vec![0; HEADER + 4 + 1 + TAG];
        let n = client.seal(&mut buf, 4, 0).unwrap();
        assert_eq!(
            refusal(&mut server, &mut buf[..n]),
            AlertDescription::UnexpectedMessage
        );
    }

    #[test]
    fn other_alerts_end_the_connection_with_their_name() {
        let (mut client, mut server) = pair();
        let mut buf = vec![0; 64];
        let n = client
            .alert(&mut buf, AlertDescription::HandshakeFailure)
            .unwrap();
        let e = server.open(&mut buf[..n], &mut Vec::new()).unwrap_err();
        assert!(format!("{e}").contains("HandshakeFailure"), "{e}");
    }
}
