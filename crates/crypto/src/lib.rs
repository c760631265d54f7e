//! Key material for tunneld: WireGuard private, public and preshared keys.
//!
//! Keys are 32 bytes, written as standard base64 (44 characters) exactly like `wg genkey`,
//! `wg pubkey` and `wg genpsk`. Secret keys zeroize on drop and never print themselves:
//! their `Debug` shows only that they are secret. This crate does no networking.
//!
//! [`aead`] is WireGuard's transport AEAD (ChaCha20-Poly1305 on data messages, in place or
//! into a buffer, on ring's code or the crate's own AVX-512 code).

// Unsafe code is refused except in `aead::avx512` (SIMD intrinsics, behind a CPU check).
#![deny(unsafe_code)]
// Input from the network, config files and the UAPI socket must never panic: no unwrap or
// expect outside tests (an invariant that cannot fail says so with an `allow` and a reason).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod aead;
mod keyfile;
mod keys;

pub use keys::{hex, parse_hex_key};

pub use keyfile::{read_key_file, read_secret_file, KeyFileError};
pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey, KEY_LEN};
