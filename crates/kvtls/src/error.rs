//! [`Error`]: what can go wrong reading TLS files, building configurations and starting
//! sessions. Its messages are memcached's where memcached has one (the server prints them
//! as they are), each naming the file and the step that failed; the causes are kept as
//! sources.

use std::path::PathBuf;

/// A TLS error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A PEM file is not well formed (`detail`: what the PEM reader said).
    #[error("{}: {detail}", path.display())]
    Pem { path: PathBuf, detail: String },
    #[error("{}: no PEM certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    /// Certificate `index` (from 1) of a chain is not shaped as a certificate.
    #[error("{}: certificate {index}: {source}", path.display())]
    Certificate {
        path: PathBuf,
        index: usize,
        source: Box<Error>,
    },
    #[error("not an X.509 certificate ({0})")]
    NotX509(x509_cert::der::Error),
    /// A key none of PKCS#8, PKCS#1 and SEC1 decodes (the provider's error, for the
    /// encoding the PEM label named, when it gave one).
    #[error("not a usable private key{}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotAKey(Option<rustls::Error>),
    /// A key file that does not hold a usable key.
    #[error("{}: {source}", path.display())]
    KeyFile { path: PathBuf, source: Box<Error> },
    #[error("no certificate")]
    EmptyChain,
    #[error("Error loading the certificate chain: ssl_chain_cert is not set")]
    NoChainCert,
    #[error("Error loading the certificate chain: {} : {source}", path.display())]
    Chain { path: PathBuf, source: Box<Error> },
    #[error("Error loading the key: {} : {source}", path.display())]
    Key { path: PathBuf, source: Box<Error> },
    /// The key is not the certificate's (or the certificate cannot be read for its key).
    #[error("Error validating the certificate: {0}")]
    Validate(Box<Error>),
    #[error("Error loading the CA certificate: {} : {source}", path.display())]
    Ca { path: PathBuf, source: Box<Error> },
    #[error("not a usable CA certificate: {0}")]
    CaCertificate(rustls::Error),
    /// An `ssl_ciphers` list of which no suite is offered.
    #[error("Error setting the provided cipher(s): {0}")]
    Ciphers(String),
    #[error("TLS settings: {0}")]
    Versions(rustls::Error),
    #[error("Error loading the CA certificate: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    /// A key given as DER that the provider refuses.
    #[error("Error loading the key: {0}")]
    KeyDer(rustls::Error),
    #[error("TLS state poisoned")]
    Poisoned,
    #[error("a TLS client key needs its certificate")]
    KeyWithoutCertificate,
    #[error("TLS needs the CA file that signed the server's certificate (or insecure)")]
    NoCa,
    #[error("TLS server name {name}: {source}")]
    ServerName {
        name: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("TLS client certificate: {0}")]
    ClientCertificate(rustls::Error),
    /// What rustls refused (a session, protocol versions, a key that is not the
    /// certificate's).
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}
