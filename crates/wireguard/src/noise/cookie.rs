//! WireGuard's cookies (section 5.4.7 of the WireGuard paper): under load a responder answers a
//! handshake message that lacks a valid mac2 with a cookie reply instead of doing any
//! Diffie-Hellman. The cookie is a MAC of the sender's address, so a sender must own the
//! address it claims before it can make the responder work.

use super::handshake::{ct_eq, mac, HandshakeError, LocalIdentity, PeerIdentity};
use crate::wire::{self, cookie_reply, CookieReply, Handshake, COOKIE_REPLY_LEN, MSG_COOKIE_REPLY};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{Key, KeyInit as _, Tag, XChaCha20Poly1305, XNonce};
use rand_core::{CryptoRng, RngCore};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// How long the responder's cookie secret lives (the protocol's two minutes).
const SECRET_LIFETIME: Duration = Duration::from_secs(120);

/// Cookie reply fields (`wire` has the layout); the cookie's tag follows the cookie.
use cookie_reply::{COOKIE, NONCE, RECEIVER};
const TAG: usize = COOKIE + 16;

/// The responder's cookie secret, one per interface: every worker's [`CookieJar`] holds a
/// clone, so a cookie one worker gives out is honoured by all of them (an initiation may be
/// answered by another worker than the one that sent the cookie reply, and a handed-off one
/// is checked again by its owner). Nothing in it changes after it is made, so workers share
/// it without a lock: the secret of each two-minute epoch is derived from a random master
/// key, `MAC(master, epoch)`, and the epochs count from the first use, which all workers
/// see alike (a `OnceLock`). Like the kernel's secret, which is replaced by a fresh random
/// one at most every two minutes, a cookie is worth nothing in the next epoch.
#[derive(Clone)]
pub struct CookieSecret {
    inner: Arc<SecretInner>,
}

struct SecretInner {
    master: Zeroizing<[u8; 32]>,
    /// The start of epoch 0, set by the first use, since `new` has no `now`.
    base: OnceLock<Instant>,
}

impl CookieSecret {
    pub fn new(rng: &mut (impl RngCore + CryptoRng + ?Sized)) -> Self {
        let mut master = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(&mut *master);
        CookieSecret {
            inner: Arc::new(SecretInner {
                master,
                base: OnceLock::new(),
            }),
        }
    }

    /// The epoch `now` is in.
    fn epoch(&self, now: Instant) -> u64 {
        let base = *self.inner.base.get_or_init(|| now);
        now.saturating_duration_since(base).as_secs() / SECRET_LIFETIME.as_secs()
    }

    /// The secret of `epoch`.
    fn derive(&self, epoch: u64) -> Zeroizing<[u8; 32]> {
        let mut secret = Zeroizing::new([0u8; 32]);
        let (low, high) = secret.split_at_mut(16);
        low.copy_from_slice(&mac(
            &self.inner.master,
            &[b"cookie 0", &epoch.to_le_bytes()],
        ));
        high.copy_from_slice(&mac(
            &self.inner.master,
            &[b"cookie 1", &epoch.to_le_bytes()],
        ));
        secret
    }
}

impl fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CookieSecret")
            .field("base", &self.inner.base.get())
            .finish_non_exhaustive()
    }
}

/// The responder's side of cookies: cookies are made from the interface's [`CookieSecret`],
/// renewed every two minutes. Time comes in as `now`.
pub struct CookieJar {
    secret: CookieSecret,
    /// The current epoch's secret, derived once per epoch.
    current: Option<(u64, Zeroizing<[u8; 32]>)>,
}

impl CookieJar {
    /// A jar with a secret of its own.
    pub fn new(rng: &mut (impl RngCore + CryptoRng + ?Sized)) -> Self {
        Self::shared(CookieSecret::new(rng))
    }

    /// A jar over a secret other jars (other workers) share.
    pub fn shared(secret: CookieSecret) -> Self {
        Self {
            secret,
            current: None,
        }
    }

    /// Whether `msg`, an initiation or a response, carries a mac2 made with the cookie we
    /// would give `source` now. Check mac1 first ([`LocalIdentity::verify_mac1`]): mac2 only
    /// says that the sender owns its address.
    pub fn mac2_valid<'a>(
        &mut self,
        msg: impl Into<Handshake<'a>>,
        source: SocketAddr,
        now: Instant,
    ) -> bool {
        let msg = msg.into();
        let cookie = self.cookie(source, now);
        ct_eq(&mac(&cookie, &[msg.before_mac2()]), msg.mac2())
    }

    /// Writes into `out` the cookie reply to `msg`, an initiation or a response sent to us
    /// (`local`) from `source`. Refuses messages whose mac1 is not ours, so that only someone
    /// who knows our public key can make us send replies. `rng` gives the reply's nonce.
    pub fn write_reply<'a>(
        &mut self,
        local: &LocalIdentity,
        msg: impl Into<Handshake<'a>>,
        source: SocketAddr,
        now: Instant,
        rng: &mut (impl RngCore + CryptoRng + ?Sized),
        out: &mut [u8; COOKIE_REPLY_LEN],
    ) -> Result<(), HandshakeError> {
        let msg = msg.into();
        if !local.verify_mac1(msg) {
            return Err(HandshakeError::BadMac1);
        }
        let mac1 = msg.mac1();
        let cookie = self.cookie(source, now);

        wire::write_header(MSG_COOKIE_REPLY, out);
        // The reply names the handshake message's sender.
        out[RECEIVER..NONCE].copy_from_slice(&msg.sender().to_le_bytes());
        rng.fill_bytes(&mut out[NONCE..COOKIE]);
        let nonce = XNonce::clone_from_slice(&out[NONCE..COOKIE]);
        out[COOKIE..TAG].copy_from_slice(&cookie);
        // XChaCha20-Poly1305 refuses only plaintexts of more than 256 GiB; this is 16 bytes.
        #[allow(clippy::expect_used)]
        let tag = XChaCha20Poly1305::new(Key::from_slice(local.cookie_key()))
            .encrypt_in_place_detached(&nonce, mac1, &mut out[COOKIE..TAG])
            .expect("a cookie is 16 bytes");
        out[TAG..].copy_from_slice(&tag);
        Ok(())
    }

    /// The cookie for `source`: MAC(secret, IP address ‖ port), under this two-minute
    /// epoch's secret.
    fn cookie(&mut self, source: SocketAddr, now: Instant) -> [u8; 16] {
        let epoch = self.secret.epoch(now);
        let secret = match &self.current {
            Some((e, secret)) if *e == epoch => secret,
            _ => &self.current.insert((epoch, self.secret.derive(epoch))).1,
        };
        let port = source.port().to_be_bytes();
        // An IPv4 peer seen through a dual-stack socket as ::ffff:a.b.c.d gets the same cookie
        // as when seen as a.b.c.d.
        match source.ip().to_canonical() {
            IpAddr::V4(ip) => mac(secret, &[&ip.octets(), &port]),
            IpAddr::V6(ip) => mac(secret, &[&ip.octets(), &port]),
        }
    }
}

impl fmt::Debug for CookieJar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CookieJar")
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

/// Opens a cookie reply from `peer` to our last handshake message to it, whose mac1 was
/// `last_mac1`. Returns the cookie, to make mac2 with for the next 120 seconds. The caller
/// checks that the reply's receiver index is that message's sender index.
pub fn consume_cookie_reply(
    peer: &PeerIdentity,
    last_mac1: &[u8; 16],
    msg: CookieReply<'_>,
) -> Result<[u8; 16], HandshakeError> {
    let (sealed, tag) = msg.encrypted_cookie().split_at(16);
    let mut cookie = [0u8; 16];
    cookie.copy_from_slice(sealed);
    XChaCha20Poly1305::new(Key::from_slice(peer.cookie_key()))
        .decrypt_in_place_detached(
            XNonce::from_slice(msg.nonce()),
            last_mac1,
            &mut cookie,
            Tag::from_slice(tag),
        )
        .map_err(|_| HandshakeError::Decryption)?;
    Ok(cookie)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::handshake::tests::{
        boringtun, consume_initiation, consume_response, handshake, initiate_now, keys, to_network,
        Refused,
    };
    use crate::noise::handshake::{create_response, InitiationState};
    use crate::wire::{ParseError, INITIATION_LEN, MSG_INITIATION, RESPONSE_LEN};
    use boringtun::noise::rate_limiter::RateLimiter;
    use boringtun::noise::TunnResult;
    use rand_core::OsRng;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::sync::Arc;

    struct Side {
        local: LocalIdentity,
        peer: PeerIdentity,
    }

    /// `a` initiates to `b`.
    fn sides() -> (Side, Side) {
        let (ka, kb) = (keys(), keys());
        let (la, lb) = (
            LocalIdentity::new(ka.private),
            LocalIdentity::new(kb.private),
        );
        let b_at_a = PeerIdentity::new(&la, kb.public).unwrap();
        let a_at_b = PeerIdentity::new(&lb, ka.public).unwrap();
        (
            Side {
                local: la,
                peer: b_at_a,
            },
            Side {
                local: lb,
                peer: a_at_b,
            },
        )
    }

    /// `super::consume_cookie_reply` of a reply given as bytes, parsed first as the device does.
    fn consume_cookie_reply(
        peer: &PeerIdentity,
        last_mac1: &[u8; 16],
        msg: &[u8],
    ) -> Result<[u8; 16], Refused> {
        let msg = CookieReply::parse(msg).map_err(Refused::Parse)?;
        super::consume_cookie_reply(peer, last_mac1, msg).map_err(Refused::Handshake)
    }

    fn initiate(a: &Side, cookie: Option<&[u8; 16]>) -> (InitiationState, [u8; INITIATION_LEN]) {
        initiate_now(&a.local, &a.peer, &[0; 32], 0x0102_0304, cookie)
    }

    #[test]
    fn cookie_reply_round_trip_and_mac2_binds_the_source() {
        let (a, b) = sides();
        let mut jar = CookieJar::new(&mut OsRng);
        let now = Instant::now();
        let source: SocketAddr = (Ipv4Addr::new(192, 0, 2, 1), 51820).into();

        let (state, first) = initiate(&a, None);
        assert!(
            !jar.mac2_valid(handshake(&first).unwrap(), source, now),
            "no cookie yet"
        );

        let mut reply = [0u8; COOKIE_REPLY_LEN];
        jar.write_reply(
            &b.local,
            handshake(&first).unwrap(),
            source,
            now,
            &mut OsRng,
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply[..4], [3, 0, 0, 0]);
        assert_eq!(
            reply[4..8],
            first[4..8],
            "the reply names the initiator's index"
        );
        let cookie = consume_cookie_reply(&a.peer, &state.mac1(), &reply).unwrap();

        let (_, second) = initiate(&a, Some(&cookie));
        assert!(jar.mac2_valid(handshake(&second).unwrap(), source, now));
        // A mac2 does not stop the message from being an ordinary initiation.
        assert!(consume_initiation(&b.local, &second, |_| Some(&b.peer)).is_ok());

        // Another address or port, or a later secret, does not own this cookie.
        let other_ip: SocketAddr = (Ipv4Addr::new(192, 0, 2, 2), 51820).into();
        let other_port: SocketAddr = (Ipv4Addr::new(192, 0, 2, 1), 51821).into();
        assert!(!jar.mac2_valid(handshake(&second).unwrap(), other_ip, now));
        assert!(!jar.mac2_valid(handshake(&second).unwrap(), other_port, now));
        let mapped: SocketAddr = (Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped(), 51820).into();
        assert!(jar.mac2_valid(handshake(&second).unwrap(), mapped, now));
        let later = now + Duration::from_secs(119);
        assert!(jar.mac2_valid(handshake(&second).unwrap(), source, later));
        let renewed = now + Duration::from_secs(120);
        assert!(!jar.mac2_valid(handshake(&second).unwrap(), source, renewed));

        // The reply opens only for the message it answers and from the peer that sent it.
        assert_eq!(
            consume_cookie_reply(&a.peer, &[0; 16], &reply).unwrap_err(),
            HandshakeError::Decryption
        );
        assert_eq!(
            consume_cookie_reply(&b.peer, &state.mac1(), &reply).unwrap_err(),
            HandshakeError::Decryption
        );
        for i in 0..COOKIE_REPLY_LEN {
            let mut bad = reply;
            bad[i] ^= 0x04;
            let err = consume_cookie_reply(&a.peer, &state.mac1(), &bad);
            match i {
                0 => assert_eq!(
                    err,
                    Err(Refused::Parse(ParseError::WrongType {
                        expected: MSG_COOKIE_REPLY,
                        found: MSG_COOKIE_REPLY ^ 0x04
                    })),
                    "byte {i}"
                ),
                1..4 => assert_eq!(
                    err,
                    Err(Refused::Parse(ParseError::ReservedNotZero)),
                    "byte {i}"
                ),
                // The receiver index is for the caller to match; it is not sealed.
                4..8 => assert_eq!(err, Ok(cookie), "byte {i}"),
                _ => assert_eq!(
                    err,
                    Err(Refused::Handshake(HandshakeError::Decryption)),
                    "byte {i}"
                ),
            }
        }
    }

    #[test]
    fn cookie_reply_to_a_response_over_ipv6() {
        let (a, b) = sides();
        let mut jar = CookieJar::new(&mut OsRng);
        let now = Instant::now();
        let source: SocketAddr = (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7), 4242).into();

        // b answers a's initiation; a, under load, answers b's response with a cookie.
        let (state, initiation) = initiate(&a, None);
        let received = consume_initiation(&b.local, &initiation, |_| Some(&b.peer)).unwrap();
        let mut response = [0u8; RESPONSE_LEN];
        let (_, mac1) = create_response(
            &b.local,
            &b.peer,
            &received,
            &[0; 32],
            77,
            None,
            &mut OsRng,
            &mut response,
        )
        .unwrap();
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        jar.write_reply(
            &a.local,
            handshake(&response).unwrap(),
            source,
            now,
            &mut OsRng,
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply[4..8], 77u32.to_le_bytes());
        let cookie = consume_cookie_reply(&b.peer, &mac1, &reply).unwrap();

        let mut again = [0u8; RESPONSE_LEN];
        create_response(
            &b.local,
            &b.peer,
            &received,
            &[0; 32],
            78,
            Some(&cookie),
            &mut OsRng,
            &mut again,
        )
        .unwrap();
        assert!(jar.mac2_valid(handshake(&again).unwrap(), source, now));
        assert!(consume_response(&state, &a.local, &a.peer, &[0; 32], &again).is_ok());
    }

    #[test]
    fn malformed_messages_get_no_reply_and_never_panic() {
        let (a, b) = sides();
        let mut jar = CookieJar::new(&mut OsRng);
        let now = Instant::now();
        let source: SocketAddr = (Ipv4Addr::LOCALHOST, 1).into();
        let (_, good) = initiate(&a, None);
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        let mut long = good.to_vec();
        long.extend_from_slice(&good);
        for n in 0..long.len() {
            let msg = &long[..n];
            // Only a whole handshake message can be checked for mac2 or answered: the rest
            // (a response's length with an initiation's type too) does not parse as one.
            let wrong = |kind| match n {
                0..4 => ParseError::TooShort,
                _ => ParseError::WrongLength { kind, len: n },
            };
            if n != INITIATION_LEN {
                assert_eq!(handshake(msg), Err(wrong(MSG_INITIATION)), "length {n}");
            }
            let mut as_reply = msg.to_vec();
            if let Some(t) = as_reply.first_mut() {
                *t = MSG_COOKIE_REPLY;
            }
            if n != COOKIE_REPLY_LEN {
                assert_eq!(
                    consume_cookie_reply(&a.peer, &[0; 16], &as_reply),
                    Err(Refused::Parse(wrong(MSG_COOKIE_REPLY)))
                );
            }
        }
        // The whole initiation is answered by the one it is for, and by no one else.
        assert_eq!(
            jar.write_reply(
                &b.local,
                handshake(&good).unwrap(),
                source,
                now,
                &mut OsRng,
                &mut reply
            ),
            Ok(())
        );
        // An initiation meant for someone else gets no reply from us.
        assert_eq!(
            jar.write_reply(
                &a.local,
                handshake(&good).unwrap(),
                source,
                now,
                &mut OsRng,
                &mut reply
            ),
            Err(HandshakeError::BadMac1)
        );
    }

    /// boringtun, always under load (limit 0), answers our initiation with a cookie reply; we
    /// open it, and the initiation we then make with the cookie is answered.
    #[test]
    fn boringtun_under_load_sends_a_cookie_we_accept() {
        let ours = keys();
        let theirs = keys();
        let local = LocalIdentity::new(ours.private);
        let peer = PeerIdentity::new(&local, theirs.public).unwrap();
        let limiter = Arc::new(RateLimiter::new(
            &boringtun::x25519::PublicKey::from(theirs.public),
            0,
        ));
        let mut tunn = boringtun(&theirs, ours.public, None, Some(limiter));
        let mut buf = vec![0u8; 2048];
        let source = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 9));

        let (state, first) = initiate_now(&local, &peer, &[0; 32], 0x55, None);
        let reply = to_network(tunn.decapsulate(Some(source), &first, &mut buf));
        assert_eq!(reply.len(), COOKIE_REPLY_LEN);
        assert_eq!(reply[4..8], 0x55u32.to_le_bytes());
        let cookie = consume_cookie_reply(&peer, &state.mac1(), &reply).unwrap();

        let (state, second) = initiate_now(&local, &peer, &[0; 32], 0x56, Some(&cookie));
        let response = to_network(tunn.decapsulate(Some(source), &second, &mut buf));
        assert_eq!(response.len(), RESPONSE_LEN, "boringtun took our mac2");
        assert!(consume_response(&state, &local, &peer, &[0; 32], &response).is_ok());
    }

    /// The other way: our cookie reply is accepted by boringtun, whose next initiation then
    /// carries a mac2 our jar accepts.
    #[test]
    fn boringtun_accepts_our_cookie_reply() {
        let ours = keys();
        let theirs = keys();
        let local = LocalIdentity::new(ours.private);
        let mut tunn = boringtun(&theirs, ours.public, None, None);
        let mut buf = vec![0u8; 2048];
        let mut jar = CookieJar::new(&mut OsRng);
        let now = Instant::now();
        let source: SocketAddr = (Ipv4Addr::new(203, 0, 113, 5), 9999).into();

        let first = to_network(tunn.format_handshake_initiation(&mut buf, false));
        assert!(!jar.mac2_valid(handshake(&first).unwrap(), source, now));
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        jar.write_reply(
            &local,
            handshake(&first).unwrap(),
            source,
            now,
            &mut OsRng,
            &mut reply,
        )
        .unwrap();
        assert!(matches!(
            tunn.decapsulate(Some(source.ip()), &reply, &mut buf),
            TunnResult::Done
        ));

        let second = to_network(tunn.format_handshake_initiation(&mut buf, true));
        assert!(jar.mac2_valid(handshake(&second).unwrap(), source, now));
    }

    /// Workers share one secret: a cookie one jar gave out is honoured by every jar over the
    /// same secret, at any worker's `now` in the same epoch, and by no jar with a secret of
    /// its own.
    #[test]
    fn jars_over_one_secret_honour_each_others_cookies() {
        let (a, b) = sides();
        let secret = CookieSecret::new(&mut OsRng);
        let (mut giver, mut checker) =
            (CookieJar::shared(secret.clone()), CookieJar::shared(secret));
        let mut stranger = CookieJar::new(&mut OsRng);
        let now = Instant::now();
        let source: SocketAddr = (Ipv4Addr::new(192, 0, 2, 7), 40000).into();
        let (state, first) = initiate(&a, None);
        let mut reply = [0u8; COOKIE_REPLY_LEN];
        giver
            .write_reply(
                &b.local,
                handshake(&first).unwrap(),
                source,
                now,
                &mut OsRng,
                &mut reply,
            )
            .unwrap();
        let cookie = consume_cookie_reply(&a.peer, &state.mac1(), &reply).unwrap();
        let (_, second) = initiate(&a, Some(&cookie));
        let later = now + Duration::from_secs(5);
        assert!(checker.mac2_valid(handshake(&second).unwrap(), source, later));
        assert!(giver.mac2_valid(handshake(&second).unwrap(), source, later));
        assert!(!stranger.mac2_valid(handshake(&second).unwrap(), source, later));
        // The next epoch's secret is another one, at every jar.
        let next = now + SECRET_LIFETIME;
        assert!(!checker.mac2_valid(handshake(&second).unwrap(), source, next));
        assert!(!giver.mac2_valid(handshake(&second).unwrap(), source, next));
    }
}
