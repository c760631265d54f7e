//! Key material for tunneld: WireGuard private, public and preshared keys.
//!
//! Keys are 32 bytes, written as standard base64 (44 characters) exactly like `wg genkey`,
//! `wg pubkey` and `wg genpsk`. Secret keys zeroize on drop and never print themselves:
//! their `Debug` shows only that they are secret. This crate does no networking.

#![forbid(unsafe_code)]

mod keyfile;
mod keys;

pub use keys::{hex, parse_hex_key};

pub use keyfile::{read_key_file, KeyFileError};
pub use keys::{KeyError, PresharedKey, PrivateKey, PublicKey, KEY_LEN};
