//! The I/O runtime: listening sockets, one event loop per worker thread, TCP and unix
//! connections and UDP sockets. It reads requests, hands them to `exec`, and writes replies.

pub mod conn;
pub mod listener;
pub mod udp;
pub mod worker;
