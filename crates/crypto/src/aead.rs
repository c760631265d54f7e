//! WireGuard's transport AEAD: ChaCha20-Poly1305 on data messages, sealed and opened in
//! place, with the nonce WireGuard uses (4 zero bytes, then the 64-bit little-endian message
//! counter) and no associated data.
//!
//! ring's implementation, the fastest per message measured here at tunnel packet sizes (see
//! docs/benchmarks.md). OpenSSL's AVX-512 code streams faster, but through its EVP interface
//! each message pays two short one-block calls that make it slower than ring at 1420 bytes.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, CHACHA20_POLY1305};
use std::fmt;

/// Bytes of the Poly1305 tag after each sealed message.
pub const TAG_LEN: usize = 16;
const KEY_LEN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AeadError {
    #[error("sealed message shorter than its 16-byte tag")]
    TooShort,
    #[error("message does not authenticate")]
    Unauthentic,
}

/// One direction of a WireGuard session's keys.
pub struct TransportKey {
    /// Boxed so that `Drop` overwrites the key where it lives rather than a moved copy.
    key: Box<LessSafeKey>,
}

impl TransportKey {
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        Self {
            key: Box::new(ring_key(key)),
        }
    }

    /// Encrypts `data` in place; returns the tag that follows it on the wire.
    pub fn seal(&mut self, counter: u64, data: &mut [u8]) -> [u8; TAG_LEN] {
        match self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::empty(), data)
        {
            Ok(tag) => tag_bytes(&tag),
            // ring refuses only messages longer than ChaCha20's 256 GiB counter space, which no
            // datagram is. Should it ever, nothing readable leaves: the peer drops a message of
            // zeros with a zero tag.
            Err(_) => {
                data.fill(0);
                [0; TAG_LEN]
            }
        }
    }

    /// `data` is a ciphertext followed by its tag: decrypts it in place and returns the length
    /// of the plaintext at its start. On failure the bytes are zeroed, so no unauthenticated
    /// plaintext can be used by mistake.
    pub fn open(&mut self, counter: u64, data: &mut [u8]) -> Result<usize, AeadError> {
        let Some(len) = data.len().checked_sub(TAG_LEN) else {
            return Err(AeadError::TooShort);
        };
        match self.key.open_in_place(nonce(counter), Aad::empty(), data) {
            Ok(_) => Ok(len),
            Err(_) => {
                data.fill(0);
                Err(AeadError::Unauthentic)
            }
        }
    }
}

impl fmt::Debug for TransportKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportKey").finish_non_exhaustive()
    }
}

impl Drop for TransportKey {
    fn drop(&mut self) {
        // ring keeps ChaCha20's key words inline and does not wipe them: overwrite them in place
        // with an all-zero key, and keep the store from being removed as dead before the free.
        *self.key = ring_key(&[0; KEY_LEN]);
        std::hint::black_box(&*self.key);
    }
}

/// WireGuard's nonce: 4 zero bytes, then the 64-bit little-endian counter.
fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

fn ring_key(key: &[u8; KEY_LEN]) -> LessSafeKey {
    // ring refuses a ChaCha20-Poly1305 key only for its length, and this one is 32 bytes.
    #[allow(clippy::expect_used)]
    let key = UnboundKey::new(&CHACHA20_POLY1305, key).expect("ring takes 32-byte keys");
    LessSafeKey::new(key)
}

fn tag_bytes(tag: &Tag) -> [u8; TAG_LEN] {
    let mut out = [0; TAG_LEN];
    out.copy_from_slice(tag.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        text.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect()
    }

    fn test_key() -> [u8; KEY_LEN] {
        std::array::from_fn(|i| 0xa0 ^ (i as u8))
    }

    /// ring reproduces RFC 8439 §2.8.2 (its own nonce and associated data), and the keys here
    /// seal exactly as ring does with WireGuard's nonce layout written out by hand.
    #[test]
    fn ciphertext_matches_rfc8439_and_the_nonce_is_wireguards() {
        let key: [u8; KEY_LEN] = std::array::from_fn(|i| 0x80 + i as u8);
        let plaintext = b"Ladies and Gentlemen of the class of '99: If I could offer you only \
                          one tip for the future, sunscreen would be it.";
        let rfc_ciphertext = hex("d3 1a 8d 34 64 8e 60 db 7b 86 af bc 53 ef 7e c2
             a4 ad ed 51 29 6e 08 fe a9 e2 b5 a7 36 ee 62 d6
             3d be a4 5e 8c a9 67 12 82 fa fb 69 da 92 72 8b
             1a 71 de 0a 9e 06 0b 29 05 d6 a5 b6 7e cd 3b 36
             92 dd bd 7f 2d 77 8b 8c 98 03 ae e3 28 09 1b 58
             fa b3 24 e4 fa d6 75 94 55 85 80 8b 48 31 d7 bc
             3f f4 de f0 8e 4b 7a 9d e5 76 d2 65 86 ce c6 4b
             61 16");
        let reference = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).expect("key"));
        let rfc_nonce = hex("07 00 00 00 40 41 42 43 44 45 46 47");
        let mut buf = plaintext.to_vec();
        let rfc_tag = reference
            .seal_in_place_separate_tag(
                Nonce::try_assume_unique_for_key(&rfc_nonce).expect("12 bytes"),
                Aad::from(hex("50 51 52 53 c0 c1 c2 c3 c4 c5 c6 c7")),
                &mut buf,
            )
            .expect("seal");
        assert_eq!(buf, rfc_ciphertext, "ring reproduces the RFC vector");
        assert_eq!(
            rfc_tag.as_ref(),
            &hex("1a e1 0b 59 4f 09 e2 6a 7e 90 2e cb d0 60 06 91")[..]
        );

        for (counter, nonce) in [
            (0u64, [0u8; 12]),
            (1, [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            (0x0102_0304_0506_0708, [0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]),
        ] {
            let mut expected = plaintext.to_vec();
            let tag = reference
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::empty(),
                    &mut expected,
                )
                .expect("seal");
            let mut got = plaintext.to_vec();
            let got_tag = TransportKey::new(&key).seal(counter, &mut got);
            assert_eq!(got, expected, "counter {counter:#x}");
            assert_eq!(&got_tag[..], tag.as_ref(), "counter {counter:#x}");
        }
    }

    #[test]
    fn sealed_messages_open_at_every_size() {
        let mut sender = TransportKey::new(&test_key());
        let mut receiver = TransportKey::new(&test_key());
        for size in [0, 1, 15, 16, 17, 63, 64, 65, 1420, 1424, 65535] {
            let plaintext: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
            let mut buf = plaintext.clone();
            let tag = sender.seal(size as u64, &mut buf);
            assert!(size == 0 || buf != plaintext, "{size} B: encrypted");
            buf.extend_from_slice(&tag);
            assert_eq!(receiver.open(size as u64, &mut buf), Ok(size));
            assert_eq!(&buf[..size], &plaintext[..]);
        }
    }

    #[test]
    fn a_changed_byte_counter_or_key_fails_and_leaves_only_zeros() {
        let key = test_key();
        let mut sealed = vec![0x5a; 100];
        let tag = TransportKey::new(&key).seal(7, &mut sealed);
        sealed.extend_from_slice(&tag);
        let mut receiver = TransportKey::new(&key);
        for flip in [0, 50, 99, 100, 115] {
            let mut buf = sealed.clone();
            buf[flip] ^= 1;
            assert_eq!(
                receiver.open(7, &mut buf),
                Err(AeadError::Unauthentic),
                "byte {flip}"
            );
            assert!(buf.iter().all(|b| *b == 0), "byte {flip}: zeroed");
        }
        let mut buf = sealed.clone();
        assert_eq!(receiver.open(8, &mut buf), Err(AeadError::Unauthentic));
        let mut other = test_key();
        other[0] ^= 1;
        let mut buf = sealed.clone();
        assert_eq!(
            TransportKey::new(&other).open(7, &mut buf),
            Err(AeadError::Unauthentic)
        );
        // A failure does not disturb the key: the intact message still opens.
        let mut buf = sealed.clone();
        assert_eq!(receiver.open(7, &mut buf), Ok(100));
    }

    #[test]
    fn less_than_a_tag_is_refused_without_panic() {
        let mut key = TransportKey::new(&test_key());
        for len in 0..TAG_LEN {
            assert_eq!(
                key.open(0, &mut vec![0; len]),
                Err(AeadError::TooShort),
                "{len}"
            );
        }
    }

    #[test]
    fn debug_shows_no_key() {
        let text = format!("{:?}", TransportKey::new(&test_key()));
        assert_eq!(text, "TransportKey { .. }");
    }
}
