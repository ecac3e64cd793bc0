//! What `stats conns` shows of each socket: shared between the worker that owns a connection
//! (which writes its state and last command time) and the registry in `Shared`.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// Whether a registered socket is a listener, a client or a UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    Listener,
    Client,
    /// A worker's UDP socket (memcached lists each worker's as a connection in
    /// `conn_read`).
    Udp,
}

/// What `stats conns` shows of a connection; kept in the registry of `Shared`.
pub struct ConnInfo {
    pub addr: String,
    /// The listening socket it came in on.
    pub listen_addr: String,
    /// Server time (unix seconds) of the last command, or of the accept.
    pub last_cmd: AtomicU32,
    /// A [`ConnState`], written by the owning worker.
    state: AtomicU8,
}

/// The states `stats conns` shows, with memcached 1.6's names for the same situations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    /// Waiting for a new command, nothing buffered (`conn_new_cmd`).
    NewCmd = 0,
    /// Part of a command line has arrived (`conn_read`).
    Read = 1,
    /// A command line has arrived and its data block is still coming (`conn_nread`).
    NRead = 2,
    /// Discarding the data block of a refused store (`conn_swallow`).
    Swallow = 3,
    /// Executing requests (`conn_parse_cmd`): the connection that asks `stats conns` sees
    /// itself in this state.
    ParseCmd = 4,
    /// Replies are waiting for the client to read (`conn_mwrite`).
    MWrite = 5,
    /// Closing once its last replies are written (`conn_closing`).
    Closing = 6,
    /// A `watch` connection receiving log lines (`conn_watch`); never idle-kicked.
    Watch = 7,
}

impl ConnState {
    fn from_u8(v: u8) -> ConnState {
        match v {
            1 => ConnState::Read,
            2 => ConnState::NRead,
            3 => ConnState::Swallow,
            4 => ConnState::ParseCmd,
            5 => ConnState::MWrite,
            6 => ConnState::Closing,
            7 => ConnState::Watch,
            _ => ConnState::NewCmd,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConnState::NewCmd => "conn_new_cmd",
            ConnState::Read => "conn_read",
            ConnState::NRead => "conn_nread",
            ConnState::Swallow => "conn_swallow",
            ConnState::ParseCmd => "conn_parse_cmd",
            ConnState::MWrite => "conn_mwrite",
            ConnState::Closing => "conn_closing",
            ConnState::Watch => "conn_watch",
        }
    }

    /// Whether `-o idle_timeout` may close a connection in this state: memcached kicks only
    /// connections waiting for (the rest of) a command line.
    pub fn kickable(self) -> bool {
        matches!(self, ConnState::NewCmd | ConnState::Read)
    }
}

impl ConnInfo {
    pub fn new(addr: String, listen_addr: String) -> ConnInfo {
        ConnInfo {
            addr,
            listen_addr,
            last_cmd: AtomicU32::new(0),
            state: AtomicU8::new(ConnState::NewCmd as u8),
        }
    }

    pub fn state(&self) -> ConnState {
        ConnState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, state: ConnState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }
}
