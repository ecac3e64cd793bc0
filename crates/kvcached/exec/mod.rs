//! Request execution: the session contract ([`session`]), the one dispatch of a request at
//! the front of a stream's or a datagram's bytes ([`dispatch`]), the commands' effects on the engine
//! and on memcached's counters ([`ops`]), and the executors built on them, one per protocol
//! (text, meta, binary), the authentication gates, the `stats` replies, the item listings
//! (`lru_crawler metadump`, [`items`]) and the master side of replication. Executors write
//! replies into a session's output and know nothing of sockets; the runtime drives them.

// The request path: a client's bytes cannot make it panic (no unwrap, expect, panic or
// unchecked indexing outside tests).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod auth;
pub mod binary;
pub mod dispatch;
pub mod items;
pub mod meta;
pub mod ops;
pub mod replication;
pub mod session;
pub mod splice;
pub mod stats_report;
pub mod text;
