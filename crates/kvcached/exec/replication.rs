//! Replication, master side: serving a replica's `replpull` (text or binary) from the engine's
//! log. The wire format:
//!
//! ```text
//! replica → master   replpull <replid> <bytes>\r\n<cursor>\r\n
//! master → replica   REPL <replid> <bytes>\r\n<batch>\r\n
//! ```
//!
//! `replid` names the master's log (random at each start). A replica that sends another
//! one (or `-`) gets a full sync.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::exec::session::{Ctx, Session, Step};
use crate::state::replication::{lock, Follower};
use crate::state::shared::Shared;

/// Record bytes a master puts in one batch at most (plus one record): large enough that a
/// replica keeps up with tens of MB/s of writes in a few round trips per second.
const BATCH_BUDGET: usize = 4 << 20;

/// Serve a `replpull` on a client connection.
pub fn serve(
    ctx: &mut Ctx<'_>,
    s: &mut Session,
    replid: &[u8],
    name: &[u8],
    cursor: &[u8],
) -> Step {
    let shared = ctx.shared;
    // The batch goes straight into the output after a header whose length field is
    // patched once the batch is written (fixed width: the replica parses leading zeros).
    s.out.extend_from_slice(b"REPL ");
    s.out.extend_from_slice(shared.repl.replid.as_bytes());
    s.out.extend_from_slice(b" ");
    let len_at = s.out.len();
    s.out.extend_from_slice(b"0000000000\r\n");
    let start = s.out.len();
    serve_batch(shared, replid, name, cursor, &mut s.out);
    let len = s.out.len() - start;
    if let Some(field) = s.out.get_mut(len_at..len_at + 10) {
        field.copy_from_slice(format!("{len:010}").as_bytes());
    }
    s.out.extend_from_slice(b"\r\n");
    Step::Next
}

/// Serve a binary-protocol pull ([`kvproto::binary::opcode::REPL_PULL`], for masters with
/// `-S`): key `<replid> <name>`, value the cursor; the reply's key is this server's replid
/// and its value the batch.
pub fn serve_binary(ctx: &mut Ctx<'_>, out: &mut Vec<u8>, req: &kvproto::binary::Request<'_>) {
    use kvproto::binary as bin;
    let shared = ctx.shared;
    let mut parts = req.key.splitn(2, |&b| b == b' ');
    let replid = parts.next().unwrap_or_default();
    let name = parts.next().unwrap_or(b"-");
    // As in the text reply, the batch goes straight into the output; the header's body
    // length is patched once it is written.
    let key = shared.repl.replid.as_bytes();
    let at = out.len();
    bin::write_header(
        out,
        req.opcode,
        bin::Status::Success,
        req.opaque,
        0,
        0,
        key.len() as u16,
        0,
    );
    out.extend_from_slice(key);
    serve_batch(shared, replid, name, req.value, out);
    let body = (out.len() - at - bin::HEADER_LEN) as u32;
    if let Some(field) = out.get_mut(at + 8..at + 12) {
        field.copy_from_slice(&body.to_be_bytes());
    }
}

/// Append the batch for one pull to `out` and record the replica's progress.
fn serve_batch(shared: &Shared, replid: &[u8], name: &[u8], cursor: &[u8], out: &mut Vec<u8>) {
    let log = &shared.engine;
    let peer = String::from_utf8_lossy(name);
    let repl = &shared.repl;
    let fresh = replid != repl.replid.as_bytes();
    // A replica of the master this server follows (or followed before its promotion) may
    // continue here without a full sync.
    let upstream = replid != b"-" && replid == lock(&repl.master_replid).as_bytes();
    // The engine keeps what this replica has not read from the maintenance pass until it
    // has, or until it is forgotten (`Replication::forget_followers`).
    let served = log.repl_serve_as(Some(&peer), cursor, fresh, upstream, BATCH_BUDGET, out);
    if served.reset {
        tracing::info!(
            replica = %peer,
            "replication: full sync for replica {peer}: {}",
            served.reset_why
        );
    }
    {
        let now = Instant::now();
        let mut f = lock(&repl.followers);
        let e = f.entry(peer.into_owned()).or_insert(Follower {
            lag_bytes: 0,
            lag: Duration::ZERO,
            last_pull: now,
            pulls: 0,
            snapshot: true,
            history: VecDeque::new(),
        });
        e.lag_bytes = served.lag_bytes;
        e.last_pull = now;
        e.pulls += 1;
        e.snapshot = served.snapshot;
        e.pulled(now, served.log_offset, served.lag_bytes);
    }
    repl.forget_followers(log);
    repl.check_min_replicas(&shared.config);
}
