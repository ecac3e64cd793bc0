//! The outline of an X.509 certificate of any version: whether it is one at all, and its
//! version, subject and public key, read with RustCrypto's `x509-cert`.
//!
//! rustls checks the server's own certificate with webpki, which takes X.509 version 3 only;
//! OpenSSL (and so memcached) serves version 1 certificates too, which `openssl x509 -req`
//! still makes when no extensions are asked for. The server reads its certificate's outline
//! here instead: a file that is not a certificate is refused, any version is served.

use crate::Error;
use x509_cert::certificate::{CertificateInner, Raw};
use x509_cert::der::{Decode, Encode};
use x509_cert::Version;

/// A certificate decoded as RFC 5280 shapes it, without the profile's checks beyond the
/// structure (`Raw`): serial numbers of any length, as OpenSSL reads them.
type Certificate = CertificateInner<Raw>;

/// What the server needs of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outline {
    /// 1, 2 or 3.
    pub version: u8,
    /// The subject `Name`, DER (tag and length included).
    pub subject: Vec<u8>,
    /// The `SubjectPublicKeyInfo`, DER (tag and length included), as rustls's signing keys
    /// give theirs.
    pub spki: Vec<u8>,
}

/// Read a certificate's outline (`der` must be one DER `Certificate`, nothing after it):
///
/// ```text
/// Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE, signature BIT STRING }
/// TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER,
///     signature SEQUENCE, issuer SEQUENCE, validity SEQUENCE, subject SEQUENCE,
///     subjectPublicKeyInfo SEQUENCE, ... }
/// ```
///
/// An error (naming what is wrong, as the decoder says it) when `der` is not one.
pub fn outline(der: &[u8]) -> Result<Outline, Error> {
    let bad = Error::NotX509;
    let cert = Certificate::from_der(der).map_err(bad)?;
    let tbs = cert.tbs_certificate();
    let version = match tbs.version() {
        Version::V1 => 1,
        Version::V2 => 2,
        Version::V3 => 3,
    };
    // Decoded DER encodes back to the same bytes.
    let subject = tbs.subject().to_der().map_err(bad)?;
    let spki = tbs.subject_public_key_info().to_der().map_err(bad)?;
    Ok(Outline {
        version,
        subject,
        spki,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_version_3_and_version_1_certificates() {
        let ca = crate::testcert::Ca::new("outline CA");
        let v3 = ca.issue("localhost", false, false);
        let o = outline(&v3.cert).expect("v3");
        assert_eq!(o.version, 3);
        assert_eq!(o.spki, v3.public_key_der());
        let v1 = ca.issue_v1("localhost");
        let o = outline(&v1.cert).expect("v1");
        assert_eq!(o.version, 1);
        assert_eq!(o.spki, v1.public_key_der());
        // The CA's subject is the v1 certificate's issuer: read it back from the CA.
        let ca_outline = outline(&v1.ca).expect("CA");
        assert!(v1
            .cert
            .windows(ca_outline.subject.len())
            .any(|w| w == ca_outline.subject));
    }

    #[test]
    fn refuses_what_is_not_a_certificate() {
        let ca = crate::testcert::Ca::new("outline CA");
        let good = ca.issue("localhost", false, false).cert.to_vec();
        assert!(outline(&[]).is_err());
        assert!(outline(b"not a certificate").is_err());
        // Every truncation fails, and so does a trailing byte.
        for n in 0..good.len() {
            assert!(outline(&good[..n]).is_err(), "cut at {n}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(outline(&long).is_err());
        // A length longer than the input, and a five-byte length.
        assert!(outline(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(outline(&[0x30, 0x85, 0, 0, 0, 0, 1, 0]).is_err());
        // A private key is not a certificate.
        let key = ca.issue("localhost", false, false).key_der_bytes();
        assert!(outline(&key).is_err());
        // The errors say so, as the server's messages carry them.
        let Err(e) = outline(&good[..good.len() - 1]) else {
            panic!("a certificate cut short was read");
        };
        assert!(matches!(e, Error::NotX509(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("not an X.509 certificate ("), "{e}");
    }

    #[test]
    fn refuses_an_unknown_version() {
        let ca = crate::testcert::Ca::new("outline CA");
        let good = ca.issue("localhost", false, false).cert.to_vec();
        // `[0] { INTEGER 2 }` (version 3) becomes `INTEGER 3`, which no version is.
        let at = good
            .windows(5)
            .position(|w| w == [0xa0, 0x03, 0x02, 0x01, 0x02])
            .expect("a version field");
        let mut v4 = good.clone();
        v4[at + 4] = 3;
        assert!(outline(&v4).is_err());
    }
}
