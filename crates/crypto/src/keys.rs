use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand_core::{OsRng, RngCore};
use std::fmt;
use std::str::FromStr;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Every WireGuard key is 32 bytes.
pub const KEY_LEN: usize = 32;

/// Why a base64 key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("is not valid base64")]
    Base64,
    #[error("decodes to {0} bytes, a key is 32 bytes (44 base64 characters)")]
    Length(usize),
}

fn decode_key(text: &str) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let text = text.trim();
    // 32 bytes encode to 44 characters; anything far longer is not a key and need not be decoded.
    if text.len() > 64 {
        return Err(KeyError::Length(text.len() * 3 / 4));
    }
    let bytes = Zeroizing::new(STANDARD.decode(text).map_err(|_| KeyError::Base64)?);
    let array: [u8; KEY_LEN] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::Length(bytes.len()))?;
    Ok(Zeroizing::new(array))
}

/// A Curve25519 private key. Zeroized on drop; `Debug` does not show it.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PrivateKey([u8; KEY_LEN]);

impl PrivateKey {
    /// A fresh random key, clamped as `wg genkey` clamps it.
    pub fn generate() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        OsRng.fill_bytes(&mut bytes);
        // Clamping (RFC 7748) so the base64 output is byte-identical in form to `wg genkey`.
        bytes[0] &= 248;
        bytes[31] = (bytes[31] & 127) | 64;
        Self(bytes)
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_key(text).map(|b| Self(*b))
    }

    /// The standard base64 form; the caller is responsible for where it goes.
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(self.0))
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519_dalek::PublicKey::from(&self.to_static_secret()).to_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The form the WireGuard protocol core takes.
    pub fn to_static_secret(&self) -> x25519_dalek::StaticSecret {
        x25519_dalek::StaticSecret::from(self.0)
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<secret>)")
    }
}

impl PartialEq for PrivateKey {
    fn eq(&self, other: &Self) -> bool {
        // Constant time is not needed for configuration comparisons, but costs nothing.
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}
impl Eq for PrivateKey {}

impl FromStr for PrivateKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Self::from_base64(s)
    }
}

/// A Curve25519 public key, which identifies a peer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; KEY_LEN]);

impl PublicKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_key(text).map(|b| Self(*b))
    }
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}
impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}
impl FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Self::from_base64(s)
    }
}

/// A symmetric preshared key mixed into the handshake. Zeroized on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct PresharedKey([u8; KEY_LEN]);

impl PresharedKey {
    pub fn generate() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        OsRng.fill_bytes(&mut bytes);
        Self(bytes)
    }
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_key(text).map(|b| Self(*b))
    }
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(self.0))
    }
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    /// The preshared key of sub-tunnel `sub` of a peer carried by several standard WireGuard
    /// sessions (`parallel = K`). Sub-tunnel 0 keeps the configured key (`None`: none), so a
    /// plain WireGuard peer still pairs with it; sub-tunnel `j > 0` gets
    /// BLAKE2s-256(key = the configured key or zeros, "tunneld sub-tunnel" || j). The key binds
    /// each session to its sub-tunnel: a handshake answered by the wrong sub-tunnel fails to
    /// authenticate instead of pairing two different ones.
    pub fn for_sub_tunnel(configured: Option<&PresharedKey>, sub: u8) -> Option<PresharedKey> {
        use blake2::digest::Mac;
        if sub == 0 {
            return configured.cloned();
        }
        let key = configured.map_or([0; KEY_LEN], |k| k.0);
        // BLAKE2s takes keys of 1 to 32 bytes, so a 32-byte key is always accepted.
        #[allow(clippy::expect_used)]
        let mut mac = <blake2::Blake2sMac256 as Mac>::new_from_slice(&key)
            .expect("BLAKE2s accepts 32-byte keys");
        mac.update(b"tunneld sub-tunnel");
        mac.update(&[sub]);
        Some(Self(mac.finalize().into_bytes().into()))
    }
}

impl fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresharedKey(<secret>)")
    }
}

/// Lower-case hex, the form the UAPI protocol uses for keys.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// Parses 64 hex digits (either case) into a key's bytes; `None` if it is anything else.
pub fn parse_hex_key(text: &str) -> Option<[u8; KEY_LEN]> {
    let text = text.as_bytes();
    if text.len() != KEY_LEN * 2 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; KEY_LEN];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7748 section 6.1 test vector: Alice's private and public key.
    const ALICE_PRIVATE_HEX: &str =
        "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
    const ALICE_PUBLIC_HEX: &str =
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";

    #[test]
    fn sub_tunnel_keys_match_python_blake2s_and_keep_sub_tunnel_zero_standard() {
        // Vectors from Python's hashlib.blake2s(b"tunneld sub-tunnel" + bytes([j]), key=k).
        let none_1 = PresharedKey::for_sub_tunnel(None, 1).unwrap();
        assert_eq!(
            hex(none_1.as_bytes()),
            "2f1e91a46b63193611947610da28c6721079548925e3fe272a64382d3b406fa8"
        );
        let configured = PresharedKey::from_bytes(core::array::from_fn(|i| i as u8));
        let counted_3 = PresharedKey::for_sub_tunnel(Some(&configured), 3).unwrap();
        assert_eq!(
            hex(counted_3.as_bytes()),
            "f43d22f02624042bf9a985cb2eead54150a45d489b752b682327e902593b3b3a"
        );
        assert_eq!(PresharedKey::for_sub_tunnel(None, 0), None);
        assert_eq!(
            PresharedKey::for_sub_tunnel(Some(&configured), 0),
            Some(configured.clone())
        );
        assert_ne!(
            PresharedKey::for_sub_tunnel(Some(&configured), 1),
            PresharedKey::for_sub_tunnel(Some(&configured), 2)
        );
    }

    #[test]
    fn public_key_matches_rfc7748_vector() {
        let private = PrivateKey::from_bytes(parse_hex_key(ALICE_PRIVATE_HEX).unwrap());
        assert_eq!(private.public_key().to_hex(), ALICE_PUBLIC_HEX);
    }

    #[test]
    fn generated_keys_are_clamped_and_round_trip() {
        let key = PrivateKey::generate();
        let bytes = key.as_bytes();
        assert_eq!(bytes[0] & 7, 0);
        assert_eq!(bytes[31] & 128, 0);
        assert_eq!(bytes[31] & 64, 64);
        let text = key.to_base64();
        assert_eq!(text.len(), 44);
        assert_eq!(PrivateKey::from_base64(&text).unwrap(), key);
    }

    #[test]
    fn bad_keys_are_refused_with_a_reason() {
        assert_eq!(
            PublicKey::from_base64("not base64!").unwrap_err(),
            KeyError::Base64
        );
        assert_eq!(
            PublicKey::from_base64("AAAA").unwrap_err(),
            KeyError::Length(3)
        );
        let long = "A".repeat(200);
        assert!(matches!(
            PublicKey::from_base64(&long),
            Err(KeyError::Length(_))
        ));
    }

    #[test]
    fn debug_never_shows_secrets() {
        let key = PrivateKey::generate();
        let shown = format!("{key:?}");
        assert!(!shown.contains(key.to_base64().as_str()));
        let psk = PresharedKey::generate();
        assert!(!format!("{psk:?}").contains(psk.to_base64().as_str()));
    }

    #[test]
    fn hex_round_trips() {
        let key = PrivateKey::generate().public_key();
        assert_eq!(parse_hex_key(&key.to_hex()), Some(*key.as_bytes()));
        assert_eq!(parse_hex_key("zz"), None);
        assert_eq!(parse_hex_key(&"g".repeat(64)), None);
    }
}
