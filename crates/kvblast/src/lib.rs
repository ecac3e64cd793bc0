//! kvblast: a workload generator for memcache-protocol servers.
//!
//! Layers, each using only the ones above it:
//! - [`units`]: times as users write them (`30s`, `1.5ms`);
//! - [`dist`]: random distributions (sizes, gaps, popularity), seeded, no I/O;
//! - [`workload`]: built-in workloads and the key space;
//! - [`route`]: key-to-server maps (ketama, modulo);
//! - [`transport`]: server addresses (TCP, unix sockets) and non-blocking streams;
//! - [`stats`]: per-request-kind latency histograms, the table, the JSON report and the
//!   HdrHistogram interval log, and the server's `stats` counters;
//! - [`engine`]: threads, connections, the closed and open loops (`engine/`: config,
//!   orchestration, a worker's loops, per-connection I/O, reply matching);
//! - [`plot`]: SVG plots of a run's latency distribution and of a capacity search;
//! - [`capacity`]: bisection over open-loop runs for the highest rate meeting an SLO;
//! - [`agent`]: distributed load, a master and its agents over TCP;
//! - [`cli`]: command-line parsing into a validated run configuration.
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
