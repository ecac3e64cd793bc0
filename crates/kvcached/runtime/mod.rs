//! The I/O runtime: listening sockets, one event loop per worker thread (epoll, or io_uring
//! in `ring.rs`), TCP and unix connections and UDP sockets. It reads requests, hands them to `exec`, and writes replies.
//! `metrics.rs` serves Prometheus metrics on a thread of its own (`-o metrics=HOST:PORT`).

pub mod conn;
pub mod listener;
pub mod metrics;
pub mod ring;
pub mod spares;
pub mod udp;
pub mod worker;
