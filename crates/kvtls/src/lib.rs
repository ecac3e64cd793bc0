//! TLS for kvcache, with rustls (ring as the crypto provider; no OpenSSL).
//!
//! - [`server`]: memcached's `ssl_*` settings, the rustls server configurations built from
//!   them (one per listener peer policy), their reload (`refresh_certs`) and the counters.
//! - [`client`]: client configurations for kvblast and a replica's link to its master.
//! - [`stream`]: [`TlsStream`], a TLS session over a non-blocking (or blocking) socket that
//!   reads and writes like the socket itself.
//! - [`Error`]: what can fail, with memcached's messages.
//! - [`verify`]: client certificates, of any X.509 version, under `ssl_verify_mode` and
//!   `mtls:` listeners (webpki, which rustls checks certificates with, reads version 3 only).
//! - [`x509`]: the parts of a certificate of any X.509 version, for the server's own and for
//!   clients' version 1 certificates, read with RustCrypto's `x509-cert`.
//!
//! This crate does I/O only through the socket it is given; it knows nothing of memcached's
//! protocols or of the server.

#![forbid(unsafe_code)]

pub mod client;
mod error;
pub mod server;
pub mod stream;
#[cfg(any(test, feature = "testcert"))]
pub mod testcert;
#[cfg(any(test, feature = "testcert"))]
pub mod testpair;
pub mod verify;
pub mod x509;

pub use error::Error;
pub use stream::{Failure, TlsStream};

/// rustls, for the types callers name (`ServerConnection`, `ClientConfig`, ...).
pub use rustls;
