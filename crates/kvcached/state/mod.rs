//! The state the server's threads share: the clock, counters, the connection registry,
//! credentials, replication state, and [`shared::Shared`], which holds them with the
//! configuration and the engine. Imports only `setup`.

pub mod clock;
pub mod crawler;
pub mod credentials;
pub mod detail;
pub mod flash;
pub mod registry;
pub mod replication;
pub mod shared;
pub mod stats;
pub mod watch;
