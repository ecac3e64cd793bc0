//! TLS for kvcache, with rustls (ring as the crypto provider; no OpenSSL).
//!
//! - [`server`]: memcached's `ssl_*` settings, the rustls server configurations built from
//!   them (one per listener peer policy), their reload (`refresh_certs`) and the counters.
//! - [`client`]: client configurations for kvblast and a replica's link to its master.
//! - [`stream`]: [`TlsStream`], a TLS session over a non-blocking (or blocking) socket that
//!   reads and writes like the socket itself.
//!
//! This crate does I/O only through the socket it is given; it knows nothing of memcached's
//! protocols or of the server.

pub mod client;
pub mod server;
pub mod stream;
#[cfg(any(test, feature = "testcert"))]
pub mod testcert;
#[cfg(any(test, feature = "testcert"))]
pub mod testpair;

pub use stream::{Failure, TlsStream};

/// rustls, for the types callers name (`ServerConnection`, `ClientConfig`, ...).
pub use rustls;
