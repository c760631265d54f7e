//! WireGuard's transport AEAD: ChaCha20-Poly1305 on data messages, with the nonce WireGuard
//! uses (4 zero bytes, then the 64-bit little-endian message counter) and no associated data.
//!
//! Three implementations: ring's (AVX2 assembly, ChaCha20 and Poly1305 stitched together);
//! aws-lc's (the same kind of assembly, but its API reads one buffer and writes another in
//! one pass, where ring must copy first and then work in place); and this crate's own for
//! CPUs with AVX-512 (`aead/avx512.rs`: 16 ChaCha20 blocks at once, Poly1305 in 8 lanes),
//! which on an AVX-512 Intel core seals a 1420-byte message in about 0.7× ring's time
//! (docs/benchmarks.md). Which one runs is decided once per process by [`choose`]: the one
//! configured (`[dataplane] aead`: `ring`, `aws-lc`, `avx512` or `auto`), else the fastest
//! of those this CPU runs, measured for half a millisecond the way the data path uses them
//! (a near tie goes to the one-pass code). All produce the same bytes, so peers never
//! notice.

use aws_lc_rs::aead as aws_lc;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use std::fmt;
use std::sync::OnceLock;
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod vectors;

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

/// An implementation of ChaCha20-Poly1305 that can seal and open data messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    Ring,
    AwsLc,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Implementation {
    /// Every implementation built into this binary.
    pub const ALL: &'static [Implementation] = &[
        Implementation::Ring,
        Implementation::AwsLc,
        #[cfg(target_arch = "x86_64")]
        Implementation::Avx512,
    ];

    /// Its name in the config (`[dataplane] aead`).
    pub fn name(self) -> &'static str {
        match self {
            Implementation::Ring => "ring",
            Implementation::AwsLc => "aws-lc",
            #[cfg(target_arch = "x86_64")]
            Implementation::Avx512 => "avx512",
        }
    }

    /// The implementation a name names; `None` for `auto`; an error naming the accepted
    /// values otherwise.
    pub fn parse(value: &str) -> Result<Option<Self>, String> {
        if value == "auto" {
            return Ok(None);
        }
        Self::ALL
            .iter()
            .copied()
            .find(|i| i.name() == value)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|i| i.name()).collect();
                format!(
                    "\"{value}\" is not an AEAD implementation (expected one of: auto, {})",
                    names.join(", ")
                )
            })
    }

    /// Whether this CPU runs it.
    pub fn is_available(self) -> bool {
        TransportKey::try_with(self, &[0; KEY_LEN]).is_some()
    }

    /// The implementations built in that this CPU runs (ring always).
    pub fn available() -> impl Iterator<Item = Implementation> {
        Self::ALL.iter().copied().filter(|i| i.is_available())
    }
}

/// The process-wide implementation and why it was chosen (for the log).
#[derive(Debug, Clone)]
pub struct Choice {
    pub implementation: Implementation,
    pub reason: String,
}

/// Decides, once per process, the implementation every [`TransportKey::new`] uses: `preferred`
/// if given and this CPU runs it, else the fastest here. Later calls return the first
/// decision whatever they ask for, so a daemon calls this before it makes any key.
pub fn choose(preferred: Option<Implementation>) -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(|| match preferred {
        Some(implementation) if implementation.is_available() => Choice {
            implementation,
            reason: "as configured".into(),
        },
        Some(implementation) => {
            let mut choice = fastest();
            choice.reason = format!(
                "{} does not run on this CPU, so {}",
                implementation.name(),
                choice.reason
            );
            choice
        }
        None => fastest(),
    })
}

/// The process-wide implementation ([`choose`] with no preference, unless it was called).
pub fn choice() -> &'static Choice {
    choose(None)
}

/// Seals and opens 1420-byte messages with each implementation in interleaved rounds and
/// picks by the median time per seal and open ([`pick`]), in about half a millisecond. Each
/// works from one buffer into another, as the data path does, so ring pays the copy its
/// in-place code needs.
fn fastest() -> Choice {
    const ROUNDS: usize = 7;
    const PAIRS: u32 = 16;
    let mut keys: Vec<TransportKey> = Implementation::ALL
        .iter()
        .filter_map(|&i| TransportKey::try_with(i, &[0x42; KEY_LEN]))
        .collect();
    let mut times: Vec<Vec<u128>> = vec![Vec::with_capacity(ROUNDS); keys.len()];
    let message = [0x17u8; 1420];
    let mut sealed = [0u8; 1420 + TAG_LEN];
    let mut opened = [0u8; 1420 + TAG_LEN];
    for _ in 0..ROUNDS {
        for (key, times) in keys.iter_mut().zip(times.iter_mut()) {
            let start = Instant::now();
            for counter in 0..PAIRS {
                let counter = u64::from(counter);
                let (body, tag) = sealed.split_at_mut(message.len());
                tag.copy_from_slice(&key.seal_into(counter, &message, body));
                let _ = std::hint::black_box(key.open_into(counter, &sealed, &mut opened));
            }
            times.push(start.elapsed().as_nanos() / u128::from(PAIRS));
        }
    }
    let mut measured: Vec<(Implementation, u128)> = keys
        .iter()
        .zip(times.iter_mut())
        .map(|(key, times)| {
            times.sort_unstable();
            (key.implementation(), times[ROUNDS / 2])
        })
        .collect();
    measured.sort_by_key(|&(_, ns)| ns);
    let figures: Vec<String> = measured
        .iter()
        .map(|(i, ns)| format!("{} {ns} ns", i.name()))
        .collect();
    Choice {
        implementation: pick(&measured),
        reason: format!(
            "measured here per 1420-byte seal and open: {}",
            figures.join(", ")
        ),
    }
}

/// Timings closer than this share (percent) count as a tie: start-up timings on a busy
/// machine are that noisy.
const TIE_PERCENT: u128 = 3;

/// The fastest of `measured` (implementation, time), except that among those within
/// [`TIE_PERCENT`] of it the one first in this order wins: the own AVX-512 code, aws-lc
/// (one pass from buffer to buffer), ring (a copy, then in place). Two gateways timing
/// the same CPU so end up on the same, better code rather than on a coin toss.
fn pick(measured: &[(Implementation, u128)]) -> Implementation {
    fn preference(i: Implementation) -> u8 {
        match i {
            #[cfg(target_arch = "x86_64")]
            Implementation::Avx512 => 0,
            Implementation::AwsLc => 1,
            Implementation::Ring => 2,
        }
    }
    let Some(best) = measured.iter().map(|&(_, ns)| ns).min() else {
        return Implementation::Ring;
    };
    measured
        .iter()
        .filter(|&&(_, ns)| ns * 100 <= best * (100 + TIE_PERCENT))
        .map(|&(i, _)| i)
        .min_by_key(|&i| preference(i))
        .unwrap_or(Implementation::Ring)
}

/// One direction of a WireGuard session's keys.
pub struct TransportKey {
    cipher: Cipher,
}

enum Cipher {
    /// Boxed so that `Drop` overwrites the key where it lives rather than a moved copy.
    Ring(Box<LessSafeKey>),
    /// aws-lc wipes its key when it frees it.
    AwsLc(aws_lc::LessSafeKey),
    #[cfg(target_arch = "x86_64")]
    Avx512(Box<avx512::Key>),
}

impl TransportKey {
    /// A key on the process-wide [`choice`].
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        Self::with(choice().implementation, key)
    }

    /// A key on `implementation`, or on ring if that one cannot be set up (the bytes on the
    /// wire are the same either way).
    pub fn with(implementation: Implementation, key: &[u8; KEY_LEN]) -> Self {
        Self::try_with(implementation, key).unwrap_or_else(|| Self {
            cipher: Cipher::Ring(Box::new(ring_key(key))),
        })
    }

    /// A key on the AVX-512 code's `paths` whatever this CPU would pick (tests only), or why
    /// this CPU cannot run them.
    #[cfg(all(test, target_arch = "x86_64"))]
    fn with_avx512_paths(key: &[u8; KEY_LEN], paths: avx512::Paths) -> Result<Self, String> {
        Ok(Self {
            cipher: Cipher::Avx512(Box::new(avx512::Key::with_paths(key, paths)?)),
        })
    }

    fn try_with(implementation: Implementation, key: &[u8; KEY_LEN]) -> Option<Self> {
        let cipher = match implementation {
            Implementation::Ring => Cipher::Ring(Box::new(ring_key(key))),
            Implementation::AwsLc => Cipher::AwsLc(aws_lc_key(key)),
            #[cfg(target_arch = "x86_64")]
            Implementation::Avx512 => Cipher::Avx512(Box::new(avx512::Key::new(key)?)),
        };
        Some(Self { cipher })
    }

    /// The library this key seals and opens with.
    pub fn implementation(&self) -> Implementation {
        match self.cipher {
            Cipher::Ring(_) => Implementation::Ring,
            Cipher::AwsLc(_) => Implementation::AwsLc,
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(_) => Implementation::Avx512,
        }
    }

    /// Encrypts `data` in place; returns the tag that follows it on the wire.
    pub fn seal(&mut self, counter: u64, data: &mut [u8]) -> [u8; TAG_LEN] {
        self.seal_with(&nonce_bytes(counter), &[], data)
    }

    /// [`seal`](Self::seal) with any nonce and associated data. The data path passes
    /// WireGuard's (the counter's nonce, no associated data); the tests pass those of
    /// published vectors, which WireGuard's layout cannot express, through this same code.
    fn seal_with(&mut self, nonce: &[u8; 12], aad: &[u8], data: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = match &mut self.cipher {
            Cipher::Ring(key) => key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    data,
                )
                .ok()
                .map(|tag| tag_bytes(tag.as_ref())),
            Cipher::AwsLc(key) => key
                .seal_in_place_separate_tag(
                    aws_lc::Nonce::assume_unique_for_key(*nonce),
                    aws_lc::Aad::from(aad),
                    data,
                )
                .ok()
                .map(|tag| tag_bytes(tag.as_ref())),
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(key) => key.seal(nonce, aad, None, data),
        };
        tag.unwrap_or_else(|| refused(data))
    }

    /// Encrypts `plaintext` into `out` (the same length; panics otherwise, a caller's bug);
    /// returns the tag. aws-lc and the AVX-512 code read and write in one pass; ring copies,
    /// then seals in place.
    pub fn seal_into(&mut self, counter: u64, plaintext: &[u8], out: &mut [u8]) -> [u8; TAG_LEN] {
        self.seal_into_with(&nonce_bytes(counter), &[], plaintext, out)
    }

    /// [`seal_into`](Self::seal_into) with any nonce and associated data (as
    /// [`seal_with`](Self::seal_with)).
    fn seal_into_with(
        &mut self,
        nonce: &[u8; 12],
        aad: &[u8],
        plaintext: &[u8],
        out: &mut [u8],
    ) -> [u8; TAG_LEN] {
        assert_eq!(plaintext.len(), out.len(), "seal_into: lengths differ");
        match &mut self.cipher {
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(key) => key
                .seal(nonce, aad, Some(plaintext), out)
                .unwrap_or_else(|| refused(out)),
            Cipher::AwsLc(key) => {
                let mut tag = [0; TAG_LEN];
                match key.seal_out_of_place_scatter(
                    aws_lc::Nonce::assume_unique_for_key(*nonce),
                    aws_lc::Aad::from(aad),
                    plaintext,
                    out,
                    &[],
                    &mut tag,
                ) {
                    Ok(()) => tag,
                    Err(_) => refused(out),
                }
            }
            Cipher::Ring(_) => {
                out.copy_from_slice(plaintext);
                self.seal_with(nonce, aad, out)
            }
        }
    }

    /// `data` is a ciphertext followed by its tag: decrypts it in place and returns the length
    /// of the plaintext at its start. On failure the bytes are zeroed, so no unauthenticated
    /// plaintext can be used by mistake.
    pub fn open(&mut self, counter: u64, data: &mut [u8]) -> Result<usize, AeadError> {
        self.open_with(&nonce_bytes(counter), &[], data)
    }

    /// [`open`](Self::open) with any nonce and associated data (as
    /// [`seal_with`](Self::seal_with)).
    fn open_with(
        &mut self,
        nonce: &[u8; 12],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<usize, AeadError> {
        let Some(len) = data.len().checked_sub(TAG_LEN) else {
            return Err(AeadError::TooShort);
        };
        let authentic = match &mut self.cipher {
            Cipher::Ring(key) => key
                .open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), data)
                .is_ok(),
            Cipher::AwsLc(key) => key
                .open_in_place(
                    aws_lc::Nonce::assume_unique_for_key(*nonce),
                    aws_lc::Aad::from(aad),
                    data,
                )
                .is_ok(),
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(key) => {
                let (body, tag) = data.split_at_mut(len);
                let tag: [u8; TAG_LEN] = std::array::from_fn(|i| tag[i]);
                key.open(nonce, aad, None, body, &tag)
            }
        };
        if authentic {
            Ok(len)
        } else {
            data.fill(0);
            Err(AeadError::Unauthentic)
        }
    }

    /// `sealed` is a ciphertext followed by its tag: decrypts it into the start of `out` and
    /// returns the plaintext's length. `out` must hold `sealed.len()` bytes (ring opens in
    /// place there, tag included; the others read `sealed` and write `out` in one pass). On
    /// failure those bytes of `out` are zeroed.
    pub fn open_into(
        &mut self,
        counter: u64,
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<usize, AeadError> {
        self.open_into_with(&nonce_bytes(counter), &[], sealed, out)
    }

    /// [`open_into`](Self::open_into) with any nonce and associated data (as
    /// [`seal_with`](Self::seal_with)).
    fn open_into_with(
        &mut self,
        nonce: &[u8; 12],
        aad: &[u8],
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<usize, AeadError> {
        let Some(len) = sealed.len().checked_sub(TAG_LEN) else {
            return Err(AeadError::TooShort);
        };
        let Some(out) = out.get_mut(..sealed.len()) else {
            return Err(AeadError::TooShort);
        };
        let (body, tag) = sealed.split_at(len);
        let authentic = match &mut self.cipher {
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(key) => {
                let tag: [u8; TAG_LEN] = std::array::from_fn(|i| tag[i]);
                key.open(nonce, aad, Some(body), &mut out[..len], &tag)
            }
            Cipher::AwsLc(key) => key
                .open_separate_gather(
                    aws_lc::Nonce::assume_unique_for_key(*nonce),
                    aws_lc::Aad::from(aad),
                    body,
                    tag,
                    &mut out[..len],
                )
                .is_ok(),
            Cipher::Ring(_) => {
                out.copy_from_slice(sealed);
                return self.open_with(nonce, aad, out);
            }
        };
        if authentic {
            Ok(len)
        } else {
            out.fill(0);
            Err(AeadError::Unauthentic)
        }
    }
}

/// What a seal that the library refused leaves: ring refuses only messages longer than
/// ChaCha20's 256 GiB counter space (and the AVX-512 code the same), which no datagram
/// reaches. Should it ever happen, nothing readable leaves: the peer drops a message of
/// zeros with a zero tag.
fn refused(data: &mut [u8]) -> [u8; TAG_LEN] {
    data.fill(0);
    [0; TAG_LEN]
}

impl fmt::Debug for TransportKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportKey")
            .field("implementation", &self.implementation())
            .finish_non_exhaustive()
    }
}

impl Drop for TransportKey {
    fn drop(&mut self) {
        match &mut self.cipher {
            // ring keeps ChaCha20's key words inline and does not wipe them: overwrite them in
            // place with an all-zero key, and keep the store from being removed as dead before
            // the free.
            Cipher::Ring(key) => {
                **key = ring_key(&[0; KEY_LEN]);
                std::hint::black_box(&**key);
            }
            // aws-lc's allocator overwrites the key's context when it frees it.
            Cipher::AwsLc(_) => {}
            // Wipes itself when dropped.
            #[cfg(target_arch = "x86_64")]
            Cipher::Avx512(_) => {}
        }
    }
}

/// WireGuard's nonce: 4 zero bytes, then the 64-bit little-endian counter.
fn nonce_bytes(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

fn ring_key(key: &[u8; KEY_LEN]) -> LessSafeKey {
    // ring refuses a ChaCha20-Poly1305 key only for its length, and this one is 32 bytes.
    #[allow(clippy::expect_used)]
    let key = UnboundKey::new(&CHACHA20_POLY1305, key).expect("ring takes 32-byte keys");
    LessSafeKey::new(key)
}

fn aws_lc_key(key: &[u8; KEY_LEN]) -> aws_lc::LessSafeKey {
    // Like ring, aws-lc refuses a ChaCha20-Poly1305 key only for its length.
    #[allow(clippy::expect_used)]
    let key = aws_lc::UnboundKey::new(&aws_lc::CHACHA20_POLY1305, key)
        .expect("aws-lc takes 32-byte keys");
    aws_lc::LessSafeKey::new(key)
}

fn tag_bytes(tag: &[u8]) -> [u8; TAG_LEN] {
    let mut out = [0; TAG_LEN];
    out.copy_from_slice(tag);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn hex(text: &str) -> Vec<u8> {
        text.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect()
    }

    fn test_key() -> [u8; KEY_LEN] {
        std::array::from_fn(|i| 0xa0 ^ (i as u8))
    }

    /// Says that this CPU cannot run `what` and why: a skip of hardware the test checked
    /// itself, the one kind `TUNNELD_REQUIRE_ALL=1` allows (`tunneld_testnet::skip`).
    pub(super) fn cannot_run(test: &str, what: &str, why: &str) {
        tunneld_testnet::skip_unless(test, false, what, tunneld_testnet::Missing::Hardware(why));
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

    /// A key asked for on an implementation this CPU lacks is made on ring instead.
    #[test]
    fn an_unavailable_implementation_falls_back_to_ring() {
        for &implementation in Implementation::ALL {
            let made = TransportKey::with(implementation, &test_key()).implementation();
            if implementation.is_available() {
                assert_eq!(made, implementation);
            } else {
                eprintln!("{} does not run on this CPU", implementation.name());
                assert_eq!(made, Implementation::Ring);
            }
        }
    }

    #[test]
    fn debug_shows_no_key() {
        for implementation in Implementation::available() {
            let text = format!("{:?}", TransportKey::with(implementation, &test_key()));
            assert_eq!(
                text,
                format!("TransportKey {{ implementation: {implementation:?}, .. }}")
            );
        }
    }

    /// A small deterministic generator, so a failure names a reproducible case (also used by
    /// `avx512`'s tests).
    pub(super) fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every implementation seals to the same bytes as ring, in place and out of place, and
    /// every one opens what any other sealed: at every size around the block and lane
    /// boundaries of the vector code, with keys and counters that change per case.
    #[test]
    fn every_implementation_agrees_with_ring_byte_for_byte() {
        // Every size up to 1600 (the vector Poly1305 starts at 384 bytes and leaves the blocks
        // past a multiple of 8 to the scalar code; the 8-block ChaCha20 tail covers 448 bytes
        // or less), then larger ones.
        let sizes = (0..=1600).chain([2047, 2048, 4096, 8191, 65535]);
        for &implementation in Implementation::ALL {
            if !implementation.is_available() {
                cannot_run(
                    "every_implementation_agrees_with_ring_byte_for_byte",
                    implementation.name(),
                    "this CPU does not run it",
                );
            }
        }
        for (case, size) in sizes.enumerate() {
            let key: [u8; KEY_LEN] = bytes(case as u64, KEY_LEN).try_into().expect("32");
            let counter = u64::from_le_bytes(bytes(!(case as u64), 8).try_into().expect("8"));
            let plaintext = bytes(case as u64 + 1000, size);
            let mut expected = plaintext.clone();
            let expected_tag =
                TransportKey::with(Implementation::Ring, &key).seal(counter, &mut expected);
            for sealer in Implementation::available() {
                let mut sealing = TransportKey::with(sealer, &key);
                assert_eq!(sealing.implementation(), sealer);
                let mut in_place = plaintext.clone();
                let tag = sealing.seal(counter, &mut in_place);
                assert_eq!(
                    (&in_place, tag),
                    (&expected, expected_tag),
                    "{sealer:?} {size} B in place"
                );
                let mut out = vec![0xee; size];
                let tag = sealing.seal_into(counter, &plaintext, &mut out);
                assert_eq!(
                    (&out, tag),
                    (&expected, expected_tag),
                    "{sealer:?} {size} B into"
                );

                let mut sealed = expected.clone();
                sealed.extend_from_slice(&expected_tag);
                for opener in Implementation::available() {
                    let mut opening = TransportKey::with(opener, &key);
                    let mut buf = sealed.clone();
                    assert_eq!(
                        opening.open(counter, &mut buf),
                        Ok(size),
                        "{opener:?} {size} B"
                    );
                    assert_eq!(&buf[..size], &plaintext[..], "{opener:?} {size} B in place");
                    let mut out = vec![0xee; size + TAG_LEN + 3];
                    assert_eq!(opening.open_into(counter, &sealed, &mut out), Ok(size));
                    assert_eq!(&out[..size], &plaintext[..], "{opener:?} {size} B into");
                }
            }
        }
    }

    /// A key alternating between sealing and opening keeps working, and a failed open in
    /// between leaves it usable.
    #[test]
    fn a_key_switches_between_sealing_and_opening() {
        for implementation in Implementation::available() {
            let mut key = TransportKey::with(implementation, &test_key());
            for counter in 0..6u64 {
                let plaintext = bytes(counter, 100 + counter as usize);
                let mut buf = plaintext.clone();
                let tag = key.seal(counter, &mut buf);
                buf.extend_from_slice(&tag);
                if counter % 2 == 1 {
                    let mut bad = buf.clone();
                    bad[3] ^= 0x80;
                    assert_eq!(key.open(counter, &mut bad), Err(AeadError::Unauthentic));
                }
                assert_eq!(
                    key.open(counter, &mut buf),
                    Ok(plaintext.len()),
                    "{implementation:?}"
                );
                assert_eq!(&buf[..plaintext.len()], &plaintext[..]);
            }
        }
    }

    /// Tampering is refused by every implementation, in place and into a buffer, and the
    /// output is zeroed either way.
    #[test]
    fn every_implementation_refuses_tampering_and_zeroes() {
        let key = test_key();
        let plaintext = bytes(9, 1420);
        let mut sealed = plaintext.clone();
        let tag = TransportKey::with(Implementation::Ring, &key).seal(5, &mut sealed);
        sealed.extend_from_slice(&tag);
        for implementation in Implementation::available() {
            let mut receiver = TransportKey::with(implementation, &key);
            for flip in [0, 700, 1419, 1420, 1435] {
                let mut bad = sealed.clone();
                bad[flip] ^= 1;
                let mut out = vec![0xee; bad.len()];
                assert_eq!(
                    receiver.open_into(5, &bad, &mut out),
                    Err(AeadError::Unauthentic)
                );
                assert!(
                    out.iter().all(|b| *b == 0),
                    "{implementation:?} byte {flip}"
                );
                assert_eq!(receiver.open(5, &mut bad), Err(AeadError::Unauthentic));
                assert!(
                    bad.iter().all(|b| *b == 0),
                    "{implementation:?} byte {flip}"
                );
            }
            let mut short = vec![0; sealed.len() - 1];
            assert_eq!(
                receiver.open_into(5, &sealed, &mut short),
                Err(AeadError::TooShort)
            );
            assert_eq!(
                receiver.open_into(5, &sealed[..15], &mut short),
                Err(AeadError::TooShort)
            );
            let mut out = vec![0; sealed.len()];
            assert_eq!(receiver.open_into(5, &sealed, &mut out), Ok(1420));
        }
    }

    #[test]
    fn implementation_names_parse_and_bad_ones_are_named() {
        assert_eq!(Implementation::parse("auto"), Ok(None));
        for &implementation in Implementation::ALL {
            assert_eq!(
                Implementation::parse(implementation.name()),
                Ok(Some(implementation))
            );
        }
        let err = Implementation::parse("fast").expect_err("not a name");
        assert!(
            err.starts_with("\"fast\" is not an AEAD implementation (expected one of: auto, ring"),
            "{err}"
        );
        assert!(Implementation::Ring.is_available());
    }

    #[test]
    fn a_near_tie_goes_to_the_preferred_implementation() {
        use Implementation::{AwsLc, Ring};
        assert_eq!(
            pick(&[(Ring, 1000), (AwsLc, 1020)]),
            AwsLc,
            "2 % apart: a tie"
        );
        assert_eq!(
            pick(&[(Ring, 1000), (AwsLc, 1050)]),
            Ring,
            "5 % apart: ring"
        );
        assert_eq!(pick(&[(AwsLc, 990), (Ring, 1000)]), AwsLc);
        #[cfg(target_arch = "x86_64")]
        {
            use Implementation::Avx512;
            assert_eq!(pick(&[(Avx512, 700), (AwsLc, 1000), (Ring, 1000)]), Avx512);
            assert_eq!(pick(&[(AwsLc, 1000), (Avx512, 1010)]), Avx512);
            assert_eq!(pick(&[(Ring, 900), (Avx512, 1000)]), Ring);
        }
        assert_eq!(pick(&[]), Ring);
    }

    #[test]
    fn the_process_choice_is_built_in_and_says_why() {
        let choice = choice();
        assert!(Implementation::ALL.contains(&choice.implementation));
        assert!(!choice.reason.is_empty());
        assert_eq!(
            TransportKey::new(&test_key()).implementation(),
            choice.implementation
        );
    }
}
