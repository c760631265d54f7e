//! Key exchange groups the listeners offer beyond rustls's aws-lc-rs provider: secp521r1,
//! on aws-lc's own ECDH (the provider offers P-256 and P-384 only). OpenSSL's servers offer
//! it by default, and clients and conformance suites written against them (tlsfuzzer's
//! `ecdhe-curves`, `dhe-shared-secret-padding`) use it. It goes after every group the
//! provider offers, so no client that shares one of those is moved to it.

use aws_lc_rs::agreement;
use rustls::crypto::{ActiveKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::{Error, NamedGroup, PeerMisbehaved};

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

    /// A client that offers only secp521r1 gets it from a listener's config (in memory,
    /// both sides rustls).
    #[test]
    fn a_client_offering_only_p521_gets_it() {
        use std::sync::Arc;
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = cert.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let server_config = rustls::ServerConfig::builder_with_provider(crate::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let mut only_p521 = rustls::crypto::aws_lc_rs::default_provider();
        only_p521.kx_groups = vec![SECP521R1];
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(only_p521))
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
            server.process_new_packets().unwrap();
            wire.clear();
            server.write_tls(&mut wire).unwrap();
            client.read_tls(&mut wire.as_slice()).unwrap();
            client.process_new_packets().unwrap();
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        let group = server.negotiated_key_exchange_group().unwrap().name();
        assert_eq!(group, NamedGroup::secp521r1);
    }
}
