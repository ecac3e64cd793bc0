//! kvblast: a workload generator for memcache-protocol servers.
//!
//! Layers, each using only the ones above it (`tests/layers.rs` checks):
//! - [`units`]: times as users write them (`30s`, `1.5ms`), and the error for a name that is
//!   none of a setting's choices; [`dist`]: random distributions
//!   (sizes, gaps, popularity), seeded, no I/O; [`route`]: key-to-server maps (ketama,
//!   modulo);
//! - [`workload`]: built-in workloads and the key space; [`transport`]: server addresses
//!   (TCP, unix sockets) and non-blocking streams;
//! - [`stats`]: per-request-kind latency histograms, the table, the JSON report and the
//!   HdrHistogram interval log, and the server's `stats` counters;
//! - [`engine`]: threads, connections, the closed and open loops (`engine/`: config,
//!   orchestration, a worker's loops, per-connection I/O, reply matching);
//! - [`capacity`]: bisection over open-loop runs for the highest rate meeting an SLO;
//! - [`plot`]: SVG and PNG plots of a run's latency distribution and of a capacity search;
//!   [`cli`]: command-line parsing into a validated run configuration;
//! - [`agent`]: distributed load, a master and its agents over TCP (it runs the flags a
//!   master sends through [`cli`]).
//!
//! The wire format lives in `kvproto::client`; this crate never formats a request itself.

pub mod agent;
pub mod capacity;
pub mod cli;
pub mod dist;
pub mod engine;
pub mod plot;
pub mod route;
pub mod stats;
pub mod transport;
pub mod units;
pub mod workload;
