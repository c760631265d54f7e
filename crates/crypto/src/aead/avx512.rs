//! ChaCha20-Poly1305 (RFC 8439) with AVX-512. ChaCha20 runs 16 blocks at once (8 for a short
//! tail), one block per 32-bit lane, and transposes them into keystream blocks. Poly1305 takes
//! the blocks 8 at a time in 8 lanes, in 44-bit limbs with IFMA ([`lanes44`]) or 26-bit limbs
//! without ([`lanes`]), and the rest in scalar 64-bit limbs. Only used where the CPU has
//! AVX-512F, BW and VL; checked byte for byte against ring by the tests in `aead.rs`, and
//! the two vector Poly1305s against the scalar one by the tests here.
//!
//! Per message: block 0 is the Poly1305 key, blocks 1.. encrypt the data; the tag covers the
//! associated data and the ciphertext, each padded to 16 bytes, and the two lengths
//! (WireGuard's data messages have no associated data and a nonce of 4 zero bytes and the
//! message counter; the tests also run RFC 8439's and Wycheproof's nonces and associated
//! data through the same code). Opening in place authenticates the whole ciphertext before
//! any of it is overwritten. Messages of more than 15 blocks, on CPUs with IFMA, BMI2 and ADX, run scalar
//! Poly1305 between the ChaCha20 rounds ([`open_stitched`] from another buffer, which
//! writes the plaintext before the tag is checked and leaves zeroing it to the caller;
//! [`seal_stitched`]).

#![allow(unsafe_code)]

use super::TAG_LEN;
use core::arch::x86_64::*;
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

pub struct Key {
    /// The key as ChaCha20's eight little-endian words.
    words: [u32; 8],
    paths: Paths,
}

/// Which variants of the code a key runs. [`Key::new`] takes what this CPU runs best; a
/// test may choose ([`Key::with_paths`]), so that every variant meets the same vectors
/// whatever this CPU prefers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paths {
    /// The vector Poly1305 in 44-bit limbs with AVX-512 IFMA ([`lanes44`]), else in 26-bit
    /// limbs ([`lanes`]).
    pub ifma: bool,
    /// Messages of more than 15 blocks go through [`seal_stitched`] and [`open_stitched`],
    /// which need BMI2 and ADX for their scalar Poly1305. [`Key::new`] sets it only with
    /// IFMA too (the vector Poly1305 they end with is then the 44-bit one, and IFMA CPUs are
    /// where they were measured); a test may set it without.
    pub stitch: bool,
    /// Fewest full blocks of ciphertext that go through the vector Poly1305:
    /// [`VECTOR_MIN_BLOCKS`], but a test may lower it so that short vectors reach it too.
    pub vector_min_blocks: usize,
}

impl Paths {
    /// What this CPU runs best; `None` without AVX-512F, BW and VL.
    pub fn detected() -> Option<Self> {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl"))
        {
            return None;
        }
        let ifma = is_x86_feature_detected!("avx512ifma");
        Some(Self {
            ifma,
            stitch: ifma && is_x86_feature_detected!("bmi2") && is_x86_feature_detected!("adx"),
            vector_min_blocks: VECTOR_MIN_BLOCKS,
        })
    }

    /// The CPU features these paths need that this CPU lacks (none when it runs them).
    #[cfg(test)]
    pub fn missing(self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        let mut need = |wanted: bool, name: &'static str, present: bool| {
            if wanted && !present {
                missing.push(name);
            }
        };
        need(true, "avx512f", is_x86_feature_detected!("avx512f"));
        need(true, "avx512bw", is_x86_feature_detected!("avx512bw"));
        need(true, "avx512vl", is_x86_feature_detected!("avx512vl"));
        need(
            self.ifma,
            "avx512ifma",
            is_x86_feature_detected!("avx512ifma"),
        );
        need(self.stitch, "bmi2", is_x86_feature_detected!("bmi2"));
        need(self.stitch, "adx", is_x86_feature_detected!("adx"));
        missing
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.words.zeroize();
    }
}

impl Key {
    /// `None` unless this CPU runs the AVX-512 code; the paths this CPU runs best.
    pub fn new(key: &[u8; 32]) -> Option<Self> {
        Some(Self::from_parts(key, Paths::detected()?))
    }

    /// A key on `paths` whatever this CPU prefers (tests only), or the CPU features it lacks
    /// for them.
    #[cfg(test)]
    pub fn with_paths(key: &[u8; 32], paths: Paths) -> Result<Self, String> {
        let missing = paths.missing();
        if missing.is_empty() {
            Ok(Self::from_parts(key, paths))
        } else {
            Err(format!("this CPU lacks {}", missing.join(", ")))
        }
    }

    /// Only once the CPU was checked for `paths`: every `unsafe` call below relies on it.
    fn from_parts(key: &[u8; 32], paths: Paths) -> Self {
        Self {
            words: std::array::from_fn(|i| {
                u32::from_le_bytes([key[4 * i], key[4 * i + 1], key[4 * i + 2], key[4 * i + 3]])
            }),
            paths,
        }
    }

    /// The paths this key runs.
    #[cfg(test)]
    pub fn paths(&self) -> Paths {
        self.paths
    }

    /// Encrypts `input` into `out` (the same length), or `out` in place when `input` is
    /// `None`, and returns the tag over `aad` and the ciphertext. `None` for a message too
    /// long for ChaCha20's counter.
    pub fn seal(
        &mut self,
        nonce: &[u8; 12],
        aad: &[u8],
        input: Option<&[u8]>,
        out: &mut [u8],
    ) -> Option<[u8; TAG_LEN]> {
        let len = out.len();
        if input.is_some_and(|i| i.len() != len) || len > MAX_MESSAGE {
            return None;
        }
        // In place, both pointers come from the one mutable borrow.
        let dst = out.as_mut_ptr();
        let src = input.map_or(dst.cast_const(), <[u8]>::as_ptr);
        if self.paths.stitch && len > 15 * 64 {
            // SAFETY: as below, with the features `stitch` stands for.
            return Some(unsafe { seal_stitched(self, nonce, aad, src, dst, len) });
        }
        // SAFETY: the key was made for `paths` on a CPU that runs them (`new`, `with_paths`);
        // `src` and `dst` are `len` bytes each, and are either the same buffer or do not
        // overlap (distinct borrows).
        Some(unsafe { crypt(self, nonce, aad, src, dst, len, Direction::Seal) })
    }

    /// Decrypts `input` into `out` (or `out` in place) and checks `tag` over `aad` and the
    /// ciphertext: whether it authenticates. The caller zeroes `out` when it does not.
    pub fn open(
        &mut self,
        nonce: &[u8; 12],
        aad: &[u8],
        input: Option<&[u8]>,
        out: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        let len = out.len();
        if input.is_some_and(|i| i.len() != len) || len > MAX_MESSAGE {
            return false;
        }
        let dst = out.as_mut_ptr();
        let computed = match input {
            // SAFETY: the key was made on a CPU with the features `stitch` stands for;
            // `input` and `out` are `len` bytes each and do not overlap (distinct borrows).
            Some(input) if self.paths.stitch && len > 15 * 64 => unsafe {
                open_stitched(self, nonce, aad, input.as_ptr(), dst, len)
            },
            // SAFETY: as in `seal`.
            _ => unsafe {
                let src = input.map_or(dst.cast_const(), <[u8]>::as_ptr);
                crypt(self, nonce, aad, src, dst, len, Direction::Open)
            },
        };
        // Constant time by construction: `subtle` compares every byte and hides the result
        // from the optimiser, which could otherwise turn a hand-written fold into an early exit.
        computed.ct_eq(tag).into()
    }
}

/// Longest message the 32-bit block counter covers, with room for the key block.
const MAX_MESSAGE: usize = (u32::MAX as usize - 32) * 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Seal,
    Open,
}

/// Encrypts or decrypts `len` bytes from `src` to `dst` (which may be the same address) and
/// returns the Poly1305 tag over `aad` and the ciphertext.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL, and IFMA if `key.paths.ifma` is set; `src` is readable
/// and `dst` writable for `len` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn crypt(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    src: *const u8,
    dst: *mut u8,
    len: usize,
    direction: Direction,
) -> [u8; TAG_LEN] {
    let state = State::new(&key.words, nonce);
    let mut poly_key = PolyKey([0; 32]);
    let mut tag = [0u8; TAG_LEN];
    let mut done = 0;
    let mut block = 0u32;
    loop {
        let first = block == 0;
        // Block 0 of the first batch is the Poly1305 key; data starts after it.
        let skip = usize::from(first);
        let chunk = (len - done).min((16 - skip) * 64);
        // 8 blocks when they cover what is left: a 1420-byte message takes 16 + 8, not 32.
        let (blocks, count) = if (skip * 64 + chunk) <= 8 * 64 {
            (state.keystream8(block, &mut Idle), 8)
        } else {
            (state.keystream16(block, &mut Idle), 16)
        };
        if first {
            key_words(blocks[0], &mut poly_key);
            if direction == Direction::Open {
                // The ciphertext is authenticated before any of it is overwritten.
                // SAFETY: `len` bytes of `src` are readable, and nothing was written yet.
                tag = poly1305(
                    &poly_key.0,
                    aad,
                    unsafe { std::slice::from_raw_parts(src, len) },
                    key.paths,
                );
            }
        }
        // SAFETY: `done + chunk` bytes of both buffers are in bounds.
        unsafe { xor_keystream(&blocks[skip..count], src, dst, done, chunk) };
        done += chunk;
        block += count as u32;
        if done == len {
            break;
        }
    }
    if direction == Direction::Seal {
        // SAFETY: all `len` bytes of `dst` were just written.
        tag = poly1305(
            &poly_key.0,
            aad,
            unsafe { std::slice::from_raw_parts(dst, len) },
            key.paths,
        );
    }
    tag
}

/// Opens `len` bytes (more than 15 blocks) from `src` into another buffer `dst`, hashing the
/// ciphertext in scalar code between the ChaCha20 rounds ([`ScalarHash`]): the rounds keep
/// the vector units busy, the hash the integer multiplier, so they overlap. The first batch
/// is 8 blocks, so that the key the hash needs comes early and the 16-block batch after it
/// can hide the hash; what the scalar hash has not reached when the keystream ends goes
/// through the vector Poly1305. The plaintext is written before the tag is known: the caller
/// zeroes it when the tag does not match. On Zen 4 a 1420-byte open took 496 ns against 548
/// in `crypt`, 4 KiB 1203 against 1386.
///
/// # Safety
/// As [`crypt`], with BMI2 and ADX; `dst` does not overlap `src`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,bmi2,adx")]
unsafe fn open_stitched(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> [u8; TAG_LEN] {
    #[cfg(test)]
    reached::note(|r| r.open_stitched += 1);
    let state = State::new(&key.words, nonce);
    let first = state.keystream8(0, &mut BeforeKey);
    let mut poly = poly_for(first[0]);
    poly.update_padded(aad);
    // SAFETY: `len` bytes of `src` are readable, and `dst` does not overlap them.
    let ciphertext = unsafe { std::slice::from_raw_parts(src, len) };
    let mut done = 7 * 64;
    // SAFETY: `len` is above 15 blocks, so the first 7 blocks' bytes are in bounds.
    unsafe { xor_keystream(&first[1..8], src, dst, 0, done) };
    let mut hash = ScalarHash {
        h: poly.h,
        r: [poly.r0, poly.r1, poly.s1],
        data: ciphertext,
        next: 0,
    };
    let mut block = 8u32;
    while done < len {
        let count = batch_blocks(len - done);
        let blocks = if count == 8 {
            state.keystream8(block, &mut hash)
        } else {
            state.keystream16(block, &mut hash)
        };
        let chunk = (len - done).min(count * 64);
        // SAFETY: `done + chunk` bytes of both buffers are in bounds.
        unsafe { xor_keystream(&blocks[..count], src, dst, done, chunk) };
        done += chunk;
        block += count as u32;
    }
    poly.h = hash.h;
    // SAFETY: this function's AVX-512F, and IFMA where `key.paths.ifma` is set.
    unsafe { tag_from(&mut poly, aad.len(), ciphertext, hash.next, key.paths) }
}

/// Seals `len` bytes (more than 15 blocks) from `src` to `dst` (which may be the same
/// address), hashing in scalar code, between the rounds of each batch after the first, the
/// ciphertext that earlier batches wrote; the rest goes through the vector Poly1305. Only
/// what the first batch wrote can hide under a 1420-byte message's second, 8-block batch,
/// so this gains less than opening: on Zen 4, 511 ns against 541 in `crypt`, 4 KiB 1217
/// against 1382.
///
/// # Safety
/// As [`crypt`], with BMI2 and ADX.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,bmi2,adx")]
unsafe fn seal_stitched(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> [u8; TAG_LEN] {
    #[cfg(test)]
    reached::note(|r| r.seal_stitched += 1);
    let state = State::new(&key.words, nonce);
    let first = state.keystream16(0, &mut BeforeKey);
    let mut poly = poly_for(first[0]);
    poly.update_padded(aad);
    let mut done = 15 * 64;
    // SAFETY: `len` is above 15 blocks, so the first 15 blocks' bytes are in bounds.
    unsafe { xor_keystream(&first[1..16], src, dst, 0, done) };
    let (mut h, mut hashed) = (poly.h, 0);
    let mut block = 16u32;
    while done < len {
        let count = batch_blocks(len - done);
        // SAFETY: the first `done` bytes of `dst` are written, and nothing writes them
        // while the hash reads them (this batch writes from `done` on).
        let mut hash = SealHash(ScalarHash {
            h,
            r: [poly.r0, poly.r1, poly.s1],
            data: unsafe { std::slice::from_raw_parts(dst.cast_const(), done) },
            next: hashed,
        });
        let blocks = if count == 8 {
            state.keystream8(block, &mut hash)
        } else {
            state.keystream16(block, &mut hash)
        };
        (h, hashed) = (hash.0.h, hash.0.next);
        let chunk = (len - done).min(count * 64);
        // SAFETY: `done + chunk` bytes of both buffers are in bounds.
        unsafe { xor_keystream(&blocks[..count], src, dst, done, chunk) };
        done += chunk;
        block += count as u32;
    }
    poly.h = h;
    // SAFETY: all `len` bytes of `dst` are written; this function's AVX-512F, and IFMA
    // where `key.paths.ifma` is set.
    unsafe {
        tag_from(
            &mut poly,
            aad.len(),
            std::slice::from_raw_parts(dst, len),
            hashed,
            key.paths,
        )
    }
}

/// How many keystream blocks the stitched paths make next for `remaining` bytes: 8 when they
/// fit, otherwise 16.
#[inline(always)]
fn batch_blocks(remaining: usize) -> usize {
    if remaining.div_ceil(64) <= 8 {
        8
    } else {
        16
    }
}

/// XORs `chunk` bytes at `offset` of `src` with the keystream `blocks` into `dst`.
///
/// # Safety
/// `offset + chunk` bytes of `src` are readable and of `dst` writable, and `blocks` has at
/// least `chunk` bytes of keystream.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn xor_keystream(
    blocks: &[__m512i],
    src: *const u8,
    dst: *mut u8,
    offset: usize,
    chunk: usize,
) {
    for (i, ks) in blocks.iter().enumerate() {
        let at = i * 64;
        if at >= chunk {
            break;
        }
        let n = (chunk - at).min(64);
        let mask: __mmask64 = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        // SAFETY: bytes `offset + at .. offset + at + n` are in bounds of both buffers; the
        // masked load and store touch no other byte.
        unsafe {
            let data = _mm512_maskz_loadu_epi8(mask, src.add(offset + at).cast());
            _mm512_mask_storeu_epi8(
                dst.add(offset + at).cast(),
                mask,
                _mm512_xor_si512(data, *ks),
            );
        }
    }
}

/// Writes the one-time Poly1305 key from keystream block 0 into `key`: its four
/// little-endian words taken from the register (through a 64-byte stack copy, stored, read
/// back 8 bytes at a time and zeroed, each message took about 20 ns more on Zen 4).
#[inline]
#[target_feature(enable = "avx512f")]
fn key_words(block: __m512i, key: &mut PolyKey) {
    let low = _mm512_castsi512_si128(block);
    let high = _mm512_extracti32x4_epi32::<1>(block);
    let words = [
        _mm_cvtsi128_si64(low) as u64,
        _mm_extract_epi64::<1>(low) as u64,
        _mm_cvtsi128_si64(high) as u64,
        _mm_extract_epi64::<1>(high) as u64,
    ];
    for (bytes, word) in key.0.chunks_exact_mut(8).zip(words) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
}

/// The Poly1305 state for the message whose keystream block 0 is `block`.
#[inline]
#[target_feature(enable = "avx512f")]
fn poly_for(block: __m512i) -> Poly1305 {
    let mut key = PolyKey([0; 32]);
    key_words(block, &mut key);
    Poly1305::new(&key.0)
}

struct PolyKey([u8; 32]);

impl Drop for PolyKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// The AEAD's tag over `aad` and `ciphertext`: Poly1305 over each padded to 16 bytes, then
/// the two lengths. Runs of 8 ciphertext blocks go through the vector code when there are
/// enough of them to pay for its set-up (`paths.vector_min_blocks`); `paths.ifma` picks the
/// 44-bit code for them.
#[target_feature(enable = "avx512f")]
fn poly1305(key: &[u8; 32], aad: &[u8], ciphertext: &[u8], paths: Paths) -> [u8; TAG_LEN] {
    // A local `Poly1305`: handed in by reference, a 1420-byte seal took 20 ns longer.
    let mut poly = Poly1305::new(key);
    poly.update_padded(aad);
    // SAFETY: this function's AVX-512F, and the key's CPU check covered IFMA where
    // `paths.ifma` is set.
    unsafe { tag_from(&mut poly, aad.len(), ciphertext, 0, paths) }
}

/// As [`poly1305`], from `poly`, which has taken the `aad_len` bytes of associated data
/// (padded) and the first `hashed` blocks of `ciphertext` already.
///
/// # Safety
/// The CPU has AVX-512F, and AVX-512 IFMA if `paths.ifma` is set.
#[inline(always)]
unsafe fn tag_from(
    poly: &mut Poly1305,
    aad_len: usize,
    ciphertext: &[u8],
    hashed: usize,
    paths: Paths,
) -> [u8; TAG_LEN] {
    let rest = &ciphertext[hashed * 16..];
    let full = rest.len() / 16;
    let vector = if full >= paths.vector_min_blocks {
        full / 8 * 8
    } else {
        0
    };
    if vector > 0 {
        let runs = &rest[..vector * 16];
        #[cfg(test)]
        reached::note(|r| {
            if paths.ifma {
                r.lanes44 += 1;
            } else {
                r.lanes26 += 1;
            }
        });
        // SAFETY: as this function's.
        poly.h = unsafe {
            if paths.ifma {
                lanes44::blocks(poly.h, poly.r0, poly.r1, runs)
            } else {
                lanes::blocks(poly.h, poly.r0, poly.r1, runs)
            }
        };
    }
    poly.update_padded(&rest[vector * 16..]);
    poly.block(aad_len as u64, ciphertext.len() as u64);
    poly.finish()
}

/// Which code the messages of a test reached (tests only): the vector Poly1305s and the
/// stitched paths run only for messages long enough, so a test counts what its vectors
/// reached rather than assume it. Per thread, as the test harness runs each test on its own.
#[cfg(test)]
pub mod reached {
    use std::cell::Cell;

    /// How many messages went through each.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct Reached {
        pub lanes44: usize,
        pub lanes26: usize,
        pub seal_stitched: usize,
        pub open_stitched: usize,
    }

    thread_local!(static REACHED: Cell<Reached> = Cell::new(Reached::default()));

    pub(super) fn note(count: impl FnOnce(&mut Reached)) {
        REACHED.with(|cell| {
            let mut reached = cell.get();
            count(&mut reached);
            cell.set(reached);
        });
    }

    /// What this thread reached since the last call.
    pub fn take() -> Reached {
        REACHED.with(Cell::take)
    }
}

/// Fewest full blocks worth the vector code's set-up (the powers r² … r⁸): measured on an
/// AVX-512 Intel core, from 384 bytes the 44-bit (IFMA) code wins (240 against 264 ns per
/// seal) and the 26-bit code is even with the scalar one.
pub(super) const VECTOR_MIN_BLOCKS: usize = 24;

/// Work run between ChaCha20's double rounds: it must be inlined (`#[inline(always)]`), or
/// every call spills the whole ChaCha20 state (no vector register survives a call).
trait Between {
    fn step(&mut self);
}

/// Nothing between the rounds.
struct Idle;

impl Between for Idle {
    #[inline(always)]
    fn step(&mut self) {}
}

/// Nothing between the rounds either: the first batch of [`open_stitched`] and
/// [`seal_stitched`], which makes the key the hash needs. A type of its own so that
/// `crypt`'s `keystream8::<Idle>` and `keystream16::<Idle>` keep a single caller: with two,
/// LLVM stopped inlining them, and every seal called one and copied its 1 KiB of blocks
/// (10 % slower).
struct BeforeKey;

impl Between for BeforeKey {
    #[inline(always)]
    fn step(&mut self) {}
}

/// One Poly1305 block a step, in scalar code, over the full blocks of `data` from `next`.
/// Plain values rather than a [`Poly1305`], which is wiped when dropped and so kept in
/// memory: a store and a load in the chain of dependent multiplies cost more than the
/// overlap gained. The key's copies here live in registers and the stack frame only.
struct ScalarHash<'a> {
    h: [u64; 3],
    r: [u64; 3],
    data: &'a [u8],
    next: usize,
}

impl Between for ScalarHash<'_> {
    #[inline(always)]
    fn step(&mut self) {
        if let Some(block) = self.data.get(self.next * 16..self.next * 16 + 16) {
            self.h = poly_block(self.h, self.r, le64(&block[..8]), le64(&block[8..]));
            self.next += 1;
        }
    }
}

/// [`ScalarHash`] for [`seal_stitched`]: a type of its own for the reason [`BeforeKey`] has
/// one (each keystream instantiation keeps a single caller, and so is inlined).
struct SealHash<'a>(ScalarHash<'a>);

impl Between for SealHash<'_> {
    #[inline(always)]
    fn step(&mut self) {
        self.0.step();
    }
}

/// Scalar Poly1305 blocks run per double round: about what hides under one double round
/// on Zen 4 (a block is about 4 ns; 16 blocks' double round about 20 ns, 8 blocks' 12 ns).
/// In the 16-block batch, a 1420-byte open gained 2 % with 3, 10 % with 4, and with 5 was
/// slower than without; in the 8-block batch, a 1420-byte seal gained 4 % with 3, less
/// with 2 or 4.
const STEPS_PER_ROUND_16: usize = 4;
const STEPS_PER_ROUND_8: usize = 3;

/// One ChaCha20 double round over sixteen state words held in any vector width.
macro_rules! double_round {
    ($x:ident, $add:ident, $xor:ident, $rol:ident) => {
        macro_rules! quarter {
            ($a:literal, $b:literal, $c:literal, $d:literal) => {
                $x[$a] = $add($x[$a], $x[$b]);
                $x[$d] = $rol::<16>($xor($x[$d], $x[$a]));
                $x[$c] = $add($x[$c], $x[$d]);
                $x[$b] = $rol::<12>($xor($x[$b], $x[$c]));
                $x[$a] = $add($x[$a], $x[$b]);
                $x[$d] = $rol::<8>($xor($x[$d], $x[$a]));
                $x[$c] = $add($x[$c], $x[$d]);
                $x[$b] = $rol::<7>($xor($x[$b], $x[$c]));
            };
        }
        quarter!(0, 4, 8, 12);
        quarter!(1, 5, 9, 13);
        quarter!(2, 6, 10, 14);
        quarter!(3, 7, 11, 15);
        quarter!(0, 5, 10, 15);
        quarter!(1, 6, 11, 12);
        quarter!(2, 7, 8, 13);
        quarter!(3, 4, 9, 14);
    };
}

/// ChaCha20's initial state for one message (the block counter aside).
struct State {
    words: [u32; 16],
}

impl State {
    fn new(key: &[u32; 8], nonce: &[u8; 12]) -> Self {
        let mut words = [0u32; 16];
        words[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
        words[4..12].copy_from_slice(key);
        // Word 12 is the block counter, set per batch; words 13..16 the nonce (WireGuard's:
        // 4 zero bytes, then the 64-bit little-endian message counter).
        for (word, bytes) in words[13..].iter_mut().zip(nonce.chunks_exact(4)) {
            *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Self { words }
    }

    /// Keystream blocks `first .. first + 16`, one block per register.
    #[target_feature(enable = "avx512f")]
    fn keystream16<B: Between>(&self, first: u32, between: &mut B) -> [__m512i; 16] {
        let mut init: [__m512i; 16] =
            std::array::from_fn(|i| _mm512_set1_epi32(self.words[i] as i32));
        init[12] = _mm512_add_epi32(
            _mm512_set1_epi32(first as i32),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        );
        let mut x = init;
        for _ in 0..10 {
            double_round!(x, _mm512_add_epi32, _mm512_xor_si512, _mm512_rol_epi32);
            for _ in 0..STEPS_PER_ROUND_16 {
                between.step();
            }
        }
        for (w, i) in x.iter_mut().zip(init) {
            *w = _mm512_add_epi32(*w, i);
        }
        transpose16(x)
    }

    /// Keystream blocks `first .. first + 8`, one block per register (the other 8 unused).
    #[target_feature(enable = "avx512f,avx512vl")]
    fn keystream8<B: Between>(&self, first: u32, between: &mut B) -> [__m512i; 16] {
        let mut init: [__m256i; 16] =
            std::array::from_fn(|i| _mm256_set1_epi32(self.words[i] as i32));
        init[12] = _mm256_add_epi32(
            _mm256_set1_epi32(first as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut x = init;
        for _ in 0..10 {
            double_round!(x, _mm256_add_epi32, _mm256_xor_si256, _mm256_rol_epi32);
            for _ in 0..STEPS_PER_ROUND_8 {
                between.step();
            }
        }
        for (w, i) in x.iter_mut().zip(init) {
            *w = _mm256_add_epi32(*w, i);
        }
        let halves = transpose8(x);
        let mut blocks = [_mm512_setzero_si512(); 16];
        for (b, block) in blocks[..8].iter_mut().enumerate() {
            *block =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(halves[2 * b]), halves[2 * b + 1]);
        }
        blocks
    }
}

/// From word-major (register i holds word i of blocks 0..16) to block-major (register b holds
/// block b's 16 words in order).
#[target_feature(enable = "avx512f")]
fn transpose16(x: [__m512i; 16]) -> [__m512i; 16] {
    // 4×4 transposes inside each 128-bit lane: afterwards lane c of y[4g + j] holds words
    // 4g..4g+4 of block 4c + j.
    let mut y = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let t0 = _mm512_unpacklo_epi32(x[4 * g], x[4 * g + 1]);
        let t1 = _mm512_unpackhi_epi32(x[4 * g], x[4 * g + 1]);
        let t2 = _mm512_unpacklo_epi32(x[4 * g + 2], x[4 * g + 3]);
        let t3 = _mm512_unpackhi_epi32(x[4 * g + 2], x[4 * g + 3]);
        y[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        y[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        y[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        y[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // Then a 4×4 transpose of 128-bit lanes across y[j], y[4 + j], y[8 + j], y[12 + j].
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let (r0, r1, r2, r3) = (y[j], y[4 + j], y[8 + j], y[12 + j]);
        let u0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(r0, r1);
        let u1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(r0, r1);
        let u2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(r2, r3);
        let u3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(r2, r3);
        out[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(u0, u2);
        out[4 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(u0, u2);
        out[8 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(u1, u3);
        out[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(u1, u3);
    }
    out
}

/// The same for 8 blocks in 256-bit registers: register 2b holds words 0..8 of block b and
/// register 2b + 1 words 8..16.
#[target_feature(enable = "avx2")]
fn transpose8(x: [__m256i; 16]) -> [__m256i; 16] {
    // As above: lane c of y[4g + j] holds words 4g..4g+4 of block 4c + j.
    let mut y = [_mm256_setzero_si256(); 16];
    for g in 0..4 {
        let t0 = _mm256_unpacklo_epi32(x[4 * g], x[4 * g + 1]);
        let t1 = _mm256_unpackhi_epi32(x[4 * g], x[4 * g + 1]);
        let t2 = _mm256_unpacklo_epi32(x[4 * g + 2], x[4 * g + 3]);
        let t3 = _mm256_unpackhi_epi32(x[4 * g + 2], x[4 * g + 3]);
        y[4 * g] = _mm256_unpacklo_epi64(t0, t2);
        y[4 * g + 1] = _mm256_unpackhi_epi64(t0, t2);
        y[4 * g + 2] = _mm256_unpacklo_epi64(t1, t3);
        y[4 * g + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
    let mut out = [_mm256_setzero_si256(); 16];
    for j in 0..4 {
        out[2 * j] = _mm256_permute2x128_si256::<0x20>(y[j], y[4 + j]);
        out[2 * j + 1] = _mm256_permute2x128_si256::<0x20>(y[8 + j], y[12 + j]);
        out[2 * (4 + j)] = _mm256_permute2x128_si256::<0x31>(y[j], y[4 + j]);
        out[2 * (4 + j) + 1] = _mm256_permute2x128_si256::<0x31>(y[8 + j], y[12 + j]);
    }
    out
}

/// Poly1305 in 64-bit limbs: h = h0 + h1·2⁶⁴ + h2·2¹²⁸, kept below 2¹³¹ between blocks.
struct Poly1305 {
    r0: u64,
    r1: u64,
    /// r1 + r1/4: multiplying by it folds 2¹²⁸ ≡ 5/4 (mod 2¹³⁰ − 5) into the low limbs.
    s1: u64,
    h: [u64; 3],
    pad: [u64; 2],
}

impl Drop for Poly1305 {
    fn drop(&mut self) {
        self.r0.zeroize();
        self.r1.zeroize();
        self.s1.zeroize();
        self.h.zeroize();
        self.pad.zeroize();
    }
}

/// h0 + h1·2⁶⁴ + h2·2¹²⁸ with its bits from 2¹³⁰ up folded back in times 5 (2¹³⁰ ≡ 5 mod
/// 2¹³⁰ − 5): the result's top limb is at most 4.
fn fold(h0: u64, h1: u64, h2: u64) -> [u64; 3] {
    let t0 = u128::from(h0) + u128::from((h2 >> 2) * 5);
    let t1 = u128::from(h1) + (t0 >> 64);
    [t0 as u64, t1 as u64, (h2 & 3) + (t1 >> 64) as u64]
}

fn le64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

impl Poly1305 {
    /// From the 32 bytes of `key`: r (clamped) and the pad s.
    fn new(key: &[u8; 32]) -> Self {
        let r0 = le64(&key[0..8]) & 0x0fff_fffc_0fff_ffff;
        let r1 = le64(&key[8..16]) & 0x0fff_fffc_0fff_fffc;
        Self {
            r0,
            r1,
            s1: r1 + (r1 >> 2),
            h: [0; 3],
            pad: [le64(&key[16..24]), le64(&key[24..32])],
        }
    }

    /// Every 16 bytes of `data` as a block, the last one padded with zeros (as the AEAD pads
    /// the ciphertext).
    fn update_padded(&mut self, data: &[u8]) {
        let mut blocks = data.chunks_exact(16);
        for b in &mut blocks {
            self.block(le64(&b[..8]), le64(&b[8..]));
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 16];
            last[..rest.len()].copy_from_slice(rest);
            self.block(le64(&last[..8]), le64(&last[8..]));
        }
    }

    /// h = (h + m + 2¹²⁸) · r, partly reduced.
    #[inline(always)]
    fn block(&mut self, m0: u64, m1: u64) {
        self.h = poly_block(self.h, [self.r0, self.r1, self.s1], m0, m1);
    }

    /// `message` as plain Poly1305 takes it (RFC 8439 §2.5; tests only): whole blocks as
    /// [`block`](Self::block) does, a last partial one followed by a 1 byte and zeros, with
    /// no 2¹²⁸ added.
    #[cfg(test)]
    fn update_raw(&mut self, message: &[u8]) {
        let mut blocks = message.chunks_exact(16);
        for b in &mut blocks {
            self.block(le64(&b[..8]), le64(&b[8..]));
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 16];
            last[..rest.len()].copy_from_slice(rest);
            last[rest.len()] = 1;
            let r = [self.r0, self.r1, self.s1];
            self.h = poly_block_with(self.h, r, le64(&last[..8]), le64(&last[8..]), 0);
        }
    }

    /// The tag: h fully reduced mod 2¹³⁰ − 5, plus s, mod 2¹²⁸.
    fn finish(&mut self) -> [u8; TAG_LEN] {
        // Fold what is above 2¹³⁰ once more, so h < 2¹³⁰ + 5·small < 2·p.
        let [h0, h1, h2] = fold(self.h[0], self.h[1], self.h[2]);
        // h − p = h + 5 − 2¹³⁰: take it when h + 5 reaches 2¹³⁰, without branching.
        let g = u128::from(h0) + 5;
        let g1 = u128::from(h1) + (g >> 64);
        let g2 = h2 + (g1 >> 64) as u64;
        let take = 0u64.wrapping_sub(g2 >> 2);
        let h0 = (h0 & !take) | (g as u64 & take);
        let h1 = (h1 & !take) | (g1 as u64 & take);
        let t = u128::from(h0) + u128::from(self.pad[0]);
        let t1 = u128::from(h1) + u128::from(self.pad[1]) + (t >> 64);
        let mut tag = [0u8; TAG_LEN];
        tag[..8].copy_from_slice(&(t as u64).to_le_bytes());
        tag[8..].copy_from_slice(&(t1 as u64).to_le_bytes());
        tag
    }
}

/// One Poly1305 block: (h + m + 2¹²⁸) · r, partly reduced, for `r` = [r0, r1, s1] as in
/// [`Poly1305`].
#[inline(always)]
fn poly_block(h: [u64; 3], r: [u64; 3], m0: u64, m1: u64) -> [u64; 3] {
    poly_block_with(h, r, m0, m1, 1)
}

/// (h + m + `high`·2¹²⁸) · r: `high` is 1 but for the last, partial block of a plain
/// Poly1305 message (RFC 8439 §2.5), which the tests feed RFC 8439's vectors through.
#[inline(always)]
fn poly_block_with(h: [u64; 3], r: [u64; 3], m0: u64, m1: u64, high: u64) -> [u64; 3] {
    let [h0, h1, h2] = h;
    let t = u128::from(h0) + u128::from(m0);
    let h0 = t as u64;
    let t = u128::from(h1) + u128::from(m1) + (t >> 64);
    let h1 = t as u64;
    let h2 = h2 + (t >> 64) as u64 + high;
    let (r0, r1, s1) = (u128::from(r[0]), u128::from(r[1]), u128::from(r[2]));
    let d0 = u128::from(h0) * r0 + u128::from(h1) * s1;
    // h2 is at most 6 and s1 below 1.25·2⁶⁰: their product fits a 64-bit multiply, one
    // fewer of the wide ones that bound this code.
    let d1 = u128::from(h0) * r1 + u128::from(h1) * r0 + u128::from(h2 * r[2]) + (d0 >> 64);
    let d2 = h2 * r[0] + (d1 >> 64) as u64;
    fold(d0 as u64, d1 as u64, d2)
}

/// Lanes of `b` where `mask` has a bit, of `a` elsewhere, limb by limb.
#[target_feature(enable = "avx512f")]
fn blend<const N: usize>(mask: __mmask8, a: &[__m512i; N], b: &[__m512i; N]) -> [__m512i; N] {
    std::array::from_fn(|i| _mm512_mask_blend_epi64(mask, a[i], b[i]))
}

/// Lane `j` of each limb, in every lane.
#[target_feature(enable = "avx512f")]
fn lane<const N: usize>(v: &[__m512i; N], j: i64) -> [__m512i; N] {
    let index = _mm512_set1_epi64(j);
    std::array::from_fn(|i| _mm512_permutexvar_epi64(index, v[i]))
}

/// From r⁵ … r⁸ in lanes 0..4 of `high` and r … r⁴ in lanes 0..4 of `low`: r⁸ … r¹ across
/// the lanes, the multipliers that end the 8-lane Horner sums.
#[target_feature(enable = "avx512f")]
fn descending<const N: usize>(high: &[__m512i; N], low: &[__m512i; N]) -> [__m512i; N] {
    let reverse = _mm512_setr_epi64(3, 2, 1, 0, 11, 10, 9, 8);
    std::array::from_fn(|i| _mm512_permutex2var_epi64(high[i], reverse, low[i]))
}

/// The low and the high 64-bit words of 8 Poly1305 blocks (128 bytes), block j in lane j.
#[target_feature(enable = "avx512f")]
fn words(chunk: &[u8]) -> (__m512i, __m512i) {
    assert_eq!(chunk.len(), 128, "8 blocks");
    // SAFETY: 128 bytes are readable.
    let (a, b) = unsafe {
        (
            _mm512_loadu_si512(chunk.as_ptr().cast()),
            _mm512_loadu_si512(chunk.as_ptr().add(64).cast()),
        )
    };
    (
        _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), b),
        _mm512_permutex2var_epi64(a, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), b),
    )
}

/// Poly1305 over runs of 8 blocks, one block per 64-bit lane, in 26-bit limbs: lane j takes
/// blocks j, j + 8, j + 16, … by Horner's rule in r⁸, and at the end is multiplied by r^(8 − j)
/// and summed with the others, which gives the same h as block-by-block Horner in r.
mod lanes {
    use super::{blend, descending, lane, words};
    use core::arch::x86_64::*;

    const M26: u64 = (1 << 26) - 1;
    type Limbs = [u64; 5];

    /// The number lo + hi·2⁶⁴ + top·2¹²⁸ in 26-bit limbs.
    fn to26(lo: u64, hi: u64, top: u64) -> Limbs {
        [
            lo & M26,
            (lo >> 26) & M26,
            ((lo >> 52) | (hi << 12)) & M26,
            (hi >> 14) & M26,
            (hi >> 40) | (top << 24),
        ]
    }

    /// The low 32 bits of each 64-bit lane of `a` times those of `b`. Written as the one
    /// instruction because LLVM lowers `_mm512_mul_epu32` of a broadcast operand as a full
    /// 64-bit multiply (three multiplies and four shifts) when it cannot see its upper half
    /// is unused.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn mul32(a: __m512i, b: __m512i) -> __m512i {
        let product: __m512i;
        // SAFETY: one register-only AVX-512F instruction, in a function that requires AVX-512F.
        unsafe {
            core::arch::asm!(
                "vpmuludq {p}, {a}, {b}",
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                p = lateout(zmm_reg) product,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        product
    }

    /// h·r per lane (s = 5·r), partly reduced.
    #[target_feature(enable = "avx512f")]
    fn mul(h: [__m512i; 5], r: &[__m512i; 5], s: &[__m512i; 5]) -> [__m512i; 5] {
        // Macros rather than closures: a closure would not inherit the target features.
        macro_rules! m {
            ($a:expr, $b:expr) => {
                mul32($a, $b)
            };
        }
        macro_rules! sum {
            ($a:expr, $b:expr, $c:expr, $d:expr, $e:expr) => {
                _mm512_add_epi64(
                    _mm512_add_epi64(_mm512_add_epi64($a, $b), _mm512_add_epi64($c, $d)),
                    $e,
                )
            };
        }
        let d0 = sum!(
            m!(h[0], r[0]),
            m!(h[1], s[4]),
            m!(h[2], s[3]),
            m!(h[3], s[2]),
            m!(h[4], s[1])
        );
        let d1 = sum!(
            m!(h[0], r[1]),
            m!(h[1], r[0]),
            m!(h[2], s[4]),
            m!(h[3], s[3]),
            m!(h[4], s[2])
        );
        let d2 = sum!(
            m!(h[0], r[2]),
            m!(h[1], r[1]),
            m!(h[2], r[0]),
            m!(h[3], s[4]),
            m!(h[4], s[3])
        );
        let d3 = sum!(
            m!(h[0], r[3]),
            m!(h[1], r[2]),
            m!(h[2], r[1]),
            m!(h[3], r[0]),
            m!(h[4], s[4])
        );
        let d4 = sum!(
            m!(h[0], r[4]),
            m!(h[1], r[3]),
            m!(h[2], r[2]),
            m!(h[3], r[1]),
            m!(h[4], r[0])
        );
        let add = _mm512_add_epi64;
        let mask = _mm512_set1_epi64(M26 as i64);
        let d1 = add(d1, _mm512_srli_epi64::<26>(d0));
        let d2 = add(d2, _mm512_srli_epi64::<26>(d1));
        let d3 = add(d3, _mm512_srli_epi64::<26>(d2));
        let d4 = add(d4, _mm512_srli_epi64::<26>(d3));
        let c = _mm512_srli_epi64::<26>(d4);
        let h0 = add(
            _mm512_and_si512(d0, mask),
            add(c, _mm512_slli_epi64::<2>(c)),
        );
        [
            _mm512_and_si512(h0, mask),
            add(_mm512_and_si512(d1, mask), _mm512_srli_epi64::<26>(h0)),
            _mm512_and_si512(d2, mask),
            _mm512_and_si512(d3, mask),
            _mm512_and_si512(d4, mask),
        ]
    }

    /// 5·v, limb by limb.
    #[target_feature(enable = "avx512f")]
    fn times5(v: &[__m512i; 5]) -> [__m512i; 5] {
        std::array::from_fn(|i| _mm512_add_epi64(v[i], _mm512_slli_epi64::<2>(v[i])))
    }

    /// 8 blocks (128 bytes) as limbs, lane j holding block j, with the 2¹²⁸ bit set.
    #[target_feature(enable = "avx512f")]
    fn load(chunk: &[u8]) -> [__m512i; 5] {
        let (lo, hi) = words(chunk);
        let mask = _mm512_set1_epi64(M26 as i64);
        [
            _mm512_and_si512(lo, mask),
            _mm512_and_si512(_mm512_srli_epi64::<26>(lo), mask),
            _mm512_and_si512(
                _mm512_or_si512(_mm512_srli_epi64::<52>(lo), _mm512_slli_epi64::<12>(hi)),
                mask,
            ),
            _mm512_and_si512(_mm512_srli_epi64::<14>(hi), mask),
            _mm512_or_si512(_mm512_srli_epi64::<40>(hi), _mm512_set1_epi64(1 << 24)),
        ]
    }

    /// h after `data`, a whole number of 8-block runs, from `start` (h0 + h1·2⁶⁴ + h2·2¹²⁸
    /// with h2 at most 4, as the scalar code leaves it), for the clamped r = r0 + r1·2⁶⁴;
    /// returned in the same form.
    #[target_feature(enable = "avx512f")]
    pub fn blocks(start: [u64; 3], r0: u64, r1: u64, data: &[u8]) -> [u64; 3] {
        // The powers r … r⁸, three vector multiplies deep: r² in every lane, then r³ and r⁴
        // in alternate lanes, then r⁵ … r⁸.
        let r = to26(r0, r1, 0);
        let p1: [__m512i; 5] = std::array::from_fn(|i| _mm512_set1_epi64(r[i] as i64));
        let p2 = mul(p1, &p1, &times5(&p1));
        let alternate = blend(0b1010_1010, &p1, &p2);
        let p34 = mul(p2, &alternate, &times5(&alternate));
        let p4 = lane(&p34, 1);
        // Lanes 0..4 and 4..8 each hold r, r², r³, r⁴.
        let low = blend(0b1100_1100, &blend(0b0010_0010, &p1, &p2), &p34);
        let high = mul(p4, &low, &times5(&low));
        // r⁸ in every lane for the loop; r⁸ … r¹ across the lanes for the end.
        let step = lane(&high, 3);
        let step5 = times5(&step);
        let last = descending(&high, &low);
        let last5 = times5(&last);
        let mut chunks = data.chunks_exact(128);
        let mut h = match chunks.next() {
            Some(chunk) => load(chunk),
            None => return start,
        };
        // The start joins the first block, in lane 0.
        for (limb, s) in h.iter_mut().zip(to26(start[0], start[1], start[2])) {
            *limb = _mm512_add_epi64(*limb, _mm512_maskz_set1_epi64(1, s as i64));
        }
        for chunk in chunks {
            let m = load(chunk);
            let hr = mul(h, &step, &step5);
            for i in 0..5 {
                h[i] = _mm512_add_epi64(hr[i], m[i]);
            }
        }
        // Lane j times r^(8 − j).
        let h = mul(h, &last, &last5);
        let t: [u64; 5] = std::array::from_fn(|i| _mm512_reduce_add_epi64(h[i]) as u64);
        // Σ tᵢ·2^(26i), each tᵢ below 2³⁰: the top limb's bits from 2¹²⁸ up go to h2.
        let low = u128::from(t[0])
            + (u128::from(t[1]) << 26)
            + (u128::from(t[2]) << 52)
            + (u128::from(t[3]) << 78);
        let (sum, over) = low.overflowing_add(u128::from(t[4] & ((1 << 24) - 1)) << 104);
        super::fold(
            sum as u64,
            (sum >> 64) as u64,
            (t[4] >> 24) + u64::from(over),
        )
    }
}

/// The same 8-lane Poly1305 in 44-bit limbs with the 52-bit multiply-add instructions
/// (AVX-512 IFMA): 18 multiply-adds per 8 blocks where the 26-bit limbs take 25 multiplies
/// and 20 adds.
mod lanes44 {
    use super::{blend, descending, lane, words};
    use core::arch::x86_64::*;

    const M44: u64 = (1 << 44) - 1;
    const M42: u64 = (1 << 42) - 1;
    type Vec3 = [__m512i; 3];

    /// (h·r) per lane, partly reduced; `s` is 20·r (2¹³² ≡ 20 mod 2¹³⁰ − 5).
    #[target_feature(enable = "avx512f,avx512ifma")]
    fn mul(h: &Vec3, r: &Vec3, s: &Vec3) -> Vec3 {
        let z = _mm512_setzero_si512();
        macro_rules! sum {
            ($f:ident, $a0:expr, $b0:expr, $a1:expr, $b1:expr, $a2:expr, $b2:expr) => {
                $f($f($f(z, $a0, $b0), $a1, $b1), $a2, $b2)
            };
        }
        let lo0 = sum!(_mm512_madd52lo_epu64, h[0], r[0], h[1], s[2], h[2], s[1]);
        let hi0 = sum!(_mm512_madd52hi_epu64, h[0], r[0], h[1], s[2], h[2], s[1]);
        let lo1 = sum!(_mm512_madd52lo_epu64, h[0], r[1], h[1], r[0], h[2], s[2]);
        let hi1 = sum!(_mm512_madd52hi_epu64, h[0], r[1], h[1], r[0], h[2], s[2]);
        let lo2 = sum!(_mm512_madd52lo_epu64, h[0], r[2], h[1], r[1], h[2], r[0]);
        let hi2 = sum!(_mm512_madd52hi_epu64, h[0], r[2], h[1], r[1], h[2], r[0]);
        let m44 = _mm512_set1_epi64(M44 as i64);
        // Each dᵢ is loᵢ + hiᵢ·2⁵²; carry into 44, 44 and 42 bits, the top folding in times 5.
        let c = _mm512_add_epi64(_mm512_srli_epi64::<44>(lo0), _mm512_slli_epi64::<8>(hi0));
        let t0 = _mm512_and_si512(lo0, m44);
        let lo1 = _mm512_add_epi64(lo1, c);
        let c = _mm512_add_epi64(_mm512_srli_epi64::<44>(lo1), _mm512_slli_epi64::<8>(hi1));
        let t1 = _mm512_and_si512(lo1, m44);
        let lo2 = _mm512_add_epi64(lo2, c);
        let c = _mm512_add_epi64(_mm512_srli_epi64::<42>(lo2), _mm512_slli_epi64::<10>(hi2));
        let t2 = _mm512_and_si512(lo2, _mm512_set1_epi64(M42 as i64));
        let t0 = _mm512_add_epi64(t0, _mm512_add_epi64(c, _mm512_slli_epi64::<2>(c)));
        [
            _mm512_and_si512(t0, m44),
            _mm512_add_epi64(t1, _mm512_srli_epi64::<44>(t0)),
            t2,
        ]
    }

    /// 20·v, limb by limb.
    #[target_feature(enable = "avx512f")]
    fn times20(v: &Vec3) -> Vec3 {
        std::array::from_fn(|i| {
            let x4 = _mm512_slli_epi64::<2>(v[i]);
            _mm512_add_epi64(x4, _mm512_slli_epi64::<2>(x4))
        })
    }

    /// 8 blocks (128 bytes) as 44-bit limbs, lane j holding block j, with the 2¹²⁸ bit set.
    #[target_feature(enable = "avx512f")]
    fn load(chunk: &[u8]) -> Vec3 {
        let (lo, hi) = words(chunk);
        let m44 = _mm512_set1_epi64(M44 as i64);
        [
            _mm512_and_si512(lo, m44),
            _mm512_and_si512(
                _mm512_or_si512(_mm512_srli_epi64::<44>(lo), _mm512_slli_epi64::<20>(hi)),
                m44,
            ),
            _mm512_or_si512(_mm512_srli_epi64::<24>(hi), _mm512_set1_epi64(1 << 40)),
        ]
    }

    /// As `lanes::blocks`, on CPUs with AVX-512 IFMA.
    #[target_feature(enable = "avx512f,avx512ifma")]
    pub fn blocks(start: [u64; 3], r0: u64, r1: u64, data: &[u8]) -> [u64; 3] {
        let r = [r0 & M44, ((r0 >> 44) | (r1 << 20)) & M44, r1 >> 24];
        let p1: Vec3 = std::array::from_fn(|i| _mm512_set1_epi64(r[i] as i64));
        let p2 = mul(&p1, &p1, &times20(&p1));
        let alternate = blend(0b1010_1010, &p1, &p2);
        let p34 = mul(&p2, &alternate, &times20(&alternate));
        let p4 = lane(&p34, 1);
        let low = blend(0b1100_1100, &blend(0b0010_0010, &p1, &p2), &p34);
        let high = mul(&p4, &low, &times20(&low));
        let step = lane(&high, 3);
        let step20 = times20(&step);
        let last = descending(&high, &low);
        let last20 = times20(&last);
        let mut chunks = data.chunks_exact(128);
        let mut h = match chunks.next() {
            Some(chunk) => load(chunk),
            None => return start,
        };
        // The start joins the first block, in lane 0 (its top limb below 2⁴³, well inside
        // the 52 bits the multiply-adds take).
        let start = [
            start[0] & M44,
            ((start[0] >> 44) | (start[1] << 20)) & M44,
            (start[1] >> 24) | (start[2] << 40),
        ];
        for (limb, s) in h.iter_mut().zip(start) {
            *limb = _mm512_add_epi64(*limb, _mm512_maskz_set1_epi64(1, s as i64));
        }
        for chunk in chunks {
            let m = load(chunk);
            let hr = mul(&h, &step, &step20);
            for i in 0..3 {
                h[i] = _mm512_add_epi64(hr[i], m[i]);
            }
        }
        let h = mul(&h, &last, &last20);
        let t: [u64; 3] = std::array::from_fn(|i| _mm512_reduce_add_epi64(h[i]) as u64);
        // t0 + t1·2⁴⁴ + t2·2⁸⁸, each tᵢ below 2⁴⁸: t2's bits from 2¹²⁸ up go to h2.
        let low = u128::from(t[0]) + (u128::from(t[1]) << 44);
        let (sum, over) = low.overflowing_add(u128::from(t[2] & ((1 << 40) - 1)) << 88);
        super::fold(
            sum as u64,
            (sum >> 64) as u64,
            (t[2] >> 40) + u64::from(over),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bytes, cannot_run, hex};
    use super::*;

    /// Both vector Poly1305s (26-bit limbs, and 44-bit limbs with IFMA where the CPU has it)
    /// give the scalar code's tag for runs of 8 blocks, with random keys and data, from zero
    /// and from where the scalar code left h after a few blocks (as `open_stitched` hands
    /// over). The AEAD tests in `aead.rs` go through whichever one this CPU picks; this
    /// reaches both.
    #[test]
    fn vector_poly1305_matches_the_scalar_code_in_both_limb_sizes() {
        let test = "vector_poly1305_matches_the_scalar_code_in_both_limb_sizes";
        let Some(ifma) = vector_poly1305s(test) else {
            return;
        };
        for case in 0..200u64 {
            let mut key: [u8; 32] = bytes(case, 32).try_into().expect("32 bytes");
            if case % 5 == 0 {
                // The largest r clamping allows: the largest products the carries must hold.
                key[..16].fill(0xff);
            }
            let mut data = bytes(case + 1000, 128 * (1 + case as usize % 24));
            if case % 7 == 0 {
                // All-ones blocks: the largest limbs the carries must hold.
                data.fill(0xff);
            }
            // Blocks the scalar code takes first, then the vector code from its h.
            let head = 16 * (case as usize % 11);
            let mut lead = bytes(case + 2000, head);
            if case % 7 == 0 {
                lead.fill(0xff);
            }
            let mut scalar = Poly1305::new(&key);
            scalar.update_padded(&lead);
            scalar.update_padded(&data);
            let expected = scalar.finish();
            let mut narrow = Poly1305::new(&key);
            narrow.update_padded(&lead);
            // SAFETY: AVX-512F checked above.
            narrow.h = unsafe { lanes::blocks(narrow.h, narrow.r0, narrow.r1, &data) };
            assert_eq!(narrow.finish(), expected, "26-bit limbs, case {case}");
            if ifma {
                let mut wide = Poly1305::new(&key);
                wide.update_padded(&lead);
                // SAFETY: AVX-512F and IFMA checked above.
                wide.h = unsafe { lanes44::blocks(wide.h, wide.r0, wide.r1, &data) };
                assert_eq!(wide.finish(), expected, "44-bit limbs, case {case}");
            }
        }
    }

    /// Which vector Poly1305s this CPU runs: `None` for neither (no AVX-512F), else whether
    /// the 44-bit one too (IFMA). Says what it cannot run ([`cannot_run`]).
    fn vector_poly1305s(test: &str) -> Option<bool> {
        if !is_x86_feature_detected!("avx512f") {
            cannot_run(test, "the vector Poly1305s", "this CPU lacks avx512f");
            return None;
        }
        let ifma = is_x86_feature_detected!("avx512ifma");
        if !ifma {
            cannot_run(
                test,
                "the 44-bit (IFMA) vector Poly1305",
                "this CPU lacks avx512ifma",
            );
        }
        Some(ifma)
    }

    /// A Poly1305 vector: its name, one-time key, message and tag.
    type PolyVector = (&'static str, Vec<u8>, Vec<u8>, Vec<u8>);

    /// RFC 8439 Appendix A.3's Poly1305 vectors: one-time key (r, then s), message, tag, as
    /// the RFC prints them (checked once against pyca/cryptography, i.e. OpenSSL, when they
    /// were written out). #5 to #11 are the RFC's additional edge cases for the reduction
    /// modulo p = 2¹³⁰ − 5 (an accumulator between p and 2¹³⁰, carries across the limbs).
    fn rfc8439_a3() -> Vec<PolyVector> {
        let ietf = b"Any submission to the IETF intended by the Contributor for publication as \
                     all or part of an IETF Internet-Draft or RFC and any statement made within \
                     the context of an IETF activity is considered an \"IETF Contribution\". \
                     Such statements include oral statements in IETF sessions, as well as \
                     written and electronic communications made at any time or place, which \
                     are addressed to";
        let jabberwocky = b"'Twas brillig, and the slithy toves\nDid gyre and gimble in the \
                            wabe:\nAll mimsy were the borogoves,\nAnd the mome raths outgrabe.";
        assert_eq!((ietf.len(), jabberwocky.len()), (375, 127));
        let zeros = "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";
        let ones = "ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff";
        let r2 = "02 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";
        let r1 = "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";
        let r10 = "01 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00";
        let m10 = "e3 35 94 d7 50 5e 43 b9 00 00 00 00 00 00 00 00
                   33 94 d7 50 5e 43 79 cd 01 00 00 00 00 00 00 00
                   00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";
        let key = |r: &str, s: &str| hex(&format!("{r} {s}"));
        vec![
            ("#1", vec![0; 32], vec![0; 64], vec![0; 16]),
            (
                "#2",
                key(zeros, "36 e5 f6 b5 c5 e0 60 70 f0 ef ca 96 22 7a 86 3e"),
                ietf.to_vec(),
                hex("36 e5 f6 b5 c5 e0 60 70 f0 ef ca 96 22 7a 86 3e"),
            ),
            (
                "#3",
                key("36 e5 f6 b5 c5 e0 60 70 f0 ef ca 96 22 7a 86 3e", zeros),
                ietf.to_vec(),
                hex("f3 47 7e 7c d9 54 17 af 89 a6 b8 79 4c 31 0c f0"),
            ),
            (
                "#4",
                key(
                    "1c 92 40 a5 eb 55 d3 8a f3 33 88 86 04 f6 b5 f0",
                    "47 39 17 c1 40 2b 80 09 9d ca 5c bc 20 70 75 c0",
                ),
                jabberwocky.to_vec(),
                hex("45 41 66 9a 7e aa ee 61 e7 08 dc 7c bc c5 eb 62"),
            ),
            (
                "#5",
                key(r2, zeros),
                hex(ones),
                hex("03 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
            ),
            (
                "#6",
                key(r2, ones),
                hex(r2),
                hex("03 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
            ),
            (
                "#7",
                key(r1, zeros),
                hex(&format!(
                    "{ones} f0 ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff
                     11 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
                )),
                hex("05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
            ),
            (
                "#8",
                key(r1, zeros),
                hex(&format!(
                    "{ones} fb fe fe fe fe fe fe fe fe fe fe fe fe fe fe fe
                     01 01 01 01 01 01 01 01 01 01 01 01 01 01 01 01"
                )),
                vec![0; 16],
            ),
            (
                "#9",
                key(r2, zeros),
                hex("fd ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff"),
                hex("fa ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff"),
            ),
            (
                "#10",
                key(r10, zeros),
                hex(&format!(
                    "{m10} 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
                )),
                hex("14 00 00 00 00 00 00 00 55 00 00 00 00 00 00 00"),
            ),
            (
                "#11",
                key(r10, zeros),
                hex(m10),
                hex("13 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
            ),
        ]
    }

    /// The scalar Poly1305 (the AEAD's blocks outside the vector runs, and its final
    /// reduction on every path) gives RFC 8439's tag for every A.3 vector.
    #[test]
    fn rfc8439_poly1305_vectors_on_the_scalar_code() {
        let vectors = rfc8439_a3();
        for (name, key, message, tag) in &vectors {
            let mut poly = Poly1305::new(key[..].try_into().expect("32 bytes"));
            poly.update_raw(message);
            assert_eq!(&poly.finish()[..], &tag[..], "A.3 {name}");
        }
        println!(
            "scalar Poly1305: RFC 8439 A.3: {0} run, {0} passed",
            vectors.len()
        );
    }

    /// Both vector Poly1305s give RFC 8439's tag for the A.3 vectors long enough for them (8
    /// whole blocks or more: #2 and #3), from each of the 8 places a run of 8 blocks can
    /// start (the scalar code taking the blocks before and after, as in the AEAD). The
    /// others are shorter than one run.
    #[test]
    fn rfc8439_poly1305_vectors_on_both_vector_poly1305s() {
        let test = "rfc8439_poly1305_vectors_on_both_vector_poly1305s";
        let Some(ifma) = vector_poly1305s(test) else {
            return;
        };
        let vectors = rfc8439_a3();
        let long: Vec<_> = vectors.iter().filter(|v| v.2.len() / 16 >= 8).collect();
        for (limbs, run) in [(26, true), (44, ifma)] {
            if !run {
                continue;
            }
            for (name, key, message, tag) in &long {
                let full = message.len() / 16;
                for head in 0..8 {
                    let runs = (full - head) / 8 * 8;
                    let mut poly = Poly1305::new(key[..].try_into().expect("32 bytes"));
                    poly.update_raw(&message[..16 * head]);
                    let vector = &message[16 * head..16 * (head + runs)];
                    // SAFETY: AVX-512F checked, and IFMA for the 44-bit limbs.
                    poly.h = unsafe {
                        if limbs == 44 {
                            lanes44::blocks(poly.h, poly.r0, poly.r1, vector)
                        } else {
                            lanes::blocks(poly.h, poly.r0, poly.r1, vector)
                        }
                    };
                    poly.update_raw(&message[16 * (head + runs)..]);
                    assert_eq!(
                        &poly.finish()[..],
                        &tag[..],
                        "A.3 {name}, {limbs}-bit limbs, {runs} blocks from block {head}"
                    );
                }
            }
            println!(
                "{limbs}-bit vector Poly1305: RFC 8439 A.3: {0} run (each from 8 offsets), {0} \
                 passed, {1} not applicable (fewer than 8 whole blocks: {2})",
                long.len(),
                vectors.len() - long.len(),
                vectors
                    .iter()
                    .filter(|v| v.2.len() / 16 < 8)
                    .map(|v| v.0)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }

    /// The RFC's edge cases are 1 to 4 blocks, shorter than the vector Poly1305's 8: these
    /// are built (not taken from the RFC) so that each vector Poly1305 hands the final
    /// reduction h = p + k, between p and 2¹³⁰ (k below 5), or 2¹³⁰ itself (k = 5). With
    /// r = 1 and s = 0, h is 8·2¹²⁸ plus the sum M of the 8 blocks, ≡ 10 + M (mod p, as
    /// 2¹³⁰ ≡ 5); three all-ones blocks and one of 2¹²⁸ − 12 + k make M = 2¹³⁰ − 15 + k, so
    /// h ≡ p + k and the tag is k.
    #[test]
    fn the_final_reduction_from_each_vector_poly1305_between_p_and_2_130() {
        let test = "the_final_reduction_from_each_vector_poly1305_between_p_and_2_130";
        let ifma = vector_poly1305s(test);
        let mut key = [0u8; 32];
        key[0] = 1;
        for k in 0..=5u8 {
            let mut message = [0u8; 128];
            message[..48].fill(0xff);
            message[48..64].fill(0xff);
            message[48] = 0xf4 + k;
            let mut tag = [0u8; 16];
            tag[0] = k;
            // p + k, or 2¹³⁰ for k = 5, in the form the vector code leaves h.
            let edge = if k < 5 {
                [u64::MAX - 4 + u64::from(k), u64::MAX, 3]
            } else {
                [0, 0, 4]
            };
            let mut scalar = Poly1305::new(&key);
            scalar.update_padded(&message);
            assert_eq!(scalar.finish(), tag, "scalar, k = {k}");
            let Some(ifma) = ifma else { continue };
            let mut narrow = Poly1305::new(&key);
            // SAFETY: AVX-512F checked.
            narrow.h = unsafe { lanes::blocks(narrow.h, narrow.r0, narrow.r1, &message) };
            assert_eq!(narrow.h, edge, "26-bit limbs hand over p + {k}");
            assert_eq!(narrow.finish(), tag, "26-bit limbs, k = {k}");
            if ifma {
                let mut wide = Poly1305::new(&key);
                // SAFETY: AVX-512F and IFMA checked.
                wide.h = unsafe { lanes44::blocks(wide.h, wide.r0, wide.r1, &message) };
                assert_eq!(wide.h, edge, "44-bit limbs hand over p + {k}");
                assert_eq!(wide.finish(), tag, "44-bit limbs, k = {k}");
            }
        }
    }
}
