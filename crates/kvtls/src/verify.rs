//! Client certificates: whom a TLS listener serves under `ssl_verify_mode` 1-3 and on an
//! `mtls:` listener.
//!
//! memcached (OpenSSL) verifies a client certificate of any X.509 version against the CAs of
//! `ssl_ca_cert`; webpki, rustls's verifier, parses version 3 only. [`ClientVerifier`] hands
//! version 3 certificates to webpki, and checks a version 1 or 2 one (which has no extensions,
//! so nothing to check but its chain) as OpenSSL does: issued by a CA of the file (the
//! certificate's issuer is the CA's subject, and the CA's key verifies its signature, made
//! with the algorithm its signed part names) and within its validity period. Signatures are
//! verified by webpki with the crypto provider's algorithms, as for any certificate: this
//! module matches names and compares times, and does no cryptography of its own.
//!
//! Without `ssl_ca_cert`, every certificate is refused as from an unknown issuer (`unknown
//! ca`), as OpenSSL does with an empty trust store; whether a client without one is served
//! is the mode's (`mandatory`).

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, PeerMisbehaved, RootCertStore,
    SignatureScheme,
};
use x509_cert::der::{self, asn1::AnyRef, Decode, Encode};

use crate::x509::Parts;
use crate::Error;

/// A CA of `ssl_ca_cert` as webpki holds it, re-wrapped into the DER a certificate holds:
/// its subject `Name` and its `SubjectPublicKeyInfo`, tags and lengths included.
#[derive(Debug)]
struct Anchor {
    subject: Vec<u8>,
    spki: Vec<u8>,
}

/// `value` as the contents of a DER SEQUENCE.
fn sequence(value: &[u8]) -> der::Result<Vec<u8>> {
    AnyRef::new(der::Tag::Sequence, value)?.to_der()
}

/// The client-certificate policy of one server configuration.
#[derive(Debug)]
pub struct ClientVerifier {
    /// webpki's verifier, for version 3 certificates; `None` without `ssl_ca_cert`.
    webpki: Option<Arc<dyn ClientCertVerifier>>,
    /// The same CAs, for version 1 and 2 certificates.
    anchors: Vec<Anchor>,
    provider: Arc<CryptoProvider>,
    /// A client without a certificate is refused (`ssl_verify_mode` 2-3, `mtls:`).
    mandatory: bool,
}

impl ClientVerifier {
    /// Verify against the CAs of `roots` (none: refuse every certificate).
    pub fn new(
        roots: Option<Arc<RootCertStore>>,
        provider: Arc<CryptoProvider>,
        mandatory: bool,
    ) -> Result<ClientVerifier, Error> {
        let (webpki, anchors) = match roots {
            None => (None, Vec::new()),
            Some(roots) => {
                let anchors = roots
                    .roots
                    .iter()
                    .filter_map(|a| {
                        Some(Anchor {
                            subject: sequence(a.subject.as_ref()).ok()?,
                            spki: sequence(a.subject_public_key_info.as_ref()).ok()?,
                        })
                    })
                    .collect();
                // Whether a certificate is required is this verifier's to say
                // (`client_auth_mandatory`); webpki's only verifies what is sent.
                let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                    .allow_unauthenticated()
                    .build()
                    .map_err(Error::Verifier)?;
                (Some(webpki), anchors)
            }
        };
        Ok(ClientVerifier {
            webpki,
            anchors,
            provider,
            mandatory,
        })
    }

    /// A version 1 or 2 certificate: issued by one of the CAs, the signature good, now within
    /// its validity period (OpenSSL's order: the issuer, then the signature, then the time).
    fn verify_old_version(&self, cert: &Parts<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        let refuse = |e: CertificateError| Err(rustls::Error::InvalidCertificate(e));
        let issuers: Vec<&Anchor> = self
            .anchors
            .iter()
            .filter(|a| a.subject == cert.issuer)
            .collect();
        if issuers.is_empty() {
            return refuse(CertificateError::UnknownIssuer);
        }
        // OpenSSL refuses a certificate whose signed part names another algorithm than the
        // one beside the signature.
        if cert.signature_algorithm != cert.tbs_signature_algorithm {
            return refuse(CertificateError::BadSignature);
        }
        let Ok(algorithm) = AnyRef::from_der(cert.signature_algorithm) else {
            return refuse(CertificateError::BadEncoding);
        };
        let signed = issuers
            .iter()
            .any(|issuer| self.signed_by(cert, algorithm.value(), issuer));
        if !signed {
            return refuse(CertificateError::BadSignature);
        }
        let unix = |secs: u64| UnixTime::since_unix_epoch(Duration::from_secs(secs));
        if now.as_secs() < cert.not_before {
            return refuse(CertificateError::NotValidYetContext {
                time: now,
                not_before: unix(cert.not_before),
            });
        }
        if now.as_secs() > cert.not_after {
            return refuse(CertificateError::ExpiredContext {
                time: now,
                not_after: unix(cert.not_after),
            });
        }
        Ok(())
    }

    /// Whether `issuer`'s key verifies `cert`'s signature with one of the provider's
    /// algorithms for `algorithm` (the `AlgorithmIdentifier`'s contents, as webpki matches
    /// them).
    fn signed_by(&self, cert: &Parts<'_>, algorithm: &[u8], issuer: &Anchor) -> bool {
        let spki = SubjectPublicKeyInfoDer::from(issuer.spki.as_slice());
        let Ok(key) = webpki::RawPublicKeyEntity::try_from(&spki) else {
            return false;
        };
        self.provider
            .signature_verification_algorithms
            .all
            .iter()
            .filter(|alg| alg.signature_alg_id().as_ref() == algorithm)
            .any(|alg| key.verify_signature(*alg, cert.tbs, cert.signature).is_ok())
    }

    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }
}

/// The public key of a certificate webpki cannot parse for its version (1 or 2), for the
/// handshake's signature; `None` for any other (webpki's to judge).
fn old_version_key(cert: &CertificateDer<'_>) -> Option<SubjectPublicKeyInfoDer<'static>> {
    let parts = crate::x509::parts(cert).ok()?;
    (parts.version < 3).then(|| SubjectPublicKeyInfoDer::from(parts.spki.to_vec()))
}

/// TLS 1.2's handshake signature by a raw public key, as rustls verifies it by a certificate:
/// each of the scheme's algorithms in turn, skipping those for another kind of key.
fn verify_tls12_with_key(
    message: &[u8],
    spki: &SubjectPublicKeyInfoDer<'_>,
    dss: &DigitallySignedStruct,
    algorithms: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let candidates = algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map(|(_, algs)| *algs)
        .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
    let key = webpki::RawPublicKeyEntity::try_from(spki)
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    for alg in candidates {
        match key.verify_signature(*alg, message, dss.signature()) {
            Ok(()) => return Ok(HandshakeSignatureValid::assertion()),
            Err(webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_)) => continue,
            Err(_) => break,
        }
    }
    Err(rustls::Error::InvalidCertificate(
        CertificateError::BadSignature,
    ))
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        match &self.webpki {
            Some(webpki) => webpki.root_hint_subjects(),
            None => &[],
        }
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            ));
        };
        match crate::x509::parts(end_entity) {
            Ok(parts) if parts.version < 3 => {
                self.verify_old_version(&parts, now)?;
                Ok(ClientCertVerified::assertion())
            }
            // Version 3, or not a certificate x509-cert reads: webpki's to judge.
            _ => webpki.verify_client_cert(end_entity, intermediates, now),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match old_version_key(cert) {
            Some(spki) => verify_tls12_with_key(message, &spki, dss, self.algorithms()),
            None => rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms()),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match old_version_key(cert) {
            Some(spki) => rustls::crypto::verify_tls13_signature_with_raw_key(
                message,
                &spki,
                dss,
                self.algorithms(),
            ),
            None => rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms()),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcert::{Ca, CertKey};
    use crate::testpair::handshake;
    use rustls::sign::{CertifiedKey, SingleCertAndKey};
    use rustls::{ClientConfig, ServerConfig};

    fn provider() -> Arc<CryptoProvider> {
        crate::server::provider()
    }

    fn roots(ca: &Ca) -> Arc<RootCertStore> {
        let mut store = RootCertStore::empty();
        store.add(ca.cert()).expect("a CA certificate");
        Arc::new(store)
    }

    fn verifier(ca: Option<&Ca>, mandatory: bool) -> ClientVerifier {
        ClientVerifier::new(ca.map(roots), provider(), mandatory).expect("verifier")
    }

    /// The certificate's error, or `None` when it is verified.
    fn refusal(v: &ClientVerifier, cert: &CertificateDer<'_>) -> Option<CertificateError> {
        match v.verify_client_cert(cert, &[], UnixTime::now()) {
            Ok(_) => None,
            Err(rustls::Error::InvalidCertificate(e)) => Some(e),
            Err(e) => panic!("not a certificate error: {e:?}"),
        }
    }

    /// `cert` with the first occurrence of `from` replaced by `to` (as long).
    fn altered(cert: &CertificateDer<'_>, from: &[u8], to: &[u8]) -> CertificateDer<'static> {
        let mut der = cert.to_vec();
        let at = der
            .windows(from.len())
            .position(|w| w == from)
            .expect("the bytes to alter");
        der[at..at + to.len()].copy_from_slice(to);
        CertificateDer::from(der)
    }

    /// ecdsa-with-SHA256 and ecdsa-with-SHA384's object identifiers' last bytes.
    const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
    const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];

    #[test]
    fn version_1_certificates_are_verified_as_openssl_verifies_them() {
        let ca = Ca::new("v1 CA");
        let v = verifier(Some(&ca), true);
        let good = ca.issue_v1("client");
        assert_eq!(crate::x509::parts(&good.cert).expect("parts").version, 1);
        assert_eq!(refusal(&v, &good.cert), None, "the CA's");
        let stranger = Ca::new("another CA").issue_v1("client");
        assert_eq!(
            refusal(&v, &stranger.cert),
            Some(CertificateError::UnknownIssuer)
        );
        // Another CA of the same name: the name matches, the signature does not.
        let namesake = Ca::new("v1 CA").issue_v1("client");
        assert_eq!(
            refusal(&v, &namesake.cert),
            Some(CertificateError::BadSignature)
        );
        let expired = ca.issue_v1_expired("client");
        assert!(
            matches!(
                refusal(&v, &expired.cert),
                Some(CertificateError::ExpiredContext { .. })
            ),
            "{:?}",
            refusal(&v, &expired.cert)
        );
        let later = ca.issue_v1_valid("client", "490101000000Z", "491231235959Z");
        assert!(matches!(
            refusal(&v, &later.cert),
            Some(CertificateError::NotValidYetContext { .. })
        ));
        // A name changed after signing.
        let tampered = altered(&good.cert, b"client", b"clienx");
        assert_eq!(refusal(&v, &tampered), Some(CertificateError::BadSignature));
        // The algorithm beside the signature is not the one the signed part names.
        let der = good.cert.to_vec();
        let last = der
            .windows(ECDSA_SHA256.len())
            .rposition(|w| w == ECDSA_SHA256)
            .expect("the outer algorithm");
        let mut swapped = der.clone();
        swapped[last..last + ECDSA_SHA384.len()].copy_from_slice(ECDSA_SHA384);
        assert_eq!(
            refusal(&v, &CertificateDer::from(swapped)),
            Some(CertificateError::BadSignature)
        );
        // What is not a certificate goes to webpki, which refuses it.
        assert!(refusal(&v, &CertificateDer::from(der[..der.len() - 1].to_vec())).is_some());
    }

    /// Version 3 certificates are webpki's, with its errors.
    #[test]
    fn version_3_certificates_are_webpkis() {
        let ca = Ca::new("v3 CA");
        let v = verifier(Some(&ca), true);
        assert_eq!(refusal(&v, &ca.issue("client", true, false).cert), None);
        assert_eq!(
            refusal(&v, &Ca::new("another").issue("client", true, false).cert),
            Some(CertificateError::UnknownIssuer)
        );
        assert!(matches!(
            refusal(&v, &ca.issue("client", true, true).cert),
            Some(CertificateError::ExpiredContext { .. })
        ));
    }

    /// Without a CA every certificate is refused as from an unknown issuer, the CA's own
    /// (of any version) too; whether one is required is the mode's.
    #[test]
    fn without_a_ca_every_certificate_is_refused() {
        let ca = Ca::new("CA");
        for mandatory in [false, true] {
            let v = verifier(None, mandatory);
            assert!(v.offer_client_auth());
            assert_eq!(v.client_auth_mandatory(), mandatory);
            assert!(v.root_hint_subjects().is_empty());
            for cert in [ca.issue("client", true, false), ca.issue_v1("client")] {
                assert_eq!(
                    refusal(&v, &cert.cert),
                    Some(CertificateError::UnknownIssuer)
                );
            }
        }
        let v = verifier(Some(&ca), false);
        assert!(!v.client_auth_mandatory());
        assert_eq!(v.root_hint_subjects().len(), 1, "the CA's name is hinted");
    }

    fn server_config(ca: &Ca) -> Arc<ServerConfig> {
        let server = ca.issue("localhost", false, false);
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(Arc::new(verifier(Some(ca), true)))
            .with_single_cert(vec![server.cert.clone()], server.key_der())
            .expect("server config");
        Arc::new(config)
    }

    /// A client presenting `cert` and signing with `key`'s key (not necessarily its own).
    fn client_config(
        ca: &Ca,
        version: &'static rustls::SupportedProtocolVersion,
        cert: &CertKey,
        key: &CertKey,
    ) -> Arc<ClientConfig> {
        let mut store = RootCertStore::empty();
        store.add(ca.cert()).expect("CA");
        let signer = provider()
            .key_provider
            .load_private_key(key.key_der())
            .expect("key");
        let certified = CertifiedKey::new(vec![cert.cert.clone()], signer);
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[version])
            .expect("version")
            .with_root_certificates(store)
            .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        Arc::new(config)
    }

    /// A version 1 client certificate completes handshakes of TLS 1.2 and 1.3 (its key
    /// verifies the handshake's signature), and one signed with another key does not.
    #[test]
    fn version_1_clients_complete_handshakes_and_their_signature_is_checked() {
        let ca = Ca::new("handshake CA");
        let server = server_config(&ca);
        let v1 = ca.issue_v1("client");
        let other = ca.issue_v1("client");
        let v3 = ca.issue("client", true, false);
        for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
            let ok = |cert: &CertKey, key: &CertKey| {
                handshake(server.clone(), client_config(&ca, version, cert, key))
            };
            assert_eq!(ok(&v1, &v1), Ok(()), "{version:?}");
            assert_eq!(ok(&v3, &v3), Ok(()), "{version:?}");
            assert!(ok(&v1, &other).is_err(), "{version:?}: another key signed");
            assert!(ok(&v3, &other).is_err(), "{version:?}: another key signed");
            let stranger = Ca::new("another").issue_v1("client");
            assert_eq!(
                ok(&stranger, &stranger),
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer
                )),
                "{version:?}"
            );
        }
    }
}
