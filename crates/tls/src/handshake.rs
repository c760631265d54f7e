//! The TLS handshake of one connection (rustls, blocking, with a deadline), after which the
//! connection's secrets move to tunneld's own record layer (`records.rs`): what a relay
//! (`relay.rs`), a record stream (`stream.rs`) and a WireGuard-over-TLS bridge
//! (`datagrams.rs`) start from.

use super::records::{
    self, Kernel, Records, Suite, ALERT, APPLICATION_DATA, HANDSHAKE, HEADER, MAX_PLAINTEXT, TAG,
};
use anyhow::bail;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::crypto::CryptoProvider;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, InsufficientSizeError, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::{AlertDescription, InvalidMessage, NamedGroup, PeerMisbehaved, ServerConfig};
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// Bytes read from the plaintext side at once, and held for it at most.
///
/// 1 MiB: with four bulk streams on two cores a 256 KiB buffer was filled by most reads
/// (206 KiB on average, measured), and each read that frees receive window sends a window
/// update whose handling (the sender's next burst, this socket's receive) runs in the
/// reader's system call. 1 MiB measured 10.47 Gbit per proxy CPU-second against 8.97 with
/// 256 KiB and 10.03 with 512 KiB (docs/benchmarks.md, 2026-11-27). The buffers are
/// allocated zeroed, and each new connection pays for that whole: once a first one is
/// freed, glibc serves the next from its heap, not as untouched pages (a loop of zeroed
/// 1 MiB allocations measured about 37 µs each here).
pub const CHUNK: usize = 1024 * 1024;
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
// Made once per connection and moved once, into `handshake_for_records`: not worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Unbuffered {
    Client(UnbufferedClientConnection),
    /// A bare rustls server connection, for tests (without a [`ServerWatch`], rustls's
    /// alerts are sent as rustls chose them).
    #[cfg(test)]
    Server(UnbufferedServerConnection, Option<Arc<ServerWatch>>),
    /// A listener's server connection, made by [`Unbuffered::server`]: its rustls connection
    /// is made once the first ClientHello is in, with the config chosen for it
    /// ([`ListenerConfig::for_hello`]).
    Listener(Arc<ListenerConfig>),
}

impl Unbuffered {
    /// A server connection of `config` that answers as RFC 8446 and OpenSSL do where rustls
    /// answers otherwise (see [`Screen`] and [`ListenerConfig::for_hello`]).
    pub fn server(config: &Arc<ListenerConfig>) -> Unbuffered {
        Unbuffered::Listener(config.clone())
    }
}

/// A server connection of `config` with a [`ServerWatch`]: a copy of the config for this
/// connection alone (sharing the certificate, the session cache and everything else) whose
/// key log and certificate resolver report to the watch.
fn watched(
    config: &Arc<ServerConfig>,
) -> Result<(UnbufferedServerConnection, Arc<ServerWatch>), rustls::Error> {
    let watch = Arc::new(ServerWatch::default());
    let mut config = ServerConfig::clone(config);
    config.key_log = watch.clone();
    config.cert_resolver = Arc::new(SchemeCheck {
        inner: config.cert_resolver.clone(),
        watch: watch.clone(),
    });
    Ok((UnbufferedServerConnection::new(Arc::new(config))?, watch))
}

/// A listener's rustls configs: one that offers every key exchange group of its provider,
/// and for each of those groups a copy that offers it alone (sharing the certificate, the
/// session cache and the ticketer), from which [`ListenerConfig::for_hello`] picks.
#[derive(Debug)]
pub struct ListenerConfig {
    all: Arc<ServerConfig>,
    alone: Vec<(NamedGroup, Arc<ServerConfig>)>,
}

impl ListenerConfig {
    /// The configs `make` gives for the listener's provider (`all` of them) and for each of
    /// its groups alone. `make` builds a config on the provider it is given, the rest as the
    /// listener asks.
    pub fn new<E>(
        provider: Arc<CryptoProvider>,
        make: impl Fn(Arc<CryptoProvider>) -> Result<ServerConfig, E>,
    ) -> Result<ListenerConfig, E> {
        let all = make(provider.clone())?;
        let mut alone = Vec::new();
        for &group in &provider.kx_groups {
            let mut one = make(Arc::new(CryptoProvider {
                kx_groups: vec![group],
                ..CryptoProvider::clone(&provider)
            }))?;
            one.cert_resolver = all.cert_resolver.clone();
            one.session_storage = all.session_storage.clone();
            one.ticketer = all.ticketer.clone();
            one.cert_compression_cache = all.cert_compression_cache.clone();
            alone.push((group.name(), Arc::new(one)));
        }
        Ok(ListenerConfig {
            all: Arc::new(all),
            alone,
        })
    }

    /// `config` alone, for tests that handshake with a rustls config of their own.
    #[cfg(test)]
    pub(crate) fn only(config: ServerConfig) -> Arc<ListenerConfig> {
        Arc::new(ListenerConfig {
            all: Arc::new(config),
            alone: Vec::new(),
        })
    }

    /// The config a connection handshakes with, given its first ClientHello (in each case
    /// a config offering one group, so that rustls, which would take the first group of the
    /// client's supported_groups it offers, takes the one chosen here):
    ///
    /// - the client sent a key share for a group the listener offers: that group (of
    ///   several, the listener's preferred: X25519MLKEM768 before X25519). OpenSSL, too,
    ///   uses a share it was sent, and it saves a round trip;
    /// - none: the listener's preferred group of the client's supported_groups, asked for
    ///   with a HelloRetryRequest, as OpenSSL chooses (its order, not the client's), except
    ///   the post-quantum hybrids, which are used when their share was sent and never asked
    ///   for: every client that implements one sends its 1.2 KB share in its first flight
    ///   (rustls, OpenSSL 3.5, the browsers), and OpenSSL 3.0, the reference tlsfuzzer
    ///   runs against, does not have them (`no-unknown-groups` lists X25519MLKEM768 among
    ///   groups no server should ask for);
    /// - no group to ask for: a config whose group the client did not list, which rustls
    ///   refuses with handshake_failure, as OpenSSL does.
    ///
    /// A ClientHello that is not a whole TLS 1.3 one with supported_groups gets the config
    /// offering every group, and rustls's answer.
    fn for_hello(&self, hello: FirstHello) -> &Arc<ServerConfig> {
        let FirstHello::Whole(hello) = hello else {
            return &self.all;
        };
        if !hello.supported_groups {
            return &self.all;
        }
        let listed = |group: &NamedGroup| hello.groups.contains(&u16::from(*group));
        let shared = |group: &NamedGroup| hello.shares.contains(&u16::from(*group));
        let pick = |wanted: &dyn Fn(&NamedGroup) -> bool| {
            self.alone
                .iter()
                .find(|(group, _)| wanted(group))
                .map(|(_, config)| config)
        };
        pick(&shared)
            .or_else(|| pick(&|group| listed(group) && !is_hybrid(*group)))
            .or_else(|| pick(&|group| !listed(group)))
            .unwrap_or(&self.all)
    }
}

/// What rustls tells one server connection's handshake through the hooks it has (a key log
/// and a certificate resolver):
///
/// - the key the server writes with while it waits for the client's second flight: its
///   first application traffic secret (RFC 8446 7.1: a server sends its Finished under its
///   handshake key and switches at once), as rustls hands it to a key log (the only way it
///   gives it out). Kept in memory only, zeroed when dropped, never printed; used to seal
///   one alert under it ([`records::handshake_alert`]);
/// - that the client offered no signature scheme the certificate's key can make in TLS 1.3
///   ([`SchemeCheck`]).
#[derive(Default)]
pub struct ServerWatch {
    secret: Mutex<Option<Zeroizing<Vec<u8>>>>,
    no_scheme: AtomicBool,
}

impl std::fmt::Debug for ServerWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerWatch(..)")
    }
}

/// rustls's name for the secret kept.
const SERVER_SECRET: &str = "SERVER_TRAFFIC_SECRET_0";

impl rustls::KeyLog for ServerWatch {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if label == SERVER_SECRET {
            *self.secret.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Zeroizing::new(secret.to_vec()));
        }
    }

    fn will_log(&self, label: &str) -> bool {
        label == SERVER_SECRET
    }
}

impl ServerWatch {
    /// `alert` sealed under the secret as the first record: rustls's server sends nothing
    /// under it before the client's Finished (no data before the handshake ends here).
    fn alert(&self, suite: Suite, alert: AlertDescription) -> Option<Vec<u8>> {
        let secret = self.secret.lock().unwrap_or_else(|p| p.into_inner());
        records::handshake_alert(suite, secret.as_ref()?, 0, alert).ok()
    }
}

/// The certificate resolver of a connection made by [`Unbuffered::server`]: the config's
/// own, which declines (and tells the watch) when the certificate's key can make none of
/// the signature schemes the client offers for TLS 1.3. rustls would otherwise choose the
/// scheme only when it signs, after its ServerHello, and refuse there (handshake_failure);
/// OpenSSL refuses at the ClientHello, before any ServerHello, and so does tunneld now (the
/// driver answers the decline with handshake_failure, see [`refusal_of`]).
#[derive(Debug)]
struct SchemeCheck {
    inner: Arc<dyn rustls::server::ResolvesServerCert>,
    watch: Arc<ServerWatch>,
}

impl rustls::server::ResolvesServerCert for SchemeCheck {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        // RFC 8446 4.2.3: no PKCS#1 v1.5 and no SHA-1 signatures in TLS 1.3.
        use rustls::SignatureScheme as S;
        let tls13: Vec<S> = hello
            .signature_schemes()
            .iter()
            .copied()
            .filter(|s| {
                !matches!(
                    s,
                    S::RSA_PKCS1_SHA1
                        | S::RSA_PKCS1_SHA256
                        | S::RSA_PKCS1_SHA384
                        | S::RSA_PKCS1_SHA512
                        | S::ECDSA_SHA1_Legacy
                )
            })
            .collect();
        let key = self.inner.resolve(hello)?;
        if key.key.choose_scheme(&tls13).is_none() {
            self.watch.no_scheme.store(true, Ordering::Relaxed);
            return None;
        }
        Some(key)
    }
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
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let start = Start {
        deadline,
        received_end: 0,
    };
    let (driven, secrets, kernel) = match conn {
        Unbuffered::Client(mut conn) => {
            let driven = drive_handshake(&mut *conn, None, sock, &mut received, start, &mut early)?;
            let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
            (driven, secrets, Kernel::Client(kernel))
        }
        #[cfg(test)]
        Unbuffered::Server(mut conn, secret) => {
            let driven = drive_handshake(
                &mut *conn,
                secret.as_deref(),
                sock,
                &mut received,
                start,
                &mut early,
            )?;
            let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
            (driven, secrets, Kernel::Server(kernel))
        }
        Unbuffered::Listener(config) => {
            let received_end = read_first_hello(sock, &mut received, deadline)?;
            let config = config.for_hello(first_hello(&received[..received_end]));
            let (mut conn, watch) = watched(config)?;
            let start = Start {
                deadline,
                received_end,
            };
            let driven = drive_handshake(
                &mut *conn,
                Some(&watch),
                sock,
                &mut received,
                start,
                &mut early,
            )?;
            let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
            (driven, secrets, Kernel::Server(kernel))
        }
    };
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
    let mut records = Records::new(secrets, kernel, use_ring)?;
    if driven.owe_ticket {
        records.owe_ticket();
    }
    Ok(Established {
        records,
        received,
        received_end: driven.received_end,
        early,
        peer_closed: driven.peer_closed,
    })
}

/// What [`drive_handshake`] leaves for the record layer.
struct Driven {
    /// How many bytes at the front of the receive buffer are past the handshake (the start
    /// of the records that follow).
    received_end: usize,
    /// The other side's close_notify has already come.
    peer_closed: bool,
    /// A server whose client offered no psk_dhe_ke, to which rustls sent no session ticket:
    /// the record layer sends one (`Records::owe_ticket`), as OpenSSL does.
    owe_ticket: bool,
}

/// A post-quantum group (a hybrid with ML-KEM, or ML-KEM alone).
fn is_hybrid(group: NamedGroup) -> bool {
    matches!(
        group,
        NamedGroup::X25519MLKEM768
            | NamedGroup::secp256r1MLKEM768
            | NamedGroup::MLKEM512
            | NamedGroup::MLKEM768
            | NamedGroup::MLKEM1024
    )
}

/// Where [`drive_handshake`] starts: its deadline, and how many bytes are already in the
/// receive buffer (read by [`read_first_hello`]).
struct Start {
    deadline: Instant,
    received_end: usize,
}

/// Drives rustls's unbuffered state machine until the handshake is over and nothing is
/// left to send. `secret`: a server's [`ServerWatch`].
fn drive_handshake<C: Process>(
    conn: &mut C,
    secret: Option<&ServerWatch>,
    sock: &TcpStream,
    received: &mut [u8],
    start: Start,
    early: &mut Vec<u8>,
) -> anyhow::Result<Driven> {
    let Start {
        deadline,
        mut received_end,
    } = start;
    let mut sock = sock;
    // rustls sees `received[..offered]`: whole records, one more each time it asks for more,
    // so that what the other side sent after its last handshake message (with it, in one
    // read) stays raw for the record layer and its alerts, rather than reaching rustls.
    let mut offered = 0;
    let mut outgoing = vec![0; 4096];
    let mut outgoing_end = 0;
    let mut screen = Screen {
        server: conn.is_server(),
        ..Screen::default()
    };
    // The start of the last record offered, while rustls has neither used nor discarded it
    // and it may be early data rustls is skipping (see `skipped`).
    let mut unanswered: Option<usize> = None;
    // The start of the last record offered (rustls decrypts in place: after an error there,
    // what it held is readable; see `refusal_of`).
    let mut last_offer = 0;
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
                // An error rustls answers otherwise than RFC 8446 and OpenSSL: ours goes
                // instead, under the key we write with once our flight is encrypted.
                let last = received.get(last_offer..offered).unwrap_or(&[]);
                let ours = match (refusal_of(&e, last, secret, &screen, conn.suite()), secret) {
                    (Some((alert, false)), _) => Some(vec![ALERT, 3, 3, 0, 2, 2, u8::from(alert)]),
                    (Some((alert, true)), Some(watch)) => {
                        conn.suite().and_then(|suite| watch.alert(suite, alert))
                    }
                    _ => None,
                };
                received.copy_within(discard..offered, 0);
                offered -= discard;
                match ours {
                    Some(record) => send_alert(sock, &record, received),
                    None => send_queued_alert(conn, sock, received, offered),
                }
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
            last_offer = last_offer.saturating_sub(discard);
            received.copy_within(discard..received_end, 0);
            received_end -= discard;
            offered -= discard;
        }
        if done || peer_closed {
            // Closed in the handshake: a probe. After it: a request sent with the client's
            // last handshake message, already complete.
            if peer_closed && conn.handshaking() {
                return Err(ClosedEarly.into());
            }
            return Ok(Driven {
                received_end,
                peer_closed,
                owe_ticket: screen.server && !screen.psk_dhe,
            });
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
                if !refusal.sealed {
                    refuse(sock, refusal.alert, received);
                    bail!("TLS: {} (sent {:?})", refusal.why, refusal.alert);
                }
                // Without our key (a connection not made by `Unbuffered::server`)
                // the record goes to rustls, which refuses it with its own alert.
                if let Some(record) = sealed_alert(conn, secret, refusal.alert) {
                    send_alert(sock, &record, received);
                    bail!("TLS: {} (sent {:?})", refusal.why, refusal.alert);
                }
            }
            // Only once this side has sent its encrypted flight: rustls skips early data
            // from then on, until the client's first handshake message under its key.
            unanswered = (screen.sent_encrypted
                && maybe_skipped(&received[offered..offered + next]))
            .then_some(offered);
            last_offer = offered;
            offered += next;
        }
    }
}

/// Reads until `received` holds the client's first handshake message whole, with the
/// records it spans, or shows that it is not a ClientHello [`first_hello`] can read; returns
/// the bytes read. What comes next is left to [`drive_handshake`], which reads on from
/// there (and meets the same end of stream or error, if one ended this).
fn read_first_hello(
    sock: &TcpStream,
    received: &mut [u8],
    deadline: Instant,
) -> anyhow::Result<usize> {
    let mut sock = sock;
    let mut end = 0;
    // Bounded: each turn reads at least a byte into a buffer of fixed size, or ends.
    while matches!(first_hello(&received[..end]), FirstHello::More) && end < received.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer within {HANDSHAKE_TIMEOUT:?}");
        }
        sock.set_read_timeout(Some(left))?;
        match sock.read(&mut received[end..]) {
            Ok(0) => break,
            Ok(n) => end += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    Ok(end)
}

/// What the start of a connection's bytes holds.
#[derive(Debug, PartialEq)]
enum FirstHello {
    /// The start of a ClientHello in plaintext handshake records: more is needed.
    More,
    /// A whole TLS 1.3 ClientHello, read.
    Whole(ClientHello),
    /// Anything else: a ClientHello that does not parse or offers no TLS 1.3, another
    /// message or record type, a record over 2^14 bytes, a message over
    /// [`MAX_HANDSHAKE_MESSAGE`]. The screen and rustls answer it as before.
    Not,
}

/// Reads the client's first handshake message from the records at the start of `bytes`.
fn first_hello(mut bytes: &[u8]) -> FirstHello {
    let mut message = Vec::new();
    loop {
        if let [kind, a, b, c, ..] = message[..] {
            let len = u32::from_be_bytes([0, a, b, c]) as usize;
            if kind != CLIENT_HELLO || len > MAX_HANDSHAKE_MESSAGE {
                return FirstHello::Not;
            }
            if let Some(body) = message.get(4..4 + len) {
                return match ClientHello::read(body) {
                    Some(hello) if hello.tls13 => FirstHello::Whole(hello),
                    _ => FirstHello::Not,
                };
            }
        }
        let Some(header) = bytes.get(..HEADER) else {
            return FirstHello::More;
        };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if header[0] != HANDSHAKE || len == 0 || len > MAX_PLAINTEXT {
            return FirstHello::Not;
        }
        let Some(body) = bytes.get(HEADER..HEADER + len) else {
            return FirstHello::More;
        };
        message.extend_from_slice(body);
        bytes = &bytes[HEADER + len..];
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
    /// The alert goes encrypted (this side has sent its encrypted flight).
    sealed: bool,
}

/// The checks tunneld makes on each record of the handshake before offering it to rustls,
/// where rustls 0.23 would refuse the record without an alert, or with another one than
/// RFC 8446 (and OpenSSL) gives:
///
/// - a record of another type between the fragments of a plaintext handshake message
///   (rustls: `MessageInterleavedWithHandshakeMessage`, no alert; section 5.1:
///   unexpected_message);
/// - a plaintext record over 2^14 bytes (rustls takes up to 2^14 + 2048, the limit of a
///   protected record; section 5.1: record_overflow);
/// - a TLS 1.3 ClientHello with supported_groups but no key_share, or the other way round
///   (rustls: handshake_failure; section 9.2: missing_extension);
/// - a plaintext handshake record once this side's records are encrypted (rustls tries to
///   open it: bad_record_mac; OpenSSL: unexpected_message, as for any message the state
///   does not expect, section 6).
///
/// The first three go out in plaintext (this side has sent nothing encrypted yet); the
/// last under the key this side then writes with ([`ServerWatch`]). A server's screen also
/// notes whether the client offered psk_dhe_ke (see [`Driven::owe_ticket`]).
#[derive(Debug, Default)]
struct Screen {
    /// The screen of a server (which reads ClientHellos).
    server: bool,
    /// A record of type application data (an encrypted one) has gone out.
    sent_encrypted: bool,
    /// The plaintext handshake message in progress: its header bytes seen so far (while
    /// fewer than 4) and the body bytes still to come.
    header: Vec<u8>,
    body_left: usize,
    /// The body of a ClientHello in progress, gathered to be read when whole.
    hello: Option<Vec<u8>>,
    /// The (last) ClientHello offered psk_dhe_ke.
    psk_dhe: bool,
}

/// Handshake message types the screen reads.
const CLIENT_HELLO: u8 = 1;
/// rustls's limit for the body of a handshake message (a private constant of its deframer;
/// no setting reaches it). OpenSSL takes a ClientHello of up to 131 396 bytes. Over this
/// limit the screen answers illegal_parameter, the alert OpenSSL gives a ClientHello over its
/// own limit, where rustls would close without an alert (docs/reliability.md, "Expected
/// differences").
const MAX_HANDSHAKE_MESSAGE: usize = 0xffff;

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
            if header[0] == HANDSHAKE {
                return Err(Refusal {
                    alert: AlertDescription::UnexpectedMessage,
                    why: "a plaintext handshake record after encryption started",
                    sealed: true,
                });
            }
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
                sealed: false,
            });
        }
        if len > MAX_PLAINTEXT {
            return Err(Refusal {
                alert: AlertDescription::RecordOverflow,
                why: "a plaintext record over 2^14 bytes",
                sealed: false,
            });
        }
        let mut body = record.get(HEADER..).unwrap_or(&[]);
        while !body.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(body.len());
                self.body_left -= n;
                if let Some(hello) = &mut self.hello {
                    hello.extend_from_slice(&body[..n]);
                }
                body = &body[n..];
                if self.body_left == 0 {
                    self.hello_done()?;
                }
            } else {
                self.header.push(body[0]);
                body = &body[1..];
                if let &[kind, a, b, c] = self.header.as_slice() {
                    self.body_left = u32::from_be_bytes([0, a, b, c]) as usize;
                    self.header.clear();
                    if self.server && self.body_left > MAX_HANDSHAKE_MESSAGE {
                        return Err(Refusal {
                            alert: AlertDescription::IllegalParameter,
                            why: "a handshake message over 65 535 bytes",
                            sealed: false,
                        });
                    }
                    self.hello = (self.server && kind == CLIENT_HELLO)
                        .then(|| Vec::with_capacity(self.body_left));
                    if self.body_left == 0 {
                        self.hello_done()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads a ClientHello just made whole, if one was gathered.
    fn hello_done(&mut self) -> Result<(), Refusal> {
        let Some(body) = self.hello.take() else {
            return Ok(());
        };
        // One rustls refuses as malformed is left to it.
        let Some(hello) = ClientHello::read(&body) else {
            return Ok(());
        };
        self.psk_dhe = hello.psk_dhe;
        if hello.legacy_version < 0x0301 {
            return Err(Refusal {
                alert: AlertDescription::ProtocolVersion,
                why: "a ClientHello whose legacy_version is below TLS 1.0",
                sealed: false,
            });
        }
        if !hello.tls13 {
            return Ok(());
        }
        if hello.key_share != hello.supported_groups {
            return Err(Refusal {
                alert: AlertDescription::MissingExtension,
                why: "a ClientHello with only one of supported_groups and key_share",
                sealed: false,
            });
        }
        if hello.share_outside_groups {
            return Err(Refusal {
                alert: AlertDescription::IllegalParameter,
                why: "a ClientHello with a key share of a group it does not list",
                sealed: false,
            });
        }
        Ok(())
    }
}

/// What the screen reads of a ClientHello (RFC 8446 4.1.2): which of its extensions are
/// there.
#[derive(Debug, Default, PartialEq)]
struct ClientHello {
    legacy_version: u16,
    /// supported_versions offers TLS 1.3.
    tls13: bool,
    key_share: bool,
    supported_groups: bool,
    /// psk_key_exchange_modes offers psk_dhe_ke.
    psk_dhe: bool,
    /// key_share has an entry for a group supported_groups does not list (RFC 8446 4.2.8:
    /// a server may refuse it with illegal_parameter; OpenSSL does).
    share_outside_groups: bool,
    /// The groups of key_share's entries, in the client's order.
    shares: Vec<u16>,
    /// supported_groups, in the client's order.
    groups: Vec<u16>,
}

/// Big-endian fields off the front of a slice.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (field, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(field)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    /// A vector with a one- or two-byte length.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

impl ClientHello {
    /// The extensions of a ClientHello's body; `None` when it does not parse.
    fn read(body: &[u8]) -> Option<ClientHello> {
        let mut f = Fields(body);
        let mut hello = ClientHello {
            legacy_version: f.u16()? as u16,
            ..ClientHello::default()
        };
        f.take(32)?; // random
        f.vec8()?; // legacy_session_id
        f.vec16()?; // cipher_suites
        f.vec8()?; // legacy_compression_methods
        if f.0.is_empty() {
            return Some(hello); // no extensions at all: no TLS 1.3
        }
        let mut extensions = Fields(f.vec16()?);
        let (mut groups, mut shares): (&[u8], Vec<&[u8]>) = (&[], Vec::new());
        while !extensions.0.is_empty() {
            let kind = extensions.u16()?;
            let data = extensions.vec16()?;
            match kind {
                SUPPORTED_VERSIONS => {
                    let versions = Fields(data).vec8()?;
                    hello.tls13 = versions.chunks_exact(2).any(|v| v == [3, 4]);
                }
                KEY_SHARE => {
                    hello.key_share = true;
                    let mut entries = Fields(Fields(data).vec16()?);
                    while !entries.0.is_empty() {
                        let group = entries.take(2)?;
                        shares.push(group);
                        hello.shares.push(u16::from_be_bytes([group[0], group[1]]));
                        entries.vec16()?;
                    }
                }
                SUPPORTED_GROUPS => {
                    hello.supported_groups = true;
                    groups = Fields(data).vec16()?;
                    hello.groups = groups
                        .chunks_exact(2)
                        .map(|g| u16::from_be_bytes([g[0], g[1]]))
                        .collect();
                }
                PSK_KEY_EXCHANGE_MODES => {
                    hello.psk_dhe = Fields(data).vec8()?.contains(&PSK_DHE_KE);
                }
                _ => {}
            }
        }
        hello.share_outside_groups = hello.supported_groups
            && shares
                .iter()
                .any(|share| !groups.chunks_exact(2).any(|g| g == *share));
        Some(hello)
    }
}

/// Extension types (RFC 8446 4.2) and the psk_dhe_ke mode.
const SUPPORTED_GROUPS: usize = 10;
const SUPPORTED_VERSIONS: usize = 43;
const PSK_KEY_EXCHANGE_MODES: usize = 45;
const KEY_SHARE: usize = 51;
const PSK_DHE_KE: u8 = 1;

/// The alert RFC 8446 and OpenSSL give where rustls, refusing the handshake with `e`,
/// gives another or none; and whether it goes sealed (under the key this side writes with,
/// once its flight is encrypted) rather than in plaintext. `last` is the last record rustls
/// was offered, decrypted in place if rustls opened it. `None`: rustls's own answer stands.
///
/// - The client offered no signature scheme the certificate's key can make in TLS 1.3
///   ([`SchemeCheck`] declined): handshake_failure (rustls: access_denied, for any
///   resolver that declines), before any ServerHello, as from OpenSSL.
/// - A record with no content type under the client's handshake key (rustls:
///   `IllegalTlsInnerPlaintext`, no alert; RFC 8446 5.4: unexpected_message).
/// - An empty alert record under that key (rustls: decode_error; section 5.1:
///   unexpected_message, as for any zero-length alert fragment).
/// - A Finished whose length is not the hash's (rustls compares it with the expected
///   verify_data and answers decrypt_error; OpenSSL: decode_error, a malformed message,
///   section 6.2).
fn refusal_of(
    e: &rustls::Error,
    last: &[u8],
    watch: Option<&ServerWatch>,
    screen: &Screen,
    suite: Option<Suite>,
) -> Option<(AlertDescription, bool)> {
    if !screen.sent_encrypted {
        let declined = watch.is_some_and(|w| w.no_scheme.load(Ordering::Relaxed));
        return (declined && matches!(e, rustls::Error::General(_)))
            .then_some((AlertDescription::HandshakeFailure, false));
    }
    match e {
        rustls::Error::PeerMisbehaved(PeerMisbehaved::IllegalTlsInnerPlaintext)
        | rustls::Error::InvalidMessage(InvalidMessage::MissingData("AlertLevel")) => {
            Some((AlertDescription::UnexpectedMessage, true))
        }
        rustls::Error::DecryptError => {
            let hash_len = suite?.hash_len();
            let len = finished_length(last)?;
            (len != hash_len).then_some((AlertDescription::DecodeError, true))
        }
        _ => None,
    }
}

/// The handshake message type of a Finished.
const FINISHED: u8 = 20;

/// The length a Finished in `record` (a protected record rustls has opened in place: inner
/// plaintext, then its tag) gives its verify_data; `None` when the record holds no
/// handshake record's plaintext (it did not open: a failed open leaves zeros) or no
/// Finished.
fn finished_length(record: &[u8]) -> Option<usize> {
    let inner = opened_part(record);
    let end = inner.iter().rposition(|&b| b != 0)?;
    if inner[end] != HANDSHAKE {
        return None;
    }
    let mut messages = &inner[..end];
    while let [kind, a, b, c, rest @ ..] = messages {
        let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        if *kind == FINISHED {
            return Some(len);
        }
        messages = rest.get(len..)?;
    }
    None
}

/// `alert` sealed as this server's next record while it waits for the client's second
/// flight: `None` without the secret (or a suite known).
fn sealed_alert<C: Process>(
    conn: &C,
    secret: Option<&ServerWatch>,
    alert: AlertDescription,
) -> Option<Vec<u8>> {
    secret?.alert(conn.suite()?, alert)
}

/// Sends an alert record (best effort), then closes as [`send_queued_alert`] does.
fn send_alert(sock: &TcpStream, record: &[u8], buf: &mut [u8]) {
    let mut sock = sock;
    let _ = sock.write_all(record);
    close_after_alert(sock, buf);
}

/// Sends a fatal alert in plaintext (best effort), then closes as [`send_queued_alert`] does.
fn refuse(sock: &TcpStream, alert: AlertDescription, buf: &mut [u8]) {
    send_alert(sock, &[ALERT, 3, 3, 0, 2, 2, u8::from(alert)], buf);
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
    /// The cipher suite chosen, once it is.
    fn suite(&self) -> Option<Suite>;
    fn is_server(&self) -> bool;
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
    fn suite(&self) -> Option<Suite> {
        Suite::of(self.negotiated_cipher_suite()?.suite())
    }
    fn is_server(&self) -> bool {
        false
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
    fn suite(&self) -> Option<Suite> {
        Suite::of(self.negotiated_cipher_suite()?.suite())
    }
    fn is_server(&self) -> bool {
        true
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
            let conn = Unbuffered::server(&ListenerConfig::only(server_config()));
            match handshake_for_records(conn, &sock, true) {
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

    /// The group of the key share in a server's answer (a ServerHello or a
    /// HelloRetryRequest, which share a layout), and whether it was a HelloRetryRequest.
    fn answered_group(answer: &[u8]) -> (u16, bool) {
        const HRR_RANDOM: [u8; 8] = [0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11];
        assert_eq!(answer[0], HANDSHAKE, "{answer:?}");
        let mut f = Fields(&answer[HEADER + 4..]);
        f.take(2).unwrap();
        let retry = f.take(32).unwrap()[..8] == HRR_RANDOM;
        f.vec8().unwrap();
        f.take(3).unwrap();
        let mut extensions = Fields(f.vec16().unwrap());
        while !extensions.0.is_empty() {
            let kind = extensions.u16().unwrap();
            let data = extensions.vec16().unwrap();
            if kind == KEY_SHARE {
                return (u16::from_be_bytes([data[0], data[1]]), retry);
            }
        }
        panic!("no key_share in {answer:?}");
    }

    /// A listener's config on tunneld's provider, its certificate made in memory.
    fn listener_config() -> Arc<ListenerConfig> {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let config = ListenerConfig::new(crate::provider(), |provider| {
            rustls::ServerConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key.clone_key())
        });
        Arc::new(config.unwrap())
    }

    /// Sends a ClientHello to a listener and half-closes; returns the group its answer
    /// names and whether it asked for another share, or the bytes of an answer that is not
    /// a handshake record.
    fn group_answered(hello: &[u8]) -> Result<(u16, bool), Vec<u8>> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config = listener_config();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let _ = handshake_for_records(Unbuffered::server(&config), &sock, true);
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.write_all(hello).unwrap();
        sock.shutdown(std::net::Shutdown::Write).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = Vec::new();
        sock.read_to_end(&mut answer).unwrap();
        server.join().unwrap();
        if answer.first() != Some(&HANDSHAKE) {
            return Err(answer);
        }
        Ok(answered_group(&answer))
    }

    /// The first ClientHello is read from whole records only: every cut of one (in two
    /// records) is `More`, the whole is read, and another record type, an oversized record or
    /// a message that is not a ClientHello is `Not`; no input panics.
    #[test]
    fn the_first_hello_is_read_from_whole_records() {
        let hello = client_hello();
        let message = &hello[HEADER..];
        let (a, b) = message.split_at(message.len() / 3);
        let mut records = Vec::new();
        for piece in [a, b] {
            records.extend_from_slice(&[HANDSHAKE, 3, 1]);
            records.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            records.extend_from_slice(piece);
        }
        for end in 0..records.len() {
            assert_eq!(
                first_hello(&records[..end]),
                FirstHello::More,
                "cut at {end}"
            );
        }
        let FirstHello::Whole(read) = first_hello(&records) else {
            panic!("not read");
        };
        assert_eq!(read.shares, [0x11ec, 0x001d]);
        let mut other = records.clone();
        other[0] = APPLICATION_DATA;
        assert_eq!(first_hello(&other), FirstHello::Not);
        let mut oversized = records.clone();
        oversized[3..5].copy_from_slice(&[0x40, 0x01]);
        assert_eq!(first_hello(&oversized), FirstHello::Not);
        let mut not_hello = records.clone();
        not_hello[HEADER] = 2;
        assert_eq!(first_hello(&not_hello), FirstHello::Not);
        // Any byte changed anywhere: an answer, never a panic.
        for i in 0..records.len() {
            let mut bent = records.clone();
            bent[i] ^= 0xa5;
            let _ = first_hello(&bent);
        }
    }

    /// A listener uses a key share the client sent for a group it offers, as OpenSSL does,
    /// even when the client lists another group first (rustls alone would ask for that
    /// one); of two such shares, the listener's preferred (X25519MLKEM768). Without one, it
    /// asks for its own preferred group of the client's list, as OpenSSL does.
    #[test]
    fn a_listener_uses_a_key_share_the_client_sent() {
        // rustls's client sends shares for X25519MLKEM768 (0x11ec) and X25519 (0x001d).
        let hello = client_hello();
        let groups = |list: &[u16]| {
            let mut data = ((list.len() * 2) as u16).to_be_bytes().to_vec();
            list.iter()
                .for_each(|g| data.extend_from_slice(&g.to_be_bytes()));
            edit_extension(&hello, SUPPORTED_GROUPS as u16, Some(&data))
        };
        let p256_first = groups(&[0x0017, 0x001d, 0x11ec]);
        assert_eq!(group_answered(&p256_first), Ok((0x11ec, false)));
        assert_eq!(group_answered(&hello), Ok((0x11ec, false)));
        // Only the X25519 share: X25519, whatever the list's order.
        let mut share = Vec::new();
        let key = rustls::crypto::aws_lc_rs::kx_group::X25519.start().unwrap();
        share.extend_from_slice(&0x001du16.to_be_bytes());
        share.extend_from_slice(&(key.pub_key().len() as u16).to_be_bytes());
        share.extend_from_slice(key.pub_key());
        let mut data = (share.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&share);
        let only_x25519 = edit_extension(&p256_first, KEY_SHARE as u16, Some(&data));
        assert_eq!(group_answered(&only_x25519), Ok((0x001d, false)));
        // No share for a group it offers: a HelloRetryRequest for its preferred group of
        // the client's list (X25519 before P-256, whatever the client's order), never for
        // X25519MLKEM768; with nothing else listed, handshake_failure.
        let mut data = 36u16.to_be_bytes().to_vec();
        data.extend_from_slice(&[0x0a, 0x0a, 0, 32]); // a GREASE group
        data.extend_from_slice(&[7; 32]);
        let unknown_share = |list: &[u16]| {
            let listed = groups(&[&[0x0a0a], list].concat());
            edit_extension(&listed, KEY_SHARE as u16, Some(&data))
        };
        let answer = group_answered(&unknown_share(&[0x0017, 0x001d, 0x11ec]));
        assert_eq!(answer, Ok((0x001d, true)));
        let answer = group_answered(&unknown_share(&[0x11ec, 0x0018, 0x0017]));
        assert_eq!(answer, Ok((0x0017, true)));
        let answer = group_answered(&unknown_share(&[0x11ec]));
        assert_eq!(answer, Err(vec![ALERT, 3, 3, 0, 2, 2, 40]));
    }

    /// tlsfuzzer's `tolerance 32715 methods` and its three twins in `signature-algorithms`: a
    /// ClientHello over 64 KiB (in records of 2^14 bytes) gets illegal_parameter in plaintext
    /// as soon as its header names the length, as OpenSSL answers one over its own limit;
    /// rustls alone closed without an alert. One of the largest rustls takes (body 0xfffe or
    /// 0xffff bytes, by the parity of the rest) is answered with a ServerHello.
    #[test]
    fn a_client_hello_over_64_kib_gets_illegal_parameter() {
        let hello = client_hello();
        // `schemes` signature schemes: P-256 ECDSA (the test certificate's), then unknown ones.
        let with_schemes = |schemes: usize| {
            let mut list = vec![0x04, 0x03];
            list.extend(std::iter::repeat_n([0xfe, 0xfe], schemes - 1).flatten());
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            // edit_extension's record length wraps; the message after it is whole.
            let message = edit_extension(&hello, 13, Some(&data))[HEADER..].to_vec();
            let mut records = Vec::new();
            for piece in message.chunks(MAX_PLAINTEXT) {
                records.extend_from_slice(&[HANDSHAKE, 3, 1]);
                records.extend_from_slice(&(piece.len() as u16).to_be_bytes());
                records.extend_from_slice(piece);
            }
            (message.len() - 4, records)
        };
        let (body_one, _) = with_schemes(1);
        let largest = (MAX_HANDSHAKE_MESSAGE - body_one) / 2 + 1;
        let (body, records) = with_schemes(largest);
        assert!(body == 0xffff || body == 0xfffe, "{body}");
        assert_eq!(group_answered(&records), Ok((0x11ec, false)));
        let (body, records) = with_schemes(largest + 1);
        assert!(body > 0xffff, "{body}");
        let (error, answer) = server_answer(&records);
        assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 47], "{error}");
        assert!(error.contains("over 65 535 bytes"), "{error}");
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
            let _ = handshake_for_records(Unbuffered::Server(conn, None), &sock, true);
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
            let tls13 = provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some());
            for suite in tls13.copied().collect::<Vec<_>>() {
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
                        handshake_for_records(Unbuffered::Server(conn, None), &sock, true)
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

    /// A server config and a client config that trusts its certificate; the client logs
    /// its secrets into `log` and, like tlsfuzzer's, offers no psk_key_exchange_modes unless
    /// `resumption`.
    fn trusting_pair(
        log: Arc<Secrets>,
        resumption: bool,
    ) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let mut server = rustls::ServerConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        server.enable_secret_extraction = true;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut client = rustls::ClientConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.key_log = log;
        client.enable_secret_extraction = true;
        if !resumption {
            client.resumption = rustls::client::Resumption::disabled();
        }
        (Arc::new(server), Arc::new(client))
    }

    /// The secrets a client logs, by label.
    #[derive(Debug, Default)]
    struct Secrets(Mutex<Vec<(String, Vec<u8>)>>);

    impl rustls::KeyLog for Secrets {
        fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
            self.0.lock().unwrap().push((label.into(), secret.to_vec()));
        }
    }

    impl Secrets {
        fn get(&self, label: &str) -> Vec<u8> {
            let log = self.0.lock().unwrap();
            log.iter().find(|(l, _)| l == label).unwrap().1.clone()
        }
    }

    /// A rustls client handshakes with a listener's server (`Unbuffered::server`) up to the
    /// server's Finished; then, instead of the client's Finished, what `second` makes of
    /// the suite and the client's handshake traffic secret goes. Returns the server's error
    /// and its answer opened under the server's key (what a client reads there).
    fn second_flight_answer(
        second: impl FnOnce(Suite, &[u8]) -> Vec<u8>,
    ) -> (String, Result<Vec<u8>, AlertDescription>) {
        let log = Arc::new(Secrets::default());
        let (server_config, client_config) = trusting_pair(log.clone(), false);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn =
                Unbuffered::server(&ListenerConfig::only(ServerConfig::clone(&server_config)));
            match handshake_for_records(conn, &sock, true) {
                Ok(_) => "no error".to_string(),
                Err(e) => format!("{e:#}"),
            }
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(client_config, name).unwrap();
        client.write_tls(&mut sock).unwrap();
        while client.is_handshaking() {
            assert!(client.read_tls(&mut sock).unwrap() > 0, "the server closed");
            client.process_new_packets().unwrap();
        }
        // The client's own second flight (its Finished) is dropped.
        client.write_tls(&mut Vec::new()).unwrap();
        let suite = Suite::of(client.negotiated_cipher_suite().unwrap().suite()).unwrap();
        let client_secret = log.get("CLIENT_HANDSHAKE_TRAFFIC_SECRET");
        sock.write_all(&second(suite, &client_secret)).unwrap();
        let mut answer = Vec::new();
        // Ends at the server's FIN: a reset or a timeout fails the test.
        sock.read_to_end(&mut answer).unwrap();
        let mut records = Records::from_secrets(
            suite,
            true,
            &client_secret,
            &log.get("SERVER_TRAFFIC_SECRET_0"),
            false,
        )
        .unwrap();
        let mut plaintext = Vec::new();
        let opened = match records.open(&mut answer, &mut plaintext) {
            Ok(_) => Ok(answer),
            Err(records::RecordError::Alert(alert)) => Err(alert),
            Err(e) => panic!("the server's answer: {e}"),
        };
        (server.join().unwrap(), opened)
    }

    /// `inner` (a TLSInnerPlaintext) sealed under the client's handshake key, as its first
    /// record.
    fn under_client_handshake_key(suite: Suite, secret: &[u8], inner: &[u8]) -> Vec<u8> {
        let mut records = Records::from_secrets(suite, true, secret, secret, false).unwrap();
        let mut buf = vec![0; HEADER + inner.len() + TAG];
        buf[HEADER..HEADER + inner.len()].copy_from_slice(inner);
        let n = records.seal_inner(&mut buf, inner.len()).unwrap();
        buf.truncate(n);
        buf
    }

    /// tlsfuzzer's `zero content type during handshake` (and `... with padding`): a record
    /// under the client's handshake key whose inner plaintext is all zeros, which rustls
    /// refuses with no alert, gets unexpected_message under the server's key.
    #[test]
    fn a_record_with_no_content_type_in_the_handshake_gets_unexpected_message() {
        for inner in [&[0u8][..], &[0; 10]] {
            let (error, answer) = second_flight_answer(|suite, secret| {
                under_client_handshake_key(suite, secret, inner)
            });
            assert_eq!(answer, Err(AlertDescription::UnexpectedMessage), "{error}");
        }
    }

    /// tlsfuzzer's `empty alert ... using handshake keys`: an alert record with no alert in
    /// it (padding or not) under the client's handshake key, which rustls answers with
    /// decode_error, gets unexpected_message (RFC 8446 5.1), as from OpenSSL.
    #[test]
    fn an_empty_alert_in_the_handshake_gets_unexpected_message() {
        for padding in [0, 2, 5, 30] {
            let mut inner = vec![ALERT];
            inner.resize(1 + padding, 0);
            let (error, answer) = second_flight_answer(|suite, secret| {
                under_client_handshake_key(suite, secret, &inner)
            });
            assert_eq!(answer, Err(AlertDescription::UnexpectedMessage), "{error}");
        }
    }

    /// tlsfuzzer's `Unencrypted Finished message`: a plaintext handshake record once the
    /// server's flight is encrypted, which rustls tries to open (bad_record_mac), gets
    /// unexpected_message under the server's key.
    #[test]
    fn a_plaintext_finished_gets_unexpected_message() {
        let (error, answer) = second_flight_answer(|suite, _| {
            let mut record = vec![HANDSHAKE, 3, 3];
            let len = 4 + suite.hash_len();
            record.extend_from_slice(&(len as u16).to_be_bytes());
            record.extend_from_slice(&[20, 0, 0, suite.hash_len() as u8]);
            record.resize(HEADER + len, 0);
            record
        });
        assert_eq!(answer, Err(AlertDescription::UnexpectedMessage), "{error}");
        assert!(error.contains("plaintext handshake record"), "{error}");
    }

    /// `hello` (a ClientHello record) without the extension of type `kind`.
    fn without_extension(hello: &[u8], kind: u16) -> Vec<u8> {
        edit_extension(hello, kind, None)
    }

    /// `hello` (a ClientHello record) with the extension of type `kind` holding `data`
    /// instead (`None`: left out).
    fn edit_extension(hello: &[u8], kind: u16, data: Option<&[u8]>) -> Vec<u8> {
        let body = &hello[HEADER + 4..];
        let mut f = Fields(body);
        f.take(2 + 32).unwrap();
        f.vec8().unwrap();
        f.vec16().unwrap();
        f.vec8().unwrap();
        let before = body.len() - f.0.len();
        let mut extensions = Fields(f.vec16().unwrap());
        let mut kept = Vec::new();
        while !extensions.0.is_empty() {
            let start = extensions.0;
            let t = extensions.u16().unwrap();
            extensions.vec16().unwrap();
            if t != usize::from(kind) {
                kept.extend_from_slice(&start[..start.len() - extensions.0.len()]);
            } else if let Some(data) = data {
                kept.extend_from_slice(&kind.to_be_bytes());
                kept.extend_from_slice(&(data.len() as u16).to_be_bytes());
                kept.extend_from_slice(data);
            }
        }
        let mut out = body[..before].to_vec();
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        out.extend_from_slice(&kept);
        let mut message = vec![CLIENT_HELLO];
        message.extend_from_slice(&(out.len() as u32).to_be_bytes()[1..]);
        message.extend_from_slice(&out);
        let mut record = vec![HANDSHAKE, 3, 1];
        record.extend_from_slice(&(message.len() as u16).to_be_bytes());
        record.extend_from_slice(&message);
        record
    }

    /// tlsfuzzer's `legacy-version`: a ClientHello whose legacy_version is below TLS 1.0
    /// (SSL 3.0 or nonsense), TLS 1.3 in supported_versions, is protocol_version (RFC 8446
    /// D.5 for SSL 3.0; OpenSSL for all), in plaintext.
    #[test]
    fn a_client_hello_below_tls_1_0_gets_protocol_version() {
        for version in [[3, 0], [1, 3], [0, 2]] {
            let mut hello = client_hello();
            hello[HEADER + 4..HEADER + 6].copy_from_slice(&version);
            let (error, answer) = server_answer(&hello);
            assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 70], "{error}");
        }
    }

    /// tlsfuzzer's `obsolete-curves` (inconsistent extensions): a key share of a group that
    /// supported_groups does not list is illegal_parameter (RFC 8446 4.2.8, as OpenSSL;
    /// rustls ignored the share and asked for another), in plaintext.
    #[test]
    fn a_key_share_outside_supported_groups_gets_illegal_parameter() {
        // secp384r1 only; rustls's shares are X25519MLKEM768 and X25519.
        let hello = edit_extension(
            &client_hello(),
            SUPPORTED_GROUPS as u16,
            Some(&[0, 2, 0, 24]),
        );
        let (error, answer) = server_answer(&hello);
        assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 47], "{error}");
    }

    /// tlsfuzzer's signature scheme scripts (`pkcs-signature`, `rsa-signatures`, ...): a
    /// client offering no scheme the key can make in TLS 1.3 gets handshake_failure in
    /// plaintext, before any ServerHello (rustls: after it). The test certificate's key is
    /// ECDSA P-256; the client offers RSA-PSS and PKCS#1 with SHA-256, and then also ECDSA
    /// P-256 with SHA-1, which TLS 1.3 does not allow.
    #[test]
    fn a_client_with_no_usable_signature_scheme_gets_handshake_failure() {
        for schemes in [&[0, 4, 8, 4, 4, 1][..], &[0, 2, 2, 3]] {
            let hello = edit_extension(&client_hello(), 13, Some(schemes));
            let (error, answer) = server_answer(&hello);
            assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 40], "{error}");
        }
        // ECDSA P-256 with SHA-256: a ServerHello.
        let hello = edit_extension(&client_hello(), 13, Some(&[0, 2, 4, 3]));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn = Unbuffered::server(&ListenerConfig::only(server_config()));
            // Fails when the client goes away after the ServerHello.
            let _ = handshake_for_records(conn, &sock, true);
        });
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.write_all(&hello).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut first = [0; 1];
        sock.read_exact(&mut first).unwrap();
        assert_eq!(first[0], HANDSHAKE, "no ServerHello");
        drop(sock);
        server.join().unwrap();
    }

    /// tlsfuzzer's `finished` (padding and truncation): a Finished whose verify_data is not
    /// the hash's length is decode_error (rustls: decrypt_error, as for a wrong one of the
    /// right length, which stays decrypt_error).
    #[test]
    fn a_finished_of_the_wrong_length_gets_decode_error() {
        for (extra, alert) in [
            (1, AlertDescription::DecodeError),
            (-1, AlertDescription::DecodeError),
            (0, AlertDescription::DecryptError),
        ] {
            let (error, answer) = second_flight_answer(|suite, secret| {
                let len = suite.hash_len().checked_add_signed(extra).unwrap();
                let mut inner = vec![FINISHED, 0, 0, len as u8];
                inner.resize(4 + len, 0x55);
                inner.push(HANDSHAKE);
                under_client_handshake_key(suite, secret, &inner)
            });
            assert_eq!(answer, Err(alert), "{error}");
        }
    }

    /// What the screen reads of a rustls client's ClientHello.
    #[test]
    fn a_client_hello_is_read() {
        let hello = client_hello();
        let read = ClientHello::read(&hello[HEADER + 4..]).unwrap();
        let all = ClientHello {
            legacy_version: 0x0303,
            share_outside_groups: false,
            tls13: true,
            key_share: true,
            supported_groups: true,
            psk_dhe: true,
            shares: read.shares.clone(),
            groups: read.groups.clone(),
        };
        assert_eq!(read, all);
        // rustls's client sends shares for X25519MLKEM768 and X25519.
        assert_eq!(read.shares, [0x11ec, 0x001d]);
        let no_modes = without_extension(&hello, PSK_KEY_EXCHANGE_MODES as u16);
        let read = ClientHello::read(&no_modes[HEADER + 4..]).unwrap();
        assert!(!read.psk_dhe);
        // Any cut of it is refused or read, never a panic.
        for end in 0..hello.len() - HEADER - 4 {
            let _ = ClientHello::read(&hello[HEADER + 4..HEADER + 4 + end]);
        }
    }

    /// tlsfuzzer's `key_share extension omitted`: a TLS 1.3 ClientHello with
    /// supported_groups but no key_share is missing_extension (RFC 8446 9.2; rustls:
    /// handshake_failure), in plaintext; and the other way round.
    #[test]
    fn a_client_hello_without_key_share_gets_missing_extension() {
        for kind in [KEY_SHARE, SUPPORTED_GROUPS] {
            let hello = without_extension(&client_hello(), kind as u16);
            let (error, answer) = server_answer(&hello);
            assert_eq!(answer, [ALERT, 3, 3, 0, 2, 2, 109], "{error}");
            assert!(error.contains("supported_groups and key_share"), "{error}");
        }
    }

    /// Counts the TLS 1.3 tickets a client takes.
    #[derive(Debug, Default)]
    struct Tickets(std::sync::atomic::AtomicUsize);

    impl rustls::client::ClientSessionStore for Tickets {
        fn set_kx_hint(&self, _: rustls::pki_types::ServerName<'static>, _: rustls::NamedGroup) {}
        fn kx_hint(&self, _: &rustls::pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
            None
        }
        fn set_tls12_session(
            &self,
            _: rustls::pki_types::ServerName<'static>,
            _: rustls::client::Tls12ClientSessionValue,
        ) {
        }
        fn tls12_session(
            &self,
            _: &rustls::pki_types::ServerName<'_>,
        ) -> Option<rustls::client::Tls12ClientSessionValue> {
            None
        }
        fn remove_tls12_session(&self, _: &rustls::pki_types::ServerName<'static>) {}
        fn insert_tls13_ticket(
            &self,
            _: rustls::pki_types::ServerName<'static>,
            _: rustls::client::Tls13ClientSessionValue,
        ) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn take_tls13_ticket(
            &self,
            _: &rustls::pki_types::ServerName<'static>,
        ) -> Option<rustls::client::Tls13ClientSessionValue> {
            None
        }
    }

    /// tlsfuzzer's `connection-abort` (`After NewSessionTicket`) waits for a ticket, which
    /// rustls sends only to a client that offers psk_dhe_ke (every rustls client does:
    /// tlsfuzzer's does not, see `a_client_hello_is_read` for how that is told). Such a
    /// client is owed none by the record layer; the ticket it owes otherwise
    /// (`Records::owe_ticket`) goes first and a rustls client takes it as a ticket, after
    /// rustls's two.
    #[test]
    fn an_owed_ticket_is_a_ticket_to_a_rustls_client() {
        let tickets = Arc::new(Tickets::default());
        let (server_config, client_config) = trusting_pair(Arc::default(), true);
        let mut client_config = rustls::ClientConfig::clone(&client_config);
        client_config.resumption = rustls::client::Resumption::store(tickets.clone());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn =
                Unbuffered::server(&ListenerConfig::only(ServerConfig::clone(&server_config)));
            let mut established = handshake_for_records(conn, &sock, true).unwrap();
            let mut buf = vec![0; 4096];
            assert_eq!(
                established.records.due(&mut buf, 1).unwrap(),
                0,
                "none owed"
            );
            established.records.owe_ticket();
            let n = established.records.due(&mut buf, 1).unwrap();
            assert!(n > 0, "a ticket owed");
            (&sock).write_all(&buf[..n]).unwrap();
            // Open until the client has read everything.
            let _ = (&sock).read(&mut buf);
        });
        let sock = TcpStream::connect(addr).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = UnbufferedClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut client = handshake_for_records(Unbuffered::Client(conn), &sock, true).unwrap();
        let mut got = client.received[..client.received_end].to_vec();
        let mut sock = &sock;
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut plaintext = Vec::new();
        while tickets.0.load(std::sync::atomic::Ordering::SeqCst) < 3 && Instant::now() < deadline {
            let mut more = [0; 4096];
            if let Ok(n) = sock.read(&mut more) {
                got.extend_from_slice(&more[..n]);
            }
            let opened = client.records.open(&mut got, &mut plaintext).unwrap();
            got.drain(..opened.consumed);
        }
        assert_eq!(tickets.0.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(plaintext.is_empty(), "tickets, no data");
        drop(sock.shutdown(std::net::Shutdown::Both));
        server.join().unwrap();
    }
}
