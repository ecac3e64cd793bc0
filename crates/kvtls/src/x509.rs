//! Just enough DER to read the outline of an X.509 certificate of any version: whether it is
//! one at all, and its subject and public key.
//!
//! rustls checks the server's own certificate with webpki, which takes X.509 version 3 only;
//! OpenSSL (and so memcached) serves version 1 certificates too, which `openssl x509 -req`
//! still makes when no extensions are asked for. The server reads its certificate's outline
//! here instead: a file that is not a certificate is refused, any version is served.

/// One DER element: its tag, its contents, and the whole encoding (tag and length included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Element<'a> {
    pub(crate) tag: u8,
    pub(crate) contents: &'a [u8],
    pub(crate) whole: &'a [u8],
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
/// `[0] EXPLICIT`: the version of a version 2 or 3 certificate.
const VERSION: u8 = 0xa0;

/// The element at the front of `input` and what follows it. Definite lengths of up to four
/// bytes and one-byte tags only (all X.509's outline uses).
pub(crate) fn element(input: &[u8]) -> Option<(Element<'_>, &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    let (contents, after) = rest.split_at(len);
    let whole = &input[..header + len];
    Some((
        Element {
            tag,
            contents,
            whole,
        },
        after,
    ))
}

/// The element at the front of `input`, which must have `tag`.
fn expect(input: &[u8], tag: u8) -> Option<(Element<'_>, &[u8])> {
    element(input).filter(|(e, _)| e.tag == tag)
}

/// What the server needs of a certificate.
#[derive(Debug, Clone, Copy)]
pub struct Outline<'a> {
    /// 1, 2 or 3.
    pub version: u8,
    /// The subject `Name`, DER (tag and length included).
    pub subject: &'a [u8],
    /// The `SubjectPublicKeyInfo`, DER (tag and length included), as rustls's signing keys
    /// give theirs.
    pub spki: &'a [u8],
}

/// Read a certificate's outline:
///
/// ```text
/// Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE, signature BIT STRING }
/// TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber INTEGER,
///     signature SEQUENCE, issuer SEQUENCE, validity SEQUENCE, subject SEQUENCE,
///     subjectPublicKeyInfo SEQUENCE, ... }
/// ```
///
/// An error (naming what is wrong) when `der` is not shaped so.
pub fn outline(der: &[u8]) -> Result<Outline<'_>, String> {
    let bad = |what: &str| format!("not an X.509 certificate ({what})");
    let (cert, rest) = expect(der, SEQUENCE).ok_or_else(|| bad("no outer SEQUENCE"))?;
    if !rest.is_empty() {
        return Err(bad("bytes after the certificate"));
    }
    let (tbs, rest) = expect(cert.contents, SEQUENCE).ok_or_else(|| bad("no tbsCertificate"))?;
    let (_, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("no signatureAlgorithm"))?;
    let (_, rest) = expect(rest, BIT_STRING).ok_or_else(|| bad("no signature"))?;
    if !rest.is_empty() {
        return Err(bad("trailing fields"));
    }
    let mut fields = tbs.contents;
    let mut version = 1;
    if let Some((v, rest)) = expect(fields, VERSION) {
        let (n, _) = expect(v.contents, INTEGER).ok_or_else(|| bad("a malformed version"))?;
        version = match n.contents {
            [0] => 1,
            [1] => 2,
            [2] => 3,
            _ => return Err(bad("an unknown version")),
        };
        fields = rest;
    }
    let (_, rest) = expect(fields, INTEGER).ok_or_else(|| bad("no serial number"))?;
    let (_, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("no signature algorithm"))?;
    let (_, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("no issuer"))?;
    let (_, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("no validity"))?;
    let (subject, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("no subject"))?;
    let (spki, _) = expect(rest, SEQUENCE).ok_or_else(|| bad("no public key"))?;
    Ok(Outline {
        version,
        subject: subject.whole,
        spki: spki.whole,
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
        assert_eq!(o.spki, v3.public_key_der().as_slice());
        let v1 = ca.issue_v1("localhost");
        let o = outline(&v1.cert).expect("v1");
        assert_eq!(o.version, 1);
        assert_eq!(o.spki, v1.public_key_der().as_slice());
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
    }
}
