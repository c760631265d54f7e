//! WireGuard's handshake, Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s (section 5.4 of the WireGuard
//! paper), as pure functions: each takes the keys and the message and returns what the next
//! step needs. Timers, retries, replay of timestamps and index allocation belong to the caller.
//!
//! Every function that reads a datagram checks its length first and returns an error, never
//! panics. Secrets live in types that wipe themselves on drop and whose `Debug` hides them.

use blake2::digest::consts::U16;
use blake2::digest::{Digest, FixedOutput, KeyInit as _, Update as _};
use blake2::{Blake2s256, Blake2sMac};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use rand_core::{CryptoRng, RngCore};
use std::fmt;
use std::time::Duration;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

// The messages' layout is `wire`'s; these are here too because the handshake is their user.
use crate::wire::{self, initiation as init, response as resp, Handshake, MACS_LEN, TAG_LEN};
pub use crate::wire::{
    COOKIE_REPLY_LEN, INITIATION_LEN, MSG_COOKIE_REPLY, MSG_INITIATION, MSG_RESPONSE, RESPONSE_LEN,
};

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";

/// A 32-byte key or DH result, wiped when dropped.
type Secret = Zeroizing<[u8; 32]>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("handshake message's mac1 is not for our public key")]
    BadMac1,
    #[error("handshake message does not decrypt")]
    Decryption,
    #[error("handshake from a peer we do not know")]
    UnknownPeer,
    #[error("public key of low order")]
    LowOrderKey,
    #[error("handshake response to an index we did not send")]
    WrongIndex,
    /// The initiation is from a known peer whose handshakes another worker makes (this one
    /// keeps no static secret for it): that worker reads it in full.
    #[error("handshake with a peer whose session another worker carries")]
    NotCarriedHere,
}

/// Our static key pair and the keys derived from our public key that peers use towards us.
pub struct LocalIdentity {
    private: StaticSecret,
    public: [u8; 32],
    /// HASH("mac1----" ‖ our public): checks mac1 on the messages sent to us.
    mac1_key: [u8; 32],
    /// HASH("cookie--" ‖ our public): seals the cookie replies we send.
    cookie_key: [u8; 32],
    /// The transcript every initiation to us starts from.
    start: Transcript,
}

impl LocalIdentity {
    pub fn new(private: [u8; 32]) -> Self {
        let private = StaticSecret::from(private);
        let public = PublicKey::from(&private).to_bytes();
        Self {
            private,
            public,
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
            start: Transcript::start(&public),
        }
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// Whether `msg` carries a mac1 made for our public key. Costs one BLAKE2s, so the
    /// caller can drop junk before any Diffie-Hellman.
    pub fn verify_mac1<'a>(&self, msg: impl Into<Handshake<'a>>) -> bool {
        let msg = msg.into();
        ct_eq(&mac(&self.mac1_key, &[msg.before_mac1()]), msg.mac1())
    }

    pub(super) fn cookie_key(&self) -> &[u8; 32] {
        &self.cookie_key
    }
}

impl fmt::Debug for LocalIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalIdentity")
            .field("public", &Hex(&self.public))
            .finish_non_exhaustive()
    }
}

/// A peer's static public key, the keys derived from it, and the static-static
/// Diffie-Hellman, which never changes while neither key does.
pub struct PeerIdentity {
    public: [u8; 32],
    /// HASH("mac1----" ‖ its public): our messages to it carry mac1 under this key.
    mac1_key: [u8; 32],
    /// HASH("cookie--" ‖ its public): opens the cookie replies it sends us.
    cookie_key: [u8; 32],
    /// `None` where no handshake is made with the peer: a checking device, or a worker
    /// that does not carry its session.
    static_shared: Option<Secret>,
    /// The transcript every initiation to it starts from.
    start: Transcript,
}

impl PeerIdentity {
    /// Fails with `LowOrderKey` when `peer_public` is a point of small order, whose
    /// Diffie-Hellman with any key is zero: such a peer could authenticate as anyone.
    pub fn new(local: &LocalIdentity, peer_public: [u8; 32]) -> Result<Self, HandshakeError> {
        let static_shared = Some(dh(&local.private, &peer_public)?);
        Ok(Self {
            public: peer_public,
            mac1_key: hash(&[LABEL_MAC1, &peer_public]),
            cookie_key: hash(&[LABEL_COOKIE, &peer_public]),
            static_shared,
            start: Transcript::start(&peer_public),
        })
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// The identity of `peer_public` where no handshake is made with it (the bare mode's
    /// scratch device, or a worker that does not carry the peer's session): the same
    /// refusal of a low-order key as [`PeerIdentity::new`], told without the
    /// Diffie-Hellman, which is most of the cost of a `set` of many peers; it has no static
    /// secret, so an initiation from the peer is read only as far as its sender's key.
    pub fn without_static_secret(peer_public: [u8; 32]) -> Result<Self, HandshakeError> {
        if is_low_order(&peer_public) {
            return Err(HandshakeError::LowOrderKey);
        }
        Ok(Self {
            public: peer_public,
            mac1_key: hash(&[LABEL_MAC1, &peer_public]),
            cookie_key: hash(&[LABEL_COOKIE, &peer_public]),
            static_shared: None,
            start: Transcript::start(&peer_public),
        })
    }

    /// Whether handshakes can be made with the peer here (see `static_shared`).
    pub fn has_static_secret(&self) -> bool {
        self.static_shared.is_some()
    }

    pub(super) fn cookie_key(&self) -> &[u8; 32] {
        &self.cookie_key
    }
}

impl fmt::Debug for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerIdentity")
            .field("public", &Hex(&self.public))
            .finish_non_exhaustive()
    }
}

/// The two transport keys a handshake ends with.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct SessionKeys {
    pub sending: [u8; 32],
    pub receiving: [u8; 32],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(<secret>)")
    }
}

/// What the initiator keeps between sending an initiation and reading the response.
pub struct InitiationState {
    local_index: u32,
    peer_public: [u8; 32],
    ephemeral: StaticSecret,
    transcript: Transcript,
    mac1: [u8; 16],
}

impl InitiationState {
    /// The sender index the initiation carried: the response must name it.
    pub fn local_index(&self) -> u32 {
        self.local_index
    }

    /// The initiation's mac1: a cookie reply to it is sealed with this as associated data.
    pub fn mac1(&self) -> [u8; 16] {
        self.mac1
    }
}

impl fmt::Debug for InitiationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitiationState")
            .field("local_index", &self.local_index)
            .finish_non_exhaustive()
    }
}

/// Writes a handshake initiation to `peer` into `out`. `timestamp` is TAI64N ([`tai64n`]) and
/// must rise from one initiation to the next, or the peer takes it for a replay. `cookie` is
/// the last cookie the peer sent, if less than 120 seconds old.
#[allow(clippy::too_many_arguments)] // The protocol's inputs; bundling them would only rename them.
pub fn create_initiation(
    local: &LocalIdentity,
    peer: &PeerIdentity,
    psk: &[u8; 32],
    local_index: u32,
    timestamp: [u8; 12],
    cookie: Option<&[u8; 16]>,
    rng: &mut (impl RngCore + CryptoRng),
    out: &mut [u8; INITIATION_LEN],
) -> Result<InitiationState, HandshakeError> {
    // IKpsk2 mixes the preshared key only into the response.
    let _ = psk;
    let mut t = peer.start.clone();
    let ephemeral = StaticSecret::random_from_rng(&mut *rng);
    let ephemeral_public = PublicKey::from(&ephemeral).to_bytes();

    wire::write_header(MSG_INITIATION, out);
    out[init::SENDER..init::EPHEMERAL].copy_from_slice(&local_index.to_le_bytes());
    out[init::EPHEMERAL..init::STATIC].copy_from_slice(&ephemeral_public);
    t.mix_hash(&ephemeral_public);
    t.mix_key(&ephemeral_public);

    let static_shared = peer
        .static_shared
        .as_ref()
        .ok_or(HandshakeError::NotCarriedHere)?;
    let key = t.mix_key_with_key(&*dh(&ephemeral, &peer.public)?);
    t.encrypt(&key, &local.public, &mut out[init::STATIC..init::TIMESTAMP]);

    let key = t.mix_key_with_key(&**static_shared);
    t.encrypt(&key, &timestamp, &mut out[init::TIMESTAMP..init::MAC1]);

    let mac1 = write_macs(out, &peer.mac1_key, cookie);
    Ok(InitiationState {
        local_index,
        peer_public: peer.public,
        ephemeral,
        transcript: t,
        mac1,
    })
}

/// A handshake response, read and authenticated.
#[derive(Debug)]
pub struct Response {
    pub keys: SessionKeys,
    /// The responder's sender index: our data messages name it.
    pub peer_index: u32,
}

/// Reads the response to the initiation `state` was made for. `peer` and `psk` are the ones
/// the initiation was made with.
pub fn consume_response(
    state: &InitiationState,
    local: &LocalIdentity,
    peer: &PeerIdentity,
    psk: &[u8; 32],
    msg: wire::Response<'_>,
) -> Result<Response, HandshakeError> {
    if !local.verify_mac1(msg) {
        return Err(HandshakeError::BadMac1);
    }
    if msg.receiver() != state.local_index {
        return Err(HandshakeError::WrongIndex);
    }
    if !ct_eq(&state.peer_public, &peer.public) {
        return Err(HandshakeError::UnknownPeer);
    }
    let peer_ephemeral = msg.ephemeral();

    let mut t = state.transcript.clone();
    t.mix_hash(peer_ephemeral);
    t.mix_key(peer_ephemeral);
    t.mix_key(&*dh(&state.ephemeral, peer_ephemeral)?);
    t.mix_key(&*dh(&local.private, peer_ephemeral)?);
    let key = t.mix_psk(psk);
    t.decrypt(&key, msg.encrypted_empty(), &mut [])?;

    let (sending, receiving) = t.split();
    Ok(Response {
        keys: SessionKeys {
            sending: *sending,
            receiving: *receiving,
        },
        peer_index: msg.sender(),
    })
}

/// An initiation, read and authenticated: who sent it and the state to answer it from.
/// The caller still has to check that the timestamp is newer than the last one from this peer.
pub struct ReceivedInitiation {
    peer_public: [u8; 32],
    peer_index: u32,
    timestamp: [u8; 12],
    peer_ephemeral: [u8; 32],
    transcript: Transcript,
}

impl ReceivedInitiation {
    pub fn peer_public(&self) -> [u8; 32] {
        self.peer_public
    }

    /// TAI64N: big-endian, so comparing the bytes compares the times.
    pub fn timestamp(&self) -> [u8; 12] {
        self.timestamp
    }

    /// The initiator's sender index: the response and our data messages name it.
    pub fn peer_index(&self) -> u32 {
        self.peer_index
    }
}

impl fmt::Debug for ReceivedInitiation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceivedInitiation")
            .field("peer_public", &Hex(&self.peer_public))
            .field("peer_index", &self.peer_index)
            .finish_non_exhaustive()
    }
}

/// Reads an initiation sent to us. `peer_of` finds the peer by the static public key the
/// initiation reveals (`UnknownPeer` when it gives none). mac1 is checked before any
/// Diffie-Hellman; mac2 is the caller's business ([`super::cookie::CookieJar`]).
pub fn consume_initiation<'p>(
    local: &LocalIdentity,
    msg: wire::Initiation<'_>,
    peer_of: impl FnOnce(&[u8; 32]) -> Option<&'p PeerIdentity>,
) -> Result<ReceivedInitiation, HandshakeError> {
    if !local.verify_mac1(msg) {
        return Err(HandshakeError::BadMac1);
    }
    let peer_ephemeral: [u8; 32] = *msg.ephemeral();

    let mut t = local.start.clone();
    t.mix_hash(&peer_ephemeral);
    t.mix_key(&peer_ephemeral);

    let key = t.mix_key_with_key(&*dh(&local.private, &peer_ephemeral)?);
    let mut peer_public = [0u8; 32];
    t.decrypt(&key, msg.encrypted_static(), &mut peer_public)?;
    let peer = peer_of(&peer_public).ok_or(HandshakeError::UnknownPeer)?;
    // The static-static secret below is the found peer's: it must be the peer that was named.
    if !ct_eq(&peer.public, &peer_public) {
        return Err(HandshakeError::UnknownPeer);
    }

    let Some(static_shared) = &peer.static_shared else {
        return Err(HandshakeError::NotCarriedHere);
    };
    let key = t.mix_key_with_key(&**static_shared);
    let mut timestamp = [0u8; 12];
    t.decrypt(&key, msg.encrypted_timestamp(), &mut timestamp)?;

    Ok(ReceivedInitiation {
        peer_public,
        peer_index: msg.sender(),
        timestamp,
        peer_ephemeral,
        transcript: t,
    })
}

/// Writes the response to `received` into `out`. Returns the session's keys and the
/// response's mac1 (a cookie reply to the response is sealed with it).
#[allow(clippy::too_many_arguments)] // The protocol's inputs; bundling them would only rename them.
pub fn create_response(
    local: &LocalIdentity,
    peer: &PeerIdentity,
    received: &ReceivedInitiation,
    psk: &[u8; 32],
    local_index: u32,
    cookie: Option<&[u8; 16]>,
    rng: &mut (impl RngCore + CryptoRng),
    out: &mut [u8; RESPONSE_LEN],
) -> Result<(SessionKeys, [u8; 16]), HandshakeError> {
    // Our responder identity is implied by the transcript `received` carries.
    let _ = local;
    if !ct_eq(&peer.public, &received.peer_public) {
        return Err(HandshakeError::UnknownPeer);
    }
    let mut t = received.transcript.clone();
    let ephemeral = StaticSecret::random_from_rng(&mut *rng);
    let ephemeral_public = PublicKey::from(&ephemeral).to_bytes();

    wire::write_header(MSG_RESPONSE, out);
    out[resp::SENDER..resp::RECEIVER].copy_from_slice(&local_index.to_le_bytes());
    out[resp::RECEIVER..resp::EPHEMERAL].copy_from_slice(&received.peer_index.to_le_bytes());
    out[resp::EPHEMERAL..resp::EMPTY].copy_from_slice(&ephemeral_public);
    t.mix_hash(&ephemeral_public);
    t.mix_key(&ephemeral_public);
    t.mix_key(&*dh(&ephemeral, &received.peer_ephemeral)?);
    t.mix_key(&*dh(&ephemeral, &peer.public)?);
    let key = t.mix_psk(psk);
    t.encrypt(&key, &[], &mut out[resp::EMPTY..resp::MAC1]);

    let mac1 = write_macs(out, &peer.mac1_key, cookie);
    // The initiator's sending key is the first: ours is its receiving key.
    let (receiving, sending) = t.split();
    Ok((
        SessionKeys {
            sending: *sending,
            receiving: *receiving,
        },
        mac1,
    ))
}

/// TAI64N for a time given as the duration since the Unix epoch: 8 bytes of big-endian
/// seconds from the TAI64 label 2^62 + 10, then 4 bytes of big-endian nanoseconds.
pub fn tai64n(unix: Duration) -> [u8; 12] {
    const TAI64_LABEL: u64 = 0x4000_0000_0000_000a;
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&TAI64_LABEL.saturating_add(unix.as_secs()).to_be_bytes());
    out[8..].copy_from_slice(&unix.subsec_nanos().to_be_bytes());
    out
}

/// Noise's symmetric state: the chaining key C and the transcript hash H.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
struct Transcript {
    chaining_key: [u8; 32],
    hash: [u8; 32],
}

impl Transcript {
    /// C = HASH(CONSTRUCTION), H = HASH(HASH(C ‖ IDENTIFIER) ‖ responder's static public).
    fn start(responder_public: &[u8; 32]) -> Self {
        let chaining_key = hash(&[CONSTRUCTION]);
        let h = hash(&[&chaining_key, IDENTIFIER]);
        Self {
            chaining_key,
            hash: hash(&[&h, responder_public]),
        }
    }

    fn mix_hash(&mut self, data: &[u8]) {
        self.hash = hash(&[&self.hash, data]);
    }

    /// C = KDF1(C, input).
    fn mix_key(&mut self, input: &[u8]) {
        self.chaining_key = *kdf1(&self.chaining_key, input);
    }

    /// (C, κ) = KDF2(C, input); returns κ.
    fn mix_key_with_key(&mut self, input: &[u8]) -> Secret {
        let (chaining_key, key) = kdf2(&self.chaining_key, input);
        self.chaining_key = *chaining_key;
        key
    }

    /// (C, τ, κ) = KDF3(C, psk); H = HASH(H ‖ τ); returns κ.
    fn mix_psk(&mut self, psk: &[u8; 32]) -> Secret {
        let (chaining_key, tau, key) = kdf3(&self.chaining_key, psk);
        self.chaining_key = *chaining_key;
        self.mix_hash(&*tau);
        key
    }

    /// Seals `plaintext` into `out` (its length plus the tag) under `key` with H as associated
    /// data, then mixes the ciphertext into H.
    fn encrypt(&mut self, key: &[u8; 32], plaintext: &[u8], out: &mut [u8]) {
        let (data, tag) = out.split_at_mut(plaintext.len());
        data.copy_from_slice(plaintext);
        // ChaCha20-Poly1305 refuses only plaintexts of more than 256 GiB; these are 0 to 32 bytes.
        #[allow(clippy::expect_used)]
        let sealed = ChaCha20Poly1305::new(Key::from_slice(key))
            .encrypt_in_place_detached(&Nonce::default(), &self.hash, data)
            .expect("handshake fields are short");
        tag.copy_from_slice(&sealed);
        self.mix_hash(out);
    }

    /// Opens `ciphertext` (plaintext length plus the tag) into `plaintext` under `key` with H
    /// as associated data, then mixes the ciphertext into H.
    fn decrypt(
        &mut self,
        key: &[u8; 32],
        ciphertext: &[u8],
        plaintext: &mut [u8],
    ) -> Result<(), HandshakeError> {
        if ciphertext.len() != plaintext.len() + TAG_LEN {
            return Err(HandshakeError::Decryption);
        }
        let (data, tag) = ciphertext.split_at(plaintext.len());
        plaintext.copy_from_slice(data);
        let opened = ChaCha20Poly1305::new(Key::from_slice(key)).decrypt_in_place_detached(
            &Nonce::default(),
            &self.hash,
            plaintext,
            Tag::from_slice(tag),
        );
        if opened.is_err() {
            plaintext.zeroize();
            return Err(HandshakeError::Decryption);
        }
        self.mix_hash(ciphertext);
        Ok(())
    }

    /// (first, second) = KDF2(C, ε): the initiator's sending and receiving keys.
    fn split(&self) -> (Secret, Secret) {
        kdf2(&self.chaining_key, &[])
    }
}

/// Writes mac1 and mac2 at the end of a handshake message; returns mac1.
fn write_macs<const N: usize>(
    msg: &mut [u8; N],
    mac1_key: &[u8; 32],
    cookie: Option<&[u8; 16]>,
) -> [u8; 16] {
    const { assert!(N >= MACS_LEN) };
    let mac1 = mac(mac1_key, &[&msg[..N - MACS_LEN]]);
    msg[N - MACS_LEN..N - 16].copy_from_slice(&mac1);
    let mac2 = cookie.map_or([0; 16], |cookie| mac(cookie, &[&msg[..N - 16]]));
    msg[N - 16..].copy_from_slice(&mac2);
    mac1
}

/// Diffie-Hellman, refusing an all-zero result: the other key was of small order, and the
/// result would be one anybody could compute.
/// Whether `public` is a point of small order (its Diffie-Hellman with every key is zero):
/// [8]P is the identity. A clamped private key is 8 times a number below the group's prime
/// order, so this is exactly when `dh` refuses the key, at the cost of four ladder steps.
pub(crate) fn is_low_order(public: &[u8; 32]) -> bool {
    let eight = [true, false, false, false].into_iter();
    curve25519_dalek::MontgomeryPoint(*public)
        .mul_bits_be(eight)
        .to_bytes()
        == [0; 32]
}

fn dh(private: &StaticSecret, public: &[u8; 32]) -> Result<Secret, HandshakeError> {
    let shared = private.diffie_hellman(&PublicKey::from(*public));
    if !shared.was_contributory() {
        return Err(HandshakeError::LowOrderKey);
    }
    Ok(Zeroizing::new(shared.to_bytes()))
}

/// HASH: BLAKE2s-256 of the concatenated parts.
pub(super) fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for part in parts {
        Digest::update(&mut h, part);
    }
    h.finalize().into()
}

/// MAC: keyed BLAKE2s with a 128-bit output. The key length is part of BLAKE2's parameters,
/// so a 16-byte cookie is used as it is, not padded.
pub(super) fn mac<const K: usize>(key: &[u8; K], parts: &[&[u8]]) -> [u8; 16] {
    const { assert!(K >= 1 && K <= 32) };
    // BLAKE2s takes keys of 1 to 32 bytes, which the assertion above checks when compiling.
    #[allow(clippy::expect_used)]
    let mut m = Blake2sMac::<U16>::new_from_slice(key).expect("BLAKE2s takes 1- to 32-byte keys");
    for part in parts {
        m.update(part);
    }
    m.finalize_fixed().into()
}

/// HMAC (RFC 2104) over BLAKE2s-256. Every HMAC key in WireGuard is 32 bytes, shorter than
/// BLAKE2s's 64-byte block, so it is zero-padded and never hashed first.
fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> Secret {
    let mut block = Zeroizing::new([0u8; 64]);
    block[..32].copy_from_slice(key);
    block.iter_mut().for_each(|b| *b ^= 0x36);
    let mut inner = Blake2s256::new();
    Digest::update(&mut inner, &block[..]);
    for part in parts {
        Digest::update(&mut inner, part);
    }
    let inner = Zeroizing::new(<[u8; 32]>::from(inner.finalize()));
    // Turns the inner pad into the outer one.
    block.iter_mut().for_each(|b| *b ^= 0x36 ^ 0x5c);
    let mut outer = Blake2s256::new();
    Digest::update(&mut outer, &block[..]);
    Digest::update(&mut outer, &inner[..]);
    Zeroizing::new(outer.finalize().into())
}

/// KDF1: HMAC(HMAC(key, input), 0x1).
fn kdf1(key: &[u8; 32], input: &[u8]) -> Secret {
    let t0 = hmac(key, &[input]);
    hmac(&t0, &[&[1]])
}

/// KDF2: τ1 = HMAC(τ0, 0x1), τ2 = HMAC(τ0, τ1 ‖ 0x2), with τ0 = HMAC(key, input).
fn kdf2(key: &[u8; 32], input: &[u8]) -> (Secret, Secret) {
    let t0 = hmac(key, &[input]);
    let t1 = hmac(&t0, &[&[1]]);
    let t2 = hmac(&t0, &[&*t1, &[2]]);
    (t1, t2)
}

/// KDF3: KDF2's two outputs and τ3 = HMAC(τ0, τ2 ‖ 0x3).
fn kdf3(key: &[u8; 32], input: &[u8]) -> (Secret, Secret, Secret) {
    let t0 = hmac(key, &[input]);
    let t1 = hmac(&t0, &[&[1]]);
    let t2 = hmac(&t0, &[&*t1, &[2]]);
    let t3 = hmac(&t0, &[&*t2, &[3]]);
    (t1, t2, t3)
}

/// Compares without an early exit, so the time taken tells nothing about where the first
/// difference is.
pub(super) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Shows public bytes (keys, never secrets) as hex in `Debug`.
struct Hex<'a>(&'a [u8]);

impl fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `is_low_order` says exactly what the Diffie-Hellman says, on random keys, on
    /// small-order points made as [group order]P of random points (the prime-order part
    /// gone, the torsion left), and on those with the ignored top bit set, and on the
    /// encodings 0, 1, p - 1, p and p + 1.
    #[test]
    fn the_low_order_check_agrees_with_the_diffie_hellman() {
        use rand_core::RngCore;
        let local = LocalIdentity::new(keys().private);
        let order_hex = "1000000000000000000000000000000014def9dea2f79cd65812631a5cf5d3ed";
        let order_bits: Vec<bool> = order_hex
            .chars()
            .flat_map(|c| {
                let v = c.to_digit(16).unwrap();
                (0..4).rev().map(move |b| v >> b & 1 == 1)
            })
            .collect();
        let mut candidates: Vec<[u8; 32]> = Vec::new();
        let mut small = 0;
        for _ in 0..64 {
            let mut random = [0u8; 32];
            rand_core::OsRng.fill_bytes(&mut random);
            candidates.push(random);
            let torsion = curve25519_dalek::MontgomeryPoint(random)
                .mul_bits_be(order_bits.iter().copied())
                .to_bytes();
            candidates.push(torsion);
            let mut high = torsion;
            high[31] |= 0x80;
            candidates.push(high);
        }
        let p_minus = |d: u8| {
            let mut b = [0xffu8; 32];
            b[0] = 0xed - d;
            b[31] = 0x7f;
            b
        };
        let mut one = [0u8; 32];
        one[0] = 1;
        let mut p_plus_one = p_minus(0);
        p_plus_one[0] = 0xee;
        candidates.extend([[0u8; 32], one, p_minus(1), p_minus(0), p_plus_one]);
        for key in candidates {
            let refused = PeerIdentity::new(&local, key).is_err();
            assert_eq!(is_low_order(&key), refused, "{key:02x?}");
            assert_eq!(PeerIdentity::without_static_secret(key).is_err(), refused);
            small += usize::from(refused);
        }
        // About half the random points are on the curve, whose multiple by the group's order
        // is small-order (twice, with the top bit); the rest are on the twist. Fewer than
        // 16 in 128 would take a chance of about 1e-20.
        assert!(small >= 16, "only {small} small-order points were tried");
    }
    use boringtun::noise::{Tunn, TunnResult};
    use boringtun::x25519;
    use chacha20poly1305::aead::Aead;
    use rand_core::OsRng;
    use std::net::Ipv4Addr;
    use std::time::{SystemTime, UNIX_EPOCH};
    use wire::{Message, ParseError};

    /// Why a handshake message given as bytes was refused: by the parser (the device parses
    /// every datagram before the handshake sees it) or by the handshake.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Refused {
        Parse(ParseError),
        Handshake(HandshakeError),
    }

    impl PartialEq<HandshakeError> for Refused {
        fn eq(&self, other: &HandshakeError) -> bool {
            *self == Refused::Handshake(*other)
        }
    }

    // The tests hand the handshake bytes, as they arrive: these parse them first, as the
    // device does, then call the function of the same name.

    pub(crate) fn consume_initiation<'p>(
        local: &LocalIdentity,
        msg: &[u8],
        peer_of: impl FnOnce(&[u8; 32]) -> Option<&'p PeerIdentity>,
    ) -> Result<ReceivedInitiation, Refused> {
        let msg = wire::Initiation::parse(msg).map_err(Refused::Parse)?;
        super::consume_initiation(local, msg, peer_of).map_err(Refused::Handshake)
    }

    pub(crate) fn consume_response(
        state: &InitiationState,
        local: &LocalIdentity,
        peer: &PeerIdentity,
        psk: &[u8; 32],
        msg: &[u8],
    ) -> Result<Response, Refused> {
        let msg = wire::Response::parse(msg).map_err(Refused::Parse)?;
        super::consume_response(state, local, peer, psk, msg).map_err(Refused::Handshake)
    }

    /// A handshake message (initiation or response) from its bytes.
    pub(crate) fn handshake(msg: &[u8]) -> Result<Handshake<'_>, ParseError> {
        match wire::parse(msg)? {
            Message::Initiation(m) => Ok(m.into()),
            Message::Response(m) => Ok(m.into()),
            Message::CookieReply(_) | Message::Data(_) => Err(ParseError::WrongType {
                expected: MSG_INITIATION,
                found: msg[0],
            }),
        }
    }

    pub(crate) struct Keys {
        pub(crate) private: [u8; 32],
        pub(crate) public: [u8; 32],
    }

    pub(crate) fn keys() -> Keys {
        let secret = StaticSecret::random_from_rng(OsRng);
        Keys {
            private: secret.to_bytes(),
            public: PublicKey::from(&secret).to_bytes(),
        }
    }

    /// A boringtun tunnel with static key `ours` talking to `peer_public`.
    pub(crate) fn boringtun(
        ours: &Keys,
        peer_public: [u8; 32],
        psk: Option<[u8; 32]>,
        rate_limiter: Option<std::sync::Arc<boringtun::noise::rate_limiter::RateLimiter>>,
    ) -> Tunn {
        Tunn::new(
            x25519::StaticSecret::from(ours.private),
            x25519::PublicKey::from(peer_public),
            psk,
            None,
            0x42,
            rate_limiter,
        )
    }

    /// The datagram a boringtun call wants sent.
    pub(crate) fn to_network(result: TunnResult<'_>) -> Vec<u8> {
        match result {
            TunnResult::WriteToNetwork(datagram) => datagram.to_vec(),
            other => panic!("expected a datagram, got {other:?}"),
        }
    }

    pub(crate) fn unix_now() -> Duration {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
    }

    /// A fresh initiation from `local` to `peer`, stamped now.
    pub(crate) fn initiate_now(
        local: &LocalIdentity,
        peer: &PeerIdentity,
        psk: &[u8; 32],
        index: u32,
        cookie: Option<&[u8; 16]>,
    ) -> (InitiationState, [u8; INITIATION_LEN]) {
        let mut msg = [0u8; INITIATION_LEN];
        let state = create_initiation(
            local,
            peer,
            psk,
            index,
            tai64n(unix_now()),
            cookie,
            &mut OsRng,
            &mut msg,
        )
        .unwrap();
        (state, msg)
    }

    fn transport_nonce(counter: u64) -> Nonce {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&counter.to_le_bytes());
        nonce.into()
    }

    /// Opens a data message (type 4, reserved, receiver, counter, sealed payload) addressed to
    /// `receiver`; returns its counter and payload.
    pub(crate) fn open_data(key: &[u8; 32], msg: &[u8], receiver: u32) -> (u64, Vec<u8>) {
        assert_eq!(msg[..4], [4, 0, 0, 0], "not a data message");
        assert_eq!(
            msg[4..8],
            receiver.to_le_bytes(),
            "data message for another index"
        );
        let counter = u64::from_le_bytes(msg[8..16].try_into().unwrap());
        let payload = ChaCha20Poly1305::new(Key::from_slice(key))
            .decrypt(&transport_nonce(counter), &msg[16..])
            .expect("data message does not open with our receiving key");
        (counter, payload)
    }

    pub(crate) fn seal_data(
        key: &[u8; 32],
        receiver: u32,
        counter: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut msg = vec![4, 0, 0, 0];
        msg.extend_from_slice(&receiver.to_le_bytes());
        msg.extend_from_slice(&counter.to_le_bytes());
        let sealed = ChaCha20Poly1305::new(Key::from_slice(key))
            .encrypt(&transport_nonce(counter), payload)
            .unwrap();
        msg.extend_from_slice(&sealed);
        msg
    }

    /// A well-formed IPv4/UDP packet with a valid header checksum.
    pub(crate) fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + payload.len();
        let mut p = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0];
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        let sum = p
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&53u16.to_be_bytes());
        p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]); // No UDP checksum, allowed over IPv4.
        p.extend_from_slice(payload);
        p
    }

    /// Rewrites a message's mac1 for `receiver_public`, as anyone who knows that public key
    /// can, to reach the checks behind mac1.
    pub(crate) fn remac(msg: &mut [u8], receiver_public: &[u8; 32]) {
        let key = hash(&[LABEL_MAC1, receiver_public]);
        let n = msg.len();
        let mac1 = mac(&key, &[&msg[..n - 32]]);
        msg[n - 32..n - 16].copy_from_slice(&mac1);
    }

    fn psk_or_zero(psk: Option<[u8; 32]>) -> [u8; 32] {
        psk.unwrap_or([0; 32])
    }

    /// boringtun initiates, we respond; both directions of the session then carry data.
    fn boringtun_initiates(psk: Option<[u8; 32]>) {
        let ours = keys();
        let theirs = keys();
        let local = LocalIdentity::new(ours.private);
        let peer = PeerIdentity::new(&local, theirs.public).unwrap();
        let mut tunn = boringtun(&theirs, ours.public, psk, None);
        let mut buf = vec![0u8; 2048];

        let initiation = to_network(tunn.format_handshake_initiation(&mut buf, false));
        assert_eq!(initiation.len(), INITIATION_LEN);
        let received = consume_initiation(&local, &initiation, |k| {
            (*k == theirs.public).then_some(&peer)
        })
        .unwrap();
        assert_eq!(received.peer_public(), theirs.public);
        assert_eq!(received.peer_index().to_le_bytes(), initiation[4..8]);
        // boringtun counts TAI64 from 2^62 + 37; either way the decrypted seconds are now's.
        let secs = u64::from_be_bytes(received.timestamp()[..8].try_into().unwrap()) - (1 << 62);
        assert!(
            secs.abs_diff(unix_now().as_secs()) < 120,
            "timestamp {secs}"
        );

        let mut response = [0u8; RESPONSE_LEN];
        let (keys, mac1) = create_response(
            &local,
            &peer,
            &received,
            &psk_or_zero(psk),
            0xabcd_0123,
            None,
            &mut OsRng,
            &mut response,
        )
        .unwrap();
        assert_eq!(mac1, response[60..76]);
        assert_eq!(response[76..92], [0; 16], "mac2 without a cookie is zeros");

        // boringtun confirms the session with a keepalive under its sending key.
        let keepalive = to_network(tunn.decapsulate(None, &response, &mut buf));
        let (counter, payload) = open_data(&keys.receiving, &keepalive, 0xabcd_0123);
        assert_eq!((counter, payload.len()), (0, 0));

        let packet = ipv4_udp(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            b"hello",
        );
        let msg = seal_data(&keys.sending, received.peer_index(), 0, &packet);
        match tunn.decapsulate(None, &msg, &mut buf) {
            TunnResult::WriteToTunnelV4(decrypted, source) => {
                assert_eq!(decrypted, &packet[..]);
                assert_eq!(source, Ipv4Addr::new(10, 0, 0, 1));
            }
            other => panic!("boringtun did not take our data message: {other:?}"),
        }
    }

    /// We initiate, boringtun responds; both directions of the session then carry data.
    fn we_initiate(psk: Option<[u8; 32]>) {
        let ours = keys();
        let theirs = keys();
        let local = LocalIdentity::new(ours.private);
        let peer = PeerIdentity::new(&local, theirs.public).unwrap();
        let mut tunn = boringtun(&theirs, ours.public, psk, None);
        let mut buf = vec![0u8; 2048];

        let (state, initiation) = initiate_now(&local, &peer, &psk_or_zero(psk), 0x1234_5678, None);
        assert_eq!(state.local_index(), 0x1234_5678);
        assert_eq!(state.mac1(), initiation[116..132]);

        let response = to_network(tunn.decapsulate(None, &initiation, &mut buf));
        assert_eq!(response.len(), RESPONSE_LEN);
        let done = consume_response(&state, &local, &peer, &psk_or_zero(psk), &response).unwrap();
        assert_eq!(done.peer_index.to_le_bytes(), response[4..8]);

        // A responder sends nothing on a session until the initiator has used it.
        let packet = ipv4_udp(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            b"ping",
        );
        let msg = seal_data(&done.keys.sending, done.peer_index, 0, &packet);
        match tunn.decapsulate(None, &msg, &mut buf) {
            TunnResult::WriteToTunnelV4(decrypted, _) => assert_eq!(decrypted, &packet[..]),
            other => panic!("boringtun did not take our data message: {other:?}"),
        }

        let reply = ipv4_udp(
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 1),
            b"pong",
        );
        let msg = to_network(tunn.encapsulate(&reply, &mut buf));
        let (counter, payload) = open_data(&done.keys.receiving, &msg, 0x1234_5678);
        assert_eq!((counter, payload), (0, reply));
    }

    #[test]
    fn boringtun_initiates_we_respond_and_data_flows_both_ways() {
        boringtun_initiates(None);
    }

    #[test]
    fn we_initiate_boringtun_responds_and_data_flows_both_ways() {
        we_initiate(None);
    }

    #[test]
    fn preshared_key_interoperates_both_ways() {
        let psk = [0x5a; 32];
        boringtun_initiates(Some(psk));
        we_initiate(Some(psk));
    }

    /// Our initiator and our responder agree with each other, keys mirrored.
    #[test]
    fn our_own_handshake_derives_mirrored_keys() {
        let a = keys();
        let b = keys();
        let (la, lb) = (LocalIdentity::new(a.private), LocalIdentity::new(b.private));
        let b_at_a = PeerIdentity::new(&la, b.public).unwrap();
        let a_at_b = PeerIdentity::new(&lb, a.public).unwrap();
        let psk = [7; 32];

        let mut initiation = [0u8; INITIATION_LEN];
        let ts = tai64n(Duration::new(1_700_000_000, 5));
        let state = create_initiation(&la, &b_at_a, &psk, 1, ts, None, &mut OsRng, &mut initiation)
            .unwrap();
        assert!(lb.verify_mac1(handshake(&initiation).unwrap()));
        assert!(!la.verify_mac1(handshake(&initiation).unwrap()));
        let received = consume_initiation(&lb, &initiation, |_| Some(&a_at_b)).unwrap();
        assert_eq!(received.timestamp(), ts);
        assert_eq!(received.peer_index(), 1);

        let mut response = [0u8; RESPONSE_LEN];
        let (responder, _) = create_response(
            &lb,
            &a_at_b,
            &received,
            &psk,
            2,
            None,
            &mut OsRng,
            &mut response,
        )
        .unwrap();
        let initiator = consume_response(&state, &la, &b_at_a, &psk, &response).unwrap();
        assert_eq!(initiator.peer_index, 2);
        assert_eq!(initiator.keys.sending, responder.receiving);
        assert_eq!(initiator.keys.receiving, responder.sending);
        assert_ne!(initiator.keys.sending, initiator.keys.receiving);
        // A second response to the same initiation (new ephemeral) gives other keys.
        let (again, _) = create_response(
            &lb,
            &a_at_b,
            &received,
            &psk,
            3,
            None,
            &mut OsRng,
            &mut response,
        )
        .unwrap();
        assert_ne!(again.sending, responder.sending);
    }

    #[test]
    fn tai64n_is_label_plus_seconds_then_nanoseconds_big_endian() {
        assert_eq!(
            tai64n(Duration::ZERO),
            [0x40, 0, 0, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0]
        );
        assert_eq!(
            tai64n(Duration::new(0x0102_0304, 0x0a0b_0c0d)),
            [0x40, 0, 0, 0, 0x01, 0x02, 0x03, 0x0e, 0x0a, 0x0b, 0x0c, 0x0d]
        );
        // Byte order is time order, which the responder's replay check relies on.
        assert!(tai64n(Duration::new(5, 999_999_999)) < tai64n(Duration::new(6, 0)));
        assert!(tai64n(Duration::new(6, 1)) > tai64n(Duration::new(6, 0)));
        let _ = tai64n(Duration::MAX); // Saturates instead of overflowing.
    }

    #[test]
    fn wrong_psk_fails_both_ways() {
        let ours = keys();
        let theirs = keys();
        let local = LocalIdentity::new(ours.private);
        let peer = PeerIdentity::new(&local, theirs.public).unwrap();
        let mut buf = vec![0u8; 2048];

        // We initiate with one key, boringtun answers with another: the response's empty
        // field does not open.
        let mut tunn = boringtun(&theirs, ours.public, Some([1; 32]), None);
        let (state, initiation) = initiate_now(&local, &peer, &[2; 32], 9, None);
        let response = to_network(tunn.decapsulate(None, &initiation, &mut buf));
        assert_eq!(
            consume_response(&state, &local, &peer, &[2; 32], &response).unwrap_err(),
            HandshakeError::Decryption
        );
        // With the right key the same response opens, so the failure above was the key's.
        assert!(consume_response(&state, &local, &peer, &[1; 32], &response).is_ok());

        // boringtun initiates, we answer with the wrong key: boringtun refuses the response.
        let mut tunn = boringtun(&theirs, ours.public, Some([1; 32]), None);
        let initiation = to_network(tunn.format_handshake_initiation(&mut buf, false));
        let received = consume_initiation(&local, &initiation, |_| Some(&peer)).unwrap();
        let mut response = [0u8; RESPONSE_LEN];
        create_response(
            &local,
            &peer,
            &received,
            &[2; 32],
            5,
            None,
            &mut OsRng,
            &mut response,
        )
        .unwrap();
        assert!(matches!(
            tunn.decapsulate(None, &response, &mut buf),
            TunnResult::Err(_)
        ));
    }

    #[test]
    fn wrong_peer_is_refused() {
        let ours = keys();
        let theirs = keys();
        let stranger = keys();
        let local = LocalIdentity::new(ours.private);
        let peer = PeerIdentity::new(&local, theirs.public).unwrap();
        let other = PeerIdentity::new(&local, stranger.public).unwrap();
        let mut buf = vec![0u8; 2048];

        let mut tunn = boringtun(&theirs, ours.public, None, None);
        let initiation = to_network(tunn.format_handshake_initiation(&mut buf, false));
        assert_eq!(
            consume_initiation(&local, &initiation, |_| None).unwrap_err(),
            HandshakeError::UnknownPeer
        );
        // A lookup that answers with some other peer must not be believed.
        assert_eq!(
            consume_initiation(&local, &initiation, |_| Some(&other)).unwrap_err(),
            HandshakeError::UnknownPeer
        );
        let received = consume_initiation(&local, &initiation, |_| Some(&peer)).unwrap();
        let mut response = [0u8; RESPONSE_LEN];
        assert_eq!(
            create_response(
                &local,
                &other,
                &received,
                &[0; 32],
                1,
                None,
                &mut OsRng,
                &mut response
            )
            .unwrap_err(),
            HandshakeError::UnknownPeer
        );

        // An initiation meant for another responder fails mac1 before any work.
        let mut tunn = boringtun(&theirs, stranger.public, None, None);
        let initiation = to_network(tunn.format_handshake_initiation(&mut buf, false));
        assert_eq!(
            consume_initiation(&local, &initiation, |_| Some(&peer)).unwrap_err(),
            HandshakeError::BadMac1
        );

        // A response read against the state made for another peer.
        let mut tunn = boringtun(&theirs, ours.public, None, None);
        let (state, initiation) = initiate_now(&local, &peer, &[0; 32], 3, None);
        let response = to_network(tunn.decapsulate(None, &initiation, &mut buf));
        assert_eq!(
            consume_response(&state, &local, &other, &[0; 32], &response).unwrap_err(),
            HandshakeError::UnknownPeer
        );
    }

    /// Two of our own identities and a fresh initiation from `a` to `b`.
    struct Pair {
        la: LocalIdentity,
        lb: LocalIdentity,
        b_at_a: PeerIdentity,
        a_at_b: PeerIdentity,
    }

    impl Pair {
        fn new() -> Self {
            let (a, b) = (keys(), keys());
            let (la, lb) = (LocalIdentity::new(a.private), LocalIdentity::new(b.private));
            let b_at_a = PeerIdentity::new(&la, b.public).unwrap();
            let a_at_b = PeerIdentity::new(&lb, a.public).unwrap();
            Self {
                la,
                lb,
                b_at_a,
                a_at_b,
            }
        }

        fn initiation(&self) -> (InitiationState, [u8; INITIATION_LEN]) {
            initiate_now(&self.la, &self.b_at_a, &[0; 32], 11, None)
        }

        fn consume(&self, msg: &[u8]) -> Result<ReceivedInitiation, Refused> {
            consume_initiation(&self.lb, msg, |_| Some(&self.a_at_b))
        }

        fn response(&self) -> (InitiationState, [u8; RESPONSE_LEN]) {
            let (state, initiation) = self.initiation();
            let received = self.consume(&initiation).unwrap();
            let mut msg = [0u8; RESPONSE_LEN];
            create_response(
                &self.lb,
                &self.a_at_b,
                &received,
                &[0; 32],
                22,
                None,
                &mut OsRng,
                &mut msg,
            )
            .unwrap();
            (state, msg)
        }
    }

    #[test]
    fn every_flipped_byte_of_an_initiation_is_caught() {
        let pair = Pair::new();
        let (_, good) = pair.initiation();
        let b = pair.lb.public();
        for i in 0..INITIATION_LEN {
            let mut msg = good;
            msg[i] ^= 0x01;
            let plain = pair.consume(&msg).map(|_| ());
            let expected = match i {
                0 => Err(Refused::Parse(ParseError::WrongType {
                    expected: MSG_INITIATION,
                    found: MSG_INITIATION ^ 0x01,
                })),
                1..4 => Err(Refused::Parse(ParseError::ReservedNotZero)),
                4..132 => Err(Refused::Handshake(HandshakeError::BadMac1)),
                // mac2 is the cookie jar's to check.
                _ => Ok(()),
            };
            assert_eq!(plain, expected, "byte {i}");

            // Someone who knows our public key fixes mac1: the AEADs still catch the change.
            if (8..116).contains(&i) {
                remac(&mut msg, &b);
                let err = pair.consume(&msg).unwrap_err();
                assert!(
                    matches!(
                        err,
                        Refused::Handshake(
                            HandshakeError::Decryption | HandshakeError::LowOrderKey
                        )
                    ),
                    "byte {i}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn every_flipped_byte_of_a_response_is_caught() {
        let pair = Pair::new();
        let (state, good) = pair.response();
        let a = pair.la.public();
        let consume = |msg: &[u8]| {
            consume_response(&state, &pair.la, &pair.b_at_a, &[0; 32], msg).map(|r| r.peer_index)
        };
        assert_eq!(consume(&good), Ok(22));
        for i in 0..RESPONSE_LEN {
            let mut msg = good;
            msg[i] ^= 0x80;
            let expected = match i {
                0 => Err(Refused::Parse(ParseError::WrongType {
                    expected: MSG_RESPONSE,
                    found: MSG_RESPONSE ^ 0x80,
                })),
                1..4 => Err(Refused::Parse(ParseError::ReservedNotZero)),
                4..76 => Err(Refused::Handshake(HandshakeError::BadMac1)),
                _ => Ok(22),
            };
            assert_eq!(consume(&msg), expected, "byte {i}");

            if (4..60).contains(&i) {
                remac(&mut msg, &a);
                let got = consume(&msg);
                match i {
                    // The sender index is not in the transcript: it only changes who we name.
                    4..8 => assert_eq!(got, Ok(22 ^ (0x80 << (8 * (i - 4)))), "byte {i}"),
                    8..12 => assert_eq!(
                        got,
                        Err(Refused::Handshake(HandshakeError::WrongIndex)),
                        "byte {i}"
                    ),
                    _ => assert!(
                        matches!(
                            got,
                            Err(Refused::Handshake(
                                HandshakeError::Decryption | HandshakeError::LowOrderKey
                            ))
                        ),
                        "byte {i}: {got:?}"
                    ),
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_refused_without_panicking() {
        let pair = Pair::new();
        let (state, response) = pair.response();
        let (_, initiation) = pair.initiation();
        let mut long = initiation.to_vec();
        long.extend_from_slice(&response);
        for n in 0..long.len() {
            let msg = &long[..n];
            let wrong = |kind| match n {
                0..4 => Refused::Parse(ParseError::TooShort),
                _ => Refused::Parse(ParseError::WrongLength { kind, len: n }),
            };
            if n != INITIATION_LEN {
                assert_eq!(pair.consume(msg).unwrap_err(), wrong(MSG_INITIATION));
            }
            // Only a message of a handshake's length reaches the mac1 check.
            if n != INITIATION_LEN && n != RESPONSE_LEN {
                assert!(handshake(msg).is_err());
            }
            let mut as_response = msg.to_vec();
            if let Some(t) = as_response.first_mut() {
                *t = MSG_RESPONSE;
            }
            if n != RESPONSE_LEN {
                assert_eq!(
                    consume_response(&state, &pair.la, &pair.b_at_a, &[0; 32], &as_response)
                        .unwrap_err(),
                    wrong(MSG_RESPONSE)
                );
            }
        }
        // The right length but the other message's type.
        let mut swapped = [0u8; RESPONSE_LEN];
        swapped.copy_from_slice(&initiation[..RESPONSE_LEN]);
        assert_eq!(
            consume_response(&state, &pair.la, &pair.b_at_a, &[0; 32], &swapped).unwrap_err(),
            Refused::Parse(ParseError::WrongType {
                expected: MSG_RESPONSE,
                found: MSG_INITIATION
            })
        );
    }

    #[test]
    fn low_order_keys_are_refused() {
        let local = LocalIdentity::new(keys().private);
        // Points of order 1, 4, 2 (p - 1) and 8, and a non-canonical encoding of zero (p).
        let mut order8 = [0u8; 32];
        order8[..8].copy_from_slice(&[0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae]);
        order8[8..16].copy_from_slice(&[0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a]);
        order8[16..24].copy_from_slice(&[0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd]);
        order8[24..].copy_from_slice(&[0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00]);
        let mut p_minus_1 = [0xff; 32];
        p_minus_1[0] = 0xec;
        p_minus_1[31] = 0x7f;
        let mut p = p_minus_1;
        p[0] = 0xed;
        let mut one = [0u8; 32];
        one[0] = 1;
        for bad in [[0u8; 32], one, p_minus_1, order8, p] {
            assert_eq!(
                PeerIdentity::new(&local, bad).unwrap_err(),
                HandshakeError::LowOrderKey,
                "{:?}",
                Hex(&bad)
            );
        }

        // An initiation or a response whose ephemeral is of low order, with a valid mac1.
        let pair = Pair::new();
        let (_, mut initiation) = pair.initiation();
        initiation[8..40].copy_from_slice(&order8);
        remac(&mut initiation, &pair.lb.public());
        assert_eq!(
            pair.consume(&initiation).unwrap_err(),
            HandshakeError::LowOrderKey
        );
        let (state, mut response) = pair.response();
        response[12..44].copy_from_slice(&[0; 32]);
        remac(&mut response, &pair.la.public());
        assert_eq!(
            consume_response(&state, &pair.la, &pair.b_at_a, &[0; 32], &response).unwrap_err(),
            HandshakeError::LowOrderKey
        );
    }

    /// Random corruption behind a valid mac1, the deepest a stranger can reach.
    #[test]
    fn random_corruption_behind_a_valid_mac1_never_panics() {
        let pair = Pair::new();
        let (state, response) = pair.response();
        let (_, initiation) = pair.initiation();
        for round in 0..500u32 {
            let mut i = initiation;
            let mut r = response;
            let at = OsRng.next_u32() as usize;
            i[4 + at % (INITIATION_LEN - 36)] = OsRng.next_u32() as u8;
            r[4 + at % (RESPONSE_LEN - 36)] = OsRng.next_u32() as u8;
            if round % 2 == 0 {
                OsRng.fill_bytes(&mut i[8..116]);
                OsRng.fill_bytes(&mut r[12..60]);
            }
            remac(&mut i, &pair.lb.public());
            remac(&mut r, &pair.la.public());
            let _ = pair.consume(&i);
            let _ = consume_response(&state, &pair.la, &pair.b_at_a, &[0; 32], &r);
        }
    }

    #[test]
    fn debug_shows_no_secrets() {
        let k = keys();
        let local = LocalIdentity::new(k.private);
        let shown = format!("{local:?}");
        assert!(shown.contains(&format!("{:?}", Hex(&k.public))));
        assert!(!shown.contains(&format!("{:?}", Hex(&k.private))));
        let keys = SessionKeys {
            sending: [0xab; 32],
            receiving: [0xcd; 32],
        };
        assert_eq!(format!("{keys:?}"), "SessionKeys(<secret>)");
    }
}
