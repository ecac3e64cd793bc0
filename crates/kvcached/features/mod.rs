//! Features that run beside request execution, on threads of their own or at start and
//! stop: the replica's puller (replication) and warm restart. They use the shared state and
//! the engine, never the runtime.

pub mod replication;
pub mod warm;
