//! Key exchange groups beyond rustls's aws-lc-rs provider, which OpenSSL's servers offer by
//! default and which clients and conformance suites written against them (tlsfuzzer's
//! `ecdhe-curves`, `crfg-curves`, `ffdhe-*`, `dhe-shared-secret-padding`) use. A listener
//! offers them only when its `groups` lists them (opt-in; README, "TLS key exchange"):
//!
//! - secp521r1, on aws-lc's own ECDH (the provider offers P-256 and P-384 only);
//! - X448 (RFC 7748), on RustCrypto's `x448` (a Montgomery ladder with constant-time
//!   conditional swaps; no library in the tree had it), a pre-release whose README says it
//!   has not been audited;
//! - the finite-field groups ffdhe2048 to ffdhe8192 (RFC 7919), with rustls's copy of their
//!   parameters and `crypto-bigint`'s constant-time Montgomery exponentiation: the server's
//!   part costs up to 20-30 ms of CPU per ClientHello (`cargo bench -p tunneld-tls --bench
//!   groups`).
//!
//! Which group a handshake uses is chosen as `handshake.rs` says (a key share the client sent
//! first, else the listener's preferred group of the client's list).

use std::sync::OnceLock;

use aws_lc_rs::agreement;
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use rustls::crypto::{ActiveKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::ffdhe_groups::FfdheGroup;
use rustls::{Error, NamedGroup, PeerMisbehaved};
use zeroize::Zeroizing;

/// The groups of this module, in the order `LISTEN_GROUPS` lists them (after the provider's):
/// the elliptic curves, then the finite-field groups from the cheapest to the dearest.
pub static OPT_IN: [&dyn SupportedKxGroup; 7] = [
    SECP521R1, X448, FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192,
];

/// ECDHE on secp521r1 (NIST P-521), RFC 8446 4.2.8.2: uncompressed points only.
pub static SECP521R1: &dyn SupportedKxGroup = &P521;

#[derive(Debug)]
struct P521;

impl SupportedKxGroup for P521 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let private = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P521, &rng)
            .map_err(|_| Error::General("cannot make a P-521 key".into()))?;
        let public = private
            .compute_public_key()
            .map_err(|_| Error::General("cannot make a P-521 key".into()))?;
        Ok(Box::new(P521Exchange { private, public }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::secp521r1
    }
}

struct P521Exchange {
    private: agreement::EphemeralPrivateKey,
    public: agreement::PublicKey,
}

impl ActiveKeyExchange for P521Exchange {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        // aws-lc takes compressed points too, which TLS 1.3 does not allow.
        if peer.first() != Some(&0x04) {
            return Err(PeerMisbehaved::InvalidKeyShare.into());
        }
        let peer = agreement::UnparsedPublicKey::new(&agreement::ECDH_P521, peer);
        agreement::agree_ephemeral(
            self.private,
            peer,
            Error::from(PeerMisbehaved::InvalidKeyShare),
            |secret| Ok(SharedSecret::from(secret)),
        )
    }

    fn pub_key(&self) -> &[u8] {
        self.public.as_ref()
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::secp521r1
    }
}

/// X448 (RFC 7748 section 5; RFC 8446 4.2.8.2): 56-byte little-endian u-coordinates.
pub static X448: &dyn SupportedKxGroup = &X448Group;

#[derive(Debug)]
struct X448Group;

/// The length of an X448 scalar, public key and shared secret.
const X448_LEN: usize = 56;

impl SupportedKxGroup for X448Group {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let mut secret = Zeroizing::new([0u8; X448_LEN]);
        aws_lc_rs::rand::fill(&mut secret[..])
            .map_err(|_| Error::General("cannot make an X448 key".into()))?;
        Ok(Box::new(X448Exchange::new(secret)?))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X448
    }
}

struct X448Exchange {
    /// Clamped by `x448::x448` at each use (RFC 7748 decodeScalar448).
    secret: Zeroizing<[u8; X448_LEN]>,
    public: [u8; X448_LEN],
}

impl X448Exchange {
    fn new(secret: Zeroizing<[u8; X448_LEN]>) -> Result<X448Exchange, Error> {
        // The base point has the group's prime order: never refused.
        let public = x448::x448(*secret, x448::X448_BASEPOINT_BYTES)
            .ok_or_else(|| Error::General("cannot make an X448 key".into()))?;
        Ok(X448Exchange { secret, public })
    }
}

impl ActiveKeyExchange for X448Exchange {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        let peer: [u8; X448_LEN] = peer
            .try_into()
            .map_err(|_| Error::from(PeerMisbehaved::InvalidKeyShare))?;
        // `None` for a point of small order, whose result would be all zeros (RFC 7748
        // section 6.2, RFC 8446 7.4.2: a server must refuse it).
        let shared =
            Zeroizing::new(x448::x448(*self.secret, peer).ok_or(PeerMisbehaved::InvalidKeyShare)?);
        if shared.iter().all(|&b| b == 0) {
            return Err(PeerMisbehaved::InvalidKeyShare.into());
        }
        Ok(SharedSecret::from(&shared[..]))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X448
    }
}

/// ffdhe2048 (RFC 7919 appendix A.1).
pub static FFDHE2048: &dyn SupportedKxGroup = &FFDHE2048_GROUP;
static FFDHE2048_GROUP: Ffdhe =
    Ffdhe::new(NamedGroup::FFDHE2048, rustls::ffdhe_groups::FFDHE2048, 225);
/// ffdhe3072 (RFC 7919 appendix A.2).
pub static FFDHE3072: &dyn SupportedKxGroup = &FFDHE3072_GROUP;
static FFDHE3072_GROUP: Ffdhe =
    Ffdhe::new(NamedGroup::FFDHE3072, rustls::ffdhe_groups::FFDHE3072, 275);
/// ffdhe4096 (RFC 7919 appendix A.3).
pub static FFDHE4096: &dyn SupportedKxGroup = &FFDHE4096_GROUP;
static FFDHE4096_GROUP: Ffdhe =
    Ffdhe::new(NamedGroup::FFDHE4096, rustls::ffdhe_groups::FFDHE4096, 325);
/// ffdhe6144 (RFC 7919 appendix A.4).
pub static FFDHE6144: &dyn SupportedKxGroup = &FFDHE6144_GROUP;
static FFDHE6144_GROUP: Ffdhe =
    Ffdhe::new(NamedGroup::FFDHE6144, rustls::ffdhe_groups::FFDHE6144, 375);
/// ffdhe8192 (RFC 7919 appendix A.5).
pub static FFDHE8192: &dyn SupportedKxGroup = &FFDHE8192_GROUP;
static FFDHE8192_GROUP: Ffdhe =
    Ffdhe::new(NamedGroup::FFDHE8192, rustls::ffdhe_groups::FFDHE8192, 400);

/// A finite-field Diffie-Hellman group of RFC 7919, its parameters those rustls carries.
///
/// The private exponent is a short one (RFC 7919 section 5.2), of the length appendix A
/// gives each group (twice its estimated strength, rounded up): the modulus is a safe prime,
/// so no small subgroup but {1, p-1} is left to confine it to, and the peer's value is
/// checked against those. The exponentiation is `crypto-bigint`'s Montgomery `pow` with a
/// fixed window, whose time depends on the exponent's length (public), not its value.
struct Ffdhe {
    name: NamedGroup,
    group: FfdheGroup<'static>,
    /// Bits of the private exponent.
    exponent_bits: u32,
    /// The modulus's Montgomery parameters, made on first use.
    params: OnceLock<Option<BoxedMontyParams>>,
}

impl std::fmt::Debug for Ffdhe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ffdhe({:?})", self.name)
    }
}

impl Ffdhe {
    const fn new(name: NamedGroup, group: FfdheGroup<'static>, exponent_bits: u32) -> Ffdhe {
        Ffdhe {
            name,
            group,
            exponent_bits,
            params: OnceLock::new(),
        }
    }

    fn params(&self) -> Option<&BoxedMontyParams> {
        self.params
            .get_or_init(|| {
                let p = self.group.p;
                let p = BoxedUint::from_be_slice(p, bits_of(p.len())).ok()?;
                let p: Option<Odd<BoxedUint>> = Odd::new(p).into();
                Some(BoxedMontyParams::new_vartime(p?))
            })
            .as_ref()
    }
}

/// The precision of a number of `len` bytes.
fn bits_of(len: usize) -> u32 {
    u32::try_from(len * 8).unwrap_or(u32::MAX)
}

impl SupportedKxGroup for Ffdhe {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        // A random exponent of `exponent_bits` bits, its top bit set (at least 2^(n-1)).
        let mut random = Zeroizing::new(vec![0u8; self.exponent_bits.div_ceil(8) as usize]);
        aws_lc_rs::rand::fill(&mut random[..])
            .map_err(|_| Error::General("cannot make an FFDHE key".into()))?;
        let spare = random.len() as u32 * 8 - self.exponent_bits;
        random[0] &= 0xff >> spare;
        random[0] |= 0x80 >> spare;
        Ok(Box::new(self.exchange(&random)?))
    }

    fn ffdhe_group(&self) -> Option<FfdheGroup<'static>> {
        Some(self.group)
    }

    fn name(&self) -> NamedGroup {
        self.name
    }
}

impl Ffdhe {
    /// The exchange with the private exponent `exponent` (big-endian, under
    /// 2^`exponent_bits`).
    fn exchange(&self, exponent: &[u8]) -> Result<FfdheExchange, Error> {
        let unknown = || Error::General(format!("bad parameters for {:?}", self.name));
        let (group, params) = (self.group, self.params().ok_or_else(unknown)?);
        let len = group.p.len();
        let bits = bits_of(len);
        let exponent = BoxedUint::from_be_slice(exponent, bits)
            .map_err(|_| Error::General("cannot make an FFDHE key".into()))?;
        let g = BoxedUint::from_be_slice(group.g, bits).map_err(|_| unknown())?;
        let public = BoxedMontyForm::new(g, params)
            .pow_bounded_exp(&exponent, self.exponent_bits)
            .retrieve();
        Ok(FfdheExchange {
            name: self.name,
            group,
            params: params.clone(),
            exponent: Zeroizing::new(exponent),
            exponent_bits: self.exponent_bits,
            public: padded(&public, len),
        })
    }
}

/// `n` big-endian, left-padded with zeros to `len` bytes (RFC 8446 4.2.8.1 and 7.4.1).
fn padded(n: &BoxedUint, len: usize) -> Vec<u8> {
    let bytes = n.to_be_bytes();
    let mut out = vec![0; len];
    let n = bytes.len().min(len);
    out[len - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    out
}

struct FfdheExchange {
    name: NamedGroup,
    group: FfdheGroup<'static>,
    params: BoxedMontyParams,
    exponent: Zeroizing<BoxedUint>,
    exponent_bits: u32,
    public: Vec<u8>,
}

impl ActiveKeyExchange for FfdheExchange {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        let len = self.group.p.len();
        // The key share is the value padded to the modulus's length (RFC 8446 4.2.8.1).
        if peer.len() != len {
            return Err(PeerMisbehaved::InvalidKeyShare.into());
        }
        let bits = bits_of(len);
        let invalid = || Error::from(PeerMisbehaved::InvalidKeyShare);
        let y = BoxedUint::from_be_slice(peer, bits).map_err(|_| invalid())?;
        let p = BoxedUint::from_be_slice(self.group.p, bits).map_err(|_| invalid())?;
        // 1 < y < p - 1 (RFC 7919 section 5.1; y is public).
        let two = BoxedUint::from_be_slice(&[2], bits).map_err(|_| invalid())?;
        let p_minus_one = p.wrapping_sub(BoxedUint::one_with_precision(bits));
        if y < two || y >= p_minus_one {
            return Err(invalid());
        }
        let shared = BoxedMontyForm::new(y, &self.params)
            .pow_bounded_exp(&self.exponent, self.exponent_bits)
            .retrieve();
        let shared = Zeroizing::new(padded(&shared, len));
        // Kept at the modulus's length, leading zeros and all (RFC 8446 7.4.1).
        Ok(SharedSecret::from(&shared[..]))
    }

    fn ffdhe_group(&self) -> Option<FfdheGroup<'static>> {
        Some(self.group)
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sides of an exchange agree, and a compressed or broken point is refused.
    #[test]
    fn p521_agrees_and_refuses_bad_points() {
        let (a, b) = (SECP521R1.start().unwrap(), SECP521R1.start().unwrap());
        let (a_pub, b_pub) = (a.pub_key().to_vec(), b.pub_key().to_vec());
        assert_eq!(a_pub.len(), 133);
        let (x, y) = (a.complete(&b_pub).unwrap(), b.complete(&a_pub).unwrap());
        assert_eq!(x.secret_bytes(), y.secret_bytes());
        assert_eq!(x.secret_bytes().len(), 66);
        let mut compressed = b_pub[..67].to_vec();
        compressed[0] = 0x02;
        assert!(SECP521R1.start().unwrap().complete(&compressed).is_err());
        let mut off_curve = b_pub.clone();
        off_curve[100] ^= 1;
        assert!(SECP521R1.start().unwrap().complete(&off_curve).is_err());
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn x448_of(scalar: &[u8], u: &[u8]) -> Result<Vec<u8>, Error> {
        let secret = Zeroizing::new(<[u8; X448_LEN]>::try_from(scalar).unwrap());
        let exchange = Box::new(X448Exchange::new(secret)?);
        Ok(exchange.complete(u)?.secret_bytes().to_vec())
    }

    /// RFC 7748 section 5.2's two vectors and its iterated one (1 and 1 000 turns), through
    /// the exchange the listener uses. (Checked against OpenSSL's X448, through
    /// pyca/cryptography, when they were written out.)
    #[test]
    fn x448_gives_rfc_7748s_vectors() {
        let vectors = [
            (
                "3d262fddf9ec8e88495266fea19a34d28882acef045104d0d1aae121700a779c984c24f8cdd78fbff44943eba368f54b29259a4f1c600ad3",
                "06fce640fa3487bfda5f6cf2d5263f8aad88334cbd07437f020f08f9814dc031ddbdc38c19c6da2583fa5429db94ada18aa7a7fb4ef8a086",
                "ce3e4ff95a60dc6697da1db1d85e6afbdf79b50a2412d7546d5f239fe14fbaadeb445fc66a01b0779d98223961111e21766282f73dd96b6f",
            ),
            (
                "203d494428b8399352665ddca42f9de8fef600908e0d461cb021f8c538345dd77c3e4806e25f46d3315c44e0a5b4371282dd2c8d5be3095f",
                "0fbcc2f993cd56d3305b0b7d9e55d4c1a8fb5dbb52f8e9a1e9b6201b165d015894e56c4d3570bee52fe205e28a78b91cdfbde71ce8d157db",
                "884a02576239ff7a2f2f63b2db6a9ff37047ac13568e1e30fe63c4a7ad1b3ee3a5700df34321d62077e63633c575c1c954514e99da7c179d",
            ),
        ];
        for (scalar, u, out) in vectors {
            assert_eq!(x448_of(&hex(scalar), &hex(u)).unwrap(), hex(out));
        }
        let (mut k, mut u) = (
            x448::X448_BASEPOINT_BYTES.to_vec(),
            x448::X448_BASEPOINT_BYTES.to_vec(),
        );
        for turn in 1..=1000 {
            let next = x448_of(&k, &u).unwrap();
            u = std::mem::replace(&mut k, next);
            if turn == 1 {
                assert_eq!(k, hex("3f482c8a9f19b01e6c46ee9711d9dc14fd4bf67af30765c2ae2b846a4d23a8cd0db897086239492caf350b51f833868b9bc2b3bca9cf4113"));
            }
        }
        assert_eq!(k, hex("aa3b4749d55b9daf1e5b00288826c467274ce3ebbdd5c17b975e09d4af6c67cf10d087202db88286e2b79fceea3ec353ef54faa26e219f38"));
    }

    /// RFC 7748 section 6.2: Alice's and Bob's public keys and their shared secret.
    #[test]
    fn x448_gives_rfc_7748s_exchange() {
        let alice = hex("9a8f4925d1519f5775cf46b04b5800d4ee9ee8bae8bc5565d498c28dd9c9baf574a9419744897391006382a6f127ab1d9ac2d8c0a598726b");
        let bob = hex("1c306a7ac2a0e2e0990b294470cba339e6453772b075811d8fad0d1d6927c120bb5ee8972b0d3e21374c9c921b09d1b0366f10b65173992d");
        let exchange = |k: &[u8]| X448Exchange::new(Zeroizing::new(k.try_into().unwrap())).unwrap();
        let (a, b) = (exchange(&alice), exchange(&bob));
        assert_eq!(a.pub_key(), hex("9b08f7cc31b7e3e67d22d5aea121074a273bd2b83de09c63faa73d2c22c5d9bbc836647241d953d40c5b12da88120d53177f80e532c41fa0"));
        assert_eq!(b.pub_key(), hex("3eb7a829b0cd20f5bcfc0b599b6feccf6da4627107bdb0d4f345b43027d8b972fc3e34fb4232a13ca706dcb57aec3dae07bdc1c67bf33609"));
        let shared = hex("07fff4181ac6cc95ec1c16a94a0f74d12da232ce40a77552281d282bb60c0b56fd2464c335543936521c24403085d59a449a5037514a879d");
        let b_pub = b.pub_key().to_vec();
        assert_eq!(Box::new(a).complete(&b_pub).unwrap().secret_bytes(), shared);
    }

    /// Random keys agree; a point of small order (u = 0, u = 1) and a share of the wrong
    /// length are refused.
    #[test]
    fn x448_agrees_and_refuses_bad_shares() {
        let (a, b) = (X448.start().unwrap(), X448.start().unwrap());
        let (a_pub, b_pub) = (a.pub_key().to_vec(), b.pub_key().to_vec());
        assert_ne!(a_pub, b_pub);
        assert_eq!(
            a.complete(&b_pub).unwrap().secret_bytes(),
            b.complete(&a_pub).unwrap().secret_bytes()
        );
        let mut one = [0u8; X448_LEN];
        one[0] = 1;
        for bad in [
            &[0u8; X448_LEN][..],
            &one[..],
            &a_pub[..55],
            &[a_pub.clone(), vec![0]].concat(),
        ] {
            assert!(X448.start().unwrap().complete(bad).is_err(), "{bad:?}");
        }
    }

    /// ffdhe2048 with a fixed exponent against a vector made apart (Python's `pow` on
    /// rustls's modulus): the public value, and a shared secret whose first byte is zero
    /// and stays (RFC 8446 7.4.1).
    #[test]
    fn ffdhe2048_gives_an_independent_vector() {
        let exponent = hex("019579dfcb7416aab2ed30ed24d33a184ee556e17d64ac9c1c6b894026");
        let exchange = FFDHE2048_GROUP.exchange(&exponent).unwrap();
        assert_eq!(exchange.pub_key(), hex("9f1f6a2c2f79483eadab29f2a95a94ed60e3e97de5d20d5ead1eb2a547c83ba078348711dc4dbdc7a2f549455699cd5160c8a097445b421648a8608256a19e2201db29df3410403b4723817fb3ae6165fdaec84617ba7232e123b02a86ac1cc02bf78de32b1692def73fbd669452405c054f3f53901693a91345f83bf75d029b53c315768c493887d1323de0271f3416bfa91d66476169f91f4b8cf2398ac0407267cc43f264e492702127569cdf5460a00a078acb9d4545e89c89219c7334f8e9af3ca0c39ec137066b6379fa2c3732fdb3d0eacd832bc5a39c92c95c1ea923618e5ff058b240df4a710aa54a674dadc63b27d92957eb92aaac9476832644d8"));
        let peer = hex("ab0bc3fe0710b9bf12edbbae0d2d3c902797e3ee3d1b081d152073d96cad0c93caaa82ab465022251ca41de40f365207d6754d60f0da7642a8ab2f34613b873c75e8ad3539611f78bd3f490edb385b44d63d247ffe15aa8b29ad988e39c7adac9e9472466756637710d28519293573a838d4eaaa5ed3f65c879edd15cae656236b948f7c0f54d71a98dfc454ae8a0211b9c470ae0952dbad07db059ac032977659e1a2ba7a3bc13833372754951a0cddb7e4e681cdde158fc4ade080232442699873e5f87eb871395a252d26a0a2440fbd5b8973485f192690efd330eee04801aa311f91b9b020fe4a9808a45bc38e8f2f450986c3a860971ee724f0fcff0d23");
        let shared = Box::new(exchange).complete(&peer).unwrap();
        assert_eq!(shared.secret_bytes(), hex("0018ec5eaebd3f36c137e39ce0fa22e68ae5dc21630972cfa3ca855201127fc43a671f344b4c7d22b6e3fcce4ef0500ead0b3d22b034d64eb4c6475c306803d6569e46f94e6d3e08feebbd60947fc4f593c2b44801b23f1c099b6bef62156035bd3b179af459a84bc2b7f6b983a6495e7d2d9c37f05a678060558ebcc6bd475a6204cb8ee234f9a2200bb5465757366677d11146f34ab3e411b89e75d81035b1ef204a09f980350a3be02a1ea67d48f554385586b7b0f4d5621e6bbbecc3ae8acc819cf4d85063d1b47ee3c20ab24d29b210d2c4e33f9ff9ee937ca842cb31361e7781f6e36cb8f8ca3ca5a9122c2d59280b833b896735f78d8c8961da695637"));
    }

    /// Every size: two random exchanges agree on a secret as long as the modulus; the peer
    /// values 0, 1, p - 1, p and p + 1 and a share not padded to the modulus's length are
    /// refused, 2 and p - 2 are taken.
    #[test]
    fn ffdhe_agrees_and_checks_the_peers_value() {
        for group in [FFDHE2048, FFDHE3072, FFDHE4096, FFDHE6144, FFDHE8192] {
            let p = group.ffdhe_group().unwrap().p;
            let (a, b) = (group.start().unwrap(), group.start().unwrap());
            let (a_pub, b_pub) = (a.pub_key().to_vec(), b.pub_key().to_vec());
            assert_eq!(a_pub.len(), p.len());
            assert_ne!(a_pub, b_pub);
            let (x, y) = (a.complete(&b_pub).unwrap(), b.complete(&a_pub).unwrap());
            assert_eq!(x.secret_bytes(), y.secret_bytes());
            assert_eq!(x.secret_bytes().len(), p.len());
            // p ends in 0xff..ff: p - 1, p - 2 and p + 1 differ from it in the last byte.
            let near_p = |last: u8| [&p[..p.len() - 1], &[last]].concat();
            let mut small = vec![0u8; p.len()];
            for bad in [0u8, 1] {
                *small.last_mut().unwrap() = bad;
                assert!(group.start().unwrap().complete(&small).is_err());
            }
            let mut p_plus_one = p.to_vec();
            for byte in p_plus_one.iter_mut().rev() {
                *byte = byte.wrapping_add(1);
                if *byte != 0 {
                    break;
                }
            }
            for bad in [near_p(0xfe), p.to_vec(), p_plus_one, a_pub[1..].to_vec()] {
                assert!(
                    group.start().unwrap().complete(&bad).is_err(),
                    "{:?}",
                    group.name()
                );
            }
            *small.last_mut().unwrap() = 2;
            assert!(group.start().unwrap().complete(&small).is_ok());
            assert!(group.start().unwrap().complete(&near_p(0xfd)).is_ok());
        }
    }

    /// The group a rustls server on `server_groups` (names as `groups` takes them; none:
    /// the default provider's) agrees with a rustls client offering `client` alone, in
    /// memory; `None` when the handshake fails.
    fn agreed(
        server_groups: Option<&[&str]>,
        client: &'static dyn SupportedKxGroup,
    ) -> Option<NamedGroup> {
        use std::sync::Arc;
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let provider = match server_groups {
            None => crate::provider(),
            Some(names) => Arc::new(crate::with_groups(&crate::provider(), names).unwrap()),
        };
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut only = rustls::crypto::aws_lc_rs::default_provider();
        only.kx_groups = vec![client];
        // TLS 1.3's suites alone: with rustls's tls12 feature on (the workspace's tests
        // unify it in, through tonic), its ECDHE suites refuse a provider with no ECDHE group.
        only.cipher_suites.retain(|suite| suite.tls13().is_some());
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(only))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(server_config)).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            server.read_tls(&mut wire.as_slice()).unwrap();
            server.process_new_packets().ok()?;
            wire.clear();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().ok()?;
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        Some(server.negotiated_key_exchange_group()?.name())
    }

    /// A client that offers only an opt-in group gets it from a listener whose `groups`
    /// lists it, and nothing from one that lists others or sets none (the defaults).
    #[test]
    fn the_opt_in_groups_are_offered_only_when_listed() {
        for group in OPT_IN {
            let every = tunneld_config::LISTEN_GROUPS;
            assert_eq!(agreed(Some(every), group), Some(group.name()));
            assert_eq!(agreed(None, group), None, "{:?}", group.name());
        }
        let x448 = Some(&["X25519", "X448"][..]);
        assert_eq!(agreed(x448, X448), Some(NamedGroup::X448));
        assert_eq!(agreed(x448, FFDHE2048), None);
    }
}
