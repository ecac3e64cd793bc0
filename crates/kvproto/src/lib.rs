//! memcache protocol messages: parsing requests and composing replies, with no I/O.
//!
//! This crate owns the wire formats of the memcache protocols. It takes bytes and returns
//! a request together with the number of bytes it occupied (or "incomplete"), and it writes
//! replies into a caller's buffer. It never reads or writes a socket, never allocates per
//! request on the parse path, and never panics on any input: malformed input is a value
//! ([`text::Parse::Error`]) carrying memcached's own error reply.
//!
//! The server (`kvcached`) and the load generator (`kvblast`) both use it.
//!
//! Every input is hostile, so the library code (not its tests) may not index, slice,
//! unwrap or panic: clippy refuses it (`cargo clippy` is part of the checks).

#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod admin;
pub mod auth;
pub mod binary;
pub mod client;
pub mod meta;
mod syntax;
pub mod text;
pub mod udp;

/// Longest key memcached accepts, in bytes.
pub const MAX_KEY_LEN: usize = 250;
