//! Feeds arbitrary bytes to the replication decoders of the storage engine: as a batch to a
//! replica (`repl_apply`, which must refuse what does not follow the format, never panic or
//! read out of bounds) and as a cursor to a master (`repl_serve`, which must answer every
//! cursor with a well-formed batch). One master and one replica live across inputs, so
//! accepted batches build up state that later inputs run against.
#![no_main]

use std::sync::{Mutex, OnceLock};

use kvstore::{Engine, EngineConfig, LogEngine, ReplicaState, StoreMode, StoreRequest};
use libfuzzer_sys::fuzz_target;

struct Pair {
    master: LogEngine,
    replica: LogEngine,
    state: Mutex<ReplicaState>,
}

fn pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| {
        let config = EngineConfig {
            max_bytes: 1 << 20,
            max_item_size: 4096,
            no_evict: false,
            use_cas: true,
        };
        let master = LogEngine::new(config.clone());
        for i in 0..200u32 {
            let key = format!("key{i}");
            let req = StoreRequest {
                mode: StoreMode::Set,
                key: key.as_bytes(),
                value: &[b'v'; 40],
                flags: i,
                exptime: 0,
            };
            master.store(req, 1_000_000);
            if i % 7 == 0 {
                master.delete(key.as_bytes(), 1_000_000);
            }
        }
        let replica = LogEngine::new(config);
        replica.set_replica(true);
        Pair {
            master,
            replica,
            state: Mutex::new(ReplicaState::new()),
        }
    })
}

fuzz_target!(|input: &[u8]| {
    let p = pair();
    let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
    // As a batch: refused or applied, never a panic.
    if p.replica.repl_apply(&mut st, input, 1_000_000).is_err() {
        st.restart();
    }
    // As a cursor: the master answers with a batch the replica accepts.
    let mut batch = Vec::new();
    p.master.repl_serve(input, false, false, 4096, &mut batch);
    // As a cursor of a fellow replica asking to switch to the replica (which keeps
    // checkpoints of what it applied): a switch, a reset or a tail, never a panic.
    let mut other = Vec::new();
    p.replica.repl_serve(input, true, true, 4096, &mut other);
    let mut fresh = ReplicaState::new();
    let scratch = LogEngine::new(EngineConfig {
        max_bytes: 1 << 20,
        max_item_size: 4096,
        no_evict: false,
        use_cas: true,
    });
    let _ = scratch.repl_apply(&mut fresh, &batch, 1_000_000);
});
