//! The parts of an X.509 certificate of any version, read with RustCrypto's `x509-cert`.
//!
//! rustls checks certificates with webpki, which takes X.509 version 3 only; OpenSSL (and so
//! memcached) serves and verifies version 1 certificates too, which `openssl x509 -req` still
//! makes when no extensions are asked for. The server reads its own certificate's
//! [`outline`] here (a file that is not a certificate is refused, any version is served), and
//! the client-certificate verifier (`verify.rs`) the [`parts`] of a version 1 or 2 one.

use crate::Error;
use x509_cert::certificate::{CertificateInner, Raw};
use x509_cert::der::asn1::BitStringRef;
use x509_cert::der::{self, Decode, Reader, SliceReader};
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

/// A certificate's parts as its DER holds them (each borrowed from it, tag and length
/// included): what a verifier compares and checks signatures over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts<'a> {
    /// 1, 2 or 3.
    pub version: u8,
    /// `tbsCertificate`: the bytes the issuer signed.
    pub tbs: &'a [u8],
    /// The `AlgorithmIdentifier` the issuer signed with, as the signed part names it, and as
    /// the certificate names it beside the signature.
    pub tbs_signature_algorithm: &'a [u8],
    pub signature_algorithm: &'a [u8],
    /// The issuer's and the subject's `Name`.
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    /// The `SubjectPublicKeyInfo`.
    pub spki: &'a [u8],
    /// The validity period, in seconds since the Unix epoch.
    pub not_before: u64,
    pub not_after: u64,
    /// The signature's bytes (the BIT STRING's contents, which hold a whole number of bytes).
    pub signature: &'a [u8],
}

/// Read a certificate's outline (`der` must be one DER `Certificate`, nothing after it).
/// An error (naming what is wrong, as the decoder says it) when `der` is not one.
pub fn outline(der: &[u8]) -> Result<Outline, Error> {
    let p = parts(der)?;
    Ok(Outline {
        version: p.version,
        subject: p.subject.to_vec(),
        spki: p.spki.to_vec(),
    })
}

/// Read a certificate's parts (`der` must be one DER `Certificate`, nothing after it):
///
/// ```text
/// Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE, signature BIT STRING }
/// TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER,
///     signature SEQUENCE, issuer SEQUENCE, validity SEQUENCE, subject SEQUENCE,
///     subjectPublicKeyInfo SEQUENCE, ... }
/// ```
///
/// `x509-cert` decodes the whole (its structure, version and times); the bytes are then
/// taken from `der` itself, so that what is compared and verified is what was signed, not a
/// re-encoding. An error when `der` is not a certificate.
pub fn parts(der: &[u8]) -> Result<Parts<'_>, Error> {
    let bad = Error::NotX509;
    let cert = Certificate::from_der(der).map_err(bad)?;
    let tbs = cert.tbs_certificate();
    let version = match tbs.version() {
        Version::V1 => 1,
        Version::V2 => 2,
        Version::V3 => 3,
    };
    let validity = tbs.validity();
    let not_before = validity.not_before.to_unix_duration().as_secs();
    let not_after = validity.not_after.to_unix_duration().as_secs();
    let raw = (|| -> der::Result<Parts<'_>> {
        let mut reader = SliceReader::new(der)?;
        let (tbs, signature_algorithm, signature) = reader.sequence(|r| {
            let tbs = r.tlv_bytes()?;
            let algorithm = r.tlv_bytes()?;
            let signature = BitStringRef::decode(r)?;
            Ok::<_, der::Error>((tbs, algorithm, signature))
        })?;
        reader.finish()?;
        let signature = signature.as_bytes().ok_or_else(|| {
            der::Error::from(der::ErrorKind::Value {
                tag: der::Tag::BitString,
            })
        })?;
        let mut reader = SliceReader::new(tbs)?;
        reader.sequence(|r| {
            if der::Tag::peek(r)?.is_context_specific() {
                r.tlv_bytes()?; // [0] version
            }
            r.tlv_bytes()?; // serialNumber
            let tbs_signature_algorithm = r.tlv_bytes()?;
            let issuer = r.tlv_bytes()?;
            r.tlv_bytes()?; // validity
            let subject = r.tlv_bytes()?;
            let spki = r.tlv_bytes()?;
            while !r.is_finished() {
                r.tlv_bytes()?; // unique identifiers, extensions
            }
            Ok::<_, der::Error>(Parts {
                version,
                tbs,
                tbs_signature_algorithm,
                signature_algorithm,
                issuer,
                subject,
                spki,
                not_before,
                not_after,
                signature,
            })
        })
    })();
    raw.map_err(bad)
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
