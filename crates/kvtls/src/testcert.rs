//! Certificates for tests and fuzzing (feature `testcert`): a CA, and server and client
//! certificates it issues, valid or expired. Generated at run time; nothing secret is kept.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_cert::der::{self, Reader};

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
    /// An EC key as SEC1 (`ECPrivateKey`, what `EC PRIVATE KEY` PEM blocks hold): the one
    /// inside its PKCS#8 encoding.
    pub fn key_sec1_der(&self) -> Vec<u8> {
        let pkcs8 = self.key.serialize_der();
        // PrivateKeyInfo ::= SEQUENCE { version INTEGER, privateKeyAlgorithm
        //     AlgorithmIdentifier, privateKey OCTET STRING, [0] attributes, [1] publicKey }
        let sec1 = (|| -> der::Result<Vec<u8>> {
            let mut reader = der::SliceReader::new(&pkcs8)?;
            reader.sequence(|r| {
                r.decode::<u8>()?;
                r.decode::<der::AnyRef<'_>>()?;
                let key = r
                    .decode::<&der::asn1::OctetStringRef>()?
                    .as_bytes()
                    .to_vec();
                while !r.is_finished() {
                    r.decode::<der::AnyRef<'_>>()?;
                }
                Ok(key)
            })
        })();
        must(sec1)
    }
    /// The public key, DER-encoded (a `SubjectPublicKeyInfo`).
    pub fn public_key_der(&self) -> Vec<u8> {
        self.key.public_key_der()
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

    /// A server certificate for `name` for a key made elsewhere (PKCS#8 PEM: an RSA key from
    /// `openssl genpkey`, which ring cannot generate).
    pub fn issue_for_key(&self, name: &str, pkcs8_pem: &str) -> CertKey {
        let key = must(KeyPair::from_pem(pkcs8_pem));
        let mut params = must(CertificateParams::new(vec![name.to_string()]));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = must(params.signed_by(&key, &self.cert, &self.key));
        CertKey {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            key,
            ca: self.cert(),
            ca_pem: self.cert_pem(),
        }
    }

    /// An X.509 version 1 certificate for `name` (no extensions: no subject alternative name,
    /// no key usage), as `openssl x509 -req` makes without `-extfile`. rcgen makes version 3
    /// only, so the certificate is put together here and signed with the CA's key.
    pub fn issue_v1(&self, name: &str) -> CertKey {
        self.issue_v1_valid(name, "000101000000Z", "491231235959Z")
    }

    /// A version 1 certificate for `name` that expired at the end of 2000.
    pub fn issue_v1_expired(&self, name: &str) -> CertKey {
        self.issue_v1_valid(name, "000101000000Z", "001231235959Z")
    }

    /// A version 1 certificate for `name` valid from `not_before` to `not_after` (UTCTime,
    /// `YYMMDDHHMMSSZ`).
    pub fn issue_v1_valid(&self, name: &str, not_before: &str, not_after: &str) -> CertKey {
        let key = must(KeyPair::generate());
        let ca_der = self.cert();
        let issuer = must(crate::x509::outline(&ca_der)).subject;
        // ecdsa-with-SHA256 (1.2.840.10045.4.3.2): rcgen's keys are P-256.
        let sig_alg = der(
            0x30,
            &der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]),
        );
        // CN (2.5.4.3) as a UTF8String.
        let cn = der(
            0x30,
            &[der(0x06, &[0x55, 0x04, 0x03]), der(0x0c, name.as_bytes())].concat(),
        );
        let subject = der(0x30, &der(0x31, &cn));
        let validity = der(
            0x30,
            &[
                der(0x17, not_before.as_bytes()),
                der(0x17, not_after.as_bytes()),
            ]
            .concat(),
        );
        let tbs = der(
            0x30,
            &[
                der(0x02, &[0x01]),
                sig_alg.clone(),
                issuer,
                validity,
                subject,
                key.public_key_der(),
            ]
            .concat(),
        );
        let signer = must(rustls::crypto::ring::sign::any_supported_type(
            &PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der())),
        ));
        let signer = match signer.choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256]) {
            Some(s) => s,
            None => panic!("test certificate: the CA's key cannot sign with ECDSA P-256"),
        };
        let signature = must(signer.sign(&tbs));
        let mut bits = vec![0u8];
        bits.extend_from_slice(&signature);
        let cert = der(0x30, &[tbs, sig_alg, der(0x03, &bits)].concat());
        CertKey {
            cert_pem: pem("CERTIFICATE", &cert),
            cert: CertificateDer::from(cert),
            key,
            ca: ca_der,
            ca_pem: self.cert_pem(),
        }
    }
}

/// A DER element: `tag`, the length, `contents`.
fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|&b| b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(contents);
    out
}

/// `bytes` in PEM armour under `label`.
pub fn pem(label: &str, bytes: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                text.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A server certificate for `name` from a fresh CA (`.ca` is what a client trusts).
pub fn self_signed(name: &str) -> CertKey {
    Ca::new("kvcache test CA").issue(name, false, false)
}
