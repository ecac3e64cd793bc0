//! Process setup, before any request: the command line, the configuration it yields, the
//! process's limits, privileges and daemon mode, and memory sizing. Imports nothing else of
//! the server.

pub mod cli;
pub mod conffile;
pub mod config;
pub mod daemon;
pub mod logging;
pub mod memory;

/// The version kvcached reports (`version`, `stats`, the binary protocol's version): the
/// memcached release whose protocol it implements, written as a memcached release writes
/// its version (three numbers, nothing after), because clients parse it: Perl's
/// `version->parse` and Python's `packaging` refuse anything else, and a semver parser
/// would order `1.6.40-kvcached-...` before `1.6.40`. `kvcached -V` names kvcached's own.
pub const VERSION: &str = "1.6.40";
