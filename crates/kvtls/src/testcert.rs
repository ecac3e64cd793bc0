//! Certificates for tests and fuzzing (feature `testcert`): a CA, and server and client
//! certificates it issues, valid or expired. Generated at run time; nothing secret is kept.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate and its private key.
pub struct CertKey {
    pub cert: CertificateDer<'static>,
    cert_pem: String,
    key: KeyPair,
    /// The CA certificate that issued it.
    pub ca: CertificateDer<'static>,
    ca_pem: String,
}

impl CertKey {
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }
    /// The key, DER-encoded (PKCS#8).
    pub fn key_der_bytes(&self) -> Vec<u8> {
        self.key.serialize_der()
    }
}

/// A certificate authority that issues test certificates.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// Panics only in tests: generating a key or signing with ring does not fail.
fn must<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("test certificate: {e:?}"),
    }
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = must(KeyPair::generate());
        let mut params = must(CertificateParams::new(Vec::<String>::new()));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = must(params.self_signed(&key));
        Ca { cert, key }
    }

    pub fn cert(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for `name` (a DNS name or an IP address), for a server or a client,
    /// valid now or expired a year ago.
    pub fn issue(&self, name: &str, client: bool, expired: bool) -> CertKey {
        let key = must(KeyPair::generate());
        let mut params = must(CertificateParams::new(vec![name.to_string()]));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = must(params.signed_by(&key, &self.cert, &self.key));
        CertKey {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key,
            ca: self.cert(),
            ca_pem: self.cert_pem(),
        }
    }
}

/// A server certificate for `name` from a fresh CA (`.ca` is what a client trusts).
pub fn self_signed(name: &str) -> CertKey {
    Ca::new("kvcache test CA").issue(name, false, false)
}
