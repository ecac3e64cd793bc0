//! Process setup, before any request: the command line, the configuration it yields, the
//! process's limits, privileges and daemon mode, and memory sizing. Imports nothing else of
//! the server.

pub mod cli;
pub mod conffile;
pub mod config;
pub mod daemon;
pub mod logging;
pub mod memory;

/// The version kvcached reports (`version`, `stats`): the memcached protocol level it
/// implements, then its own version, so that clients that parse memcached's version keep
/// working.
pub const VERSION: &str = concat!("1.6.40-kvcached-", env!("CARGO_PKG_VERSION"));
