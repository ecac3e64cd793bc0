//! Feeds arbitrary warm-restart files to `LogEngine::restore`, which must refuse what is not
//! a whole, intact snapshot with an error (never panic, read out of bounds, or allocate what
//! a damaged length claims) and leave the engine empty when it refuses.
//!
//! Three kinds of input, chosen by the first byte: raw bytes as the file (the checksums
//! catch nearly all of them, which is the point), and a real snapshot whose frames are
//! damaged by the input and then framed again with valid checksums and trailer, so the
//! segment image checks and indexing beneath the checksums are exercised too; the real
//! snapshot is either of memory alone (format 4) or of an engine with a flash tier (format
//! 5, whose flash frames name pages: loaded here without a tier, their layout is checked
//! and their items counted lost).
#![no_main]

use std::sync::OnceLock;

use kvstore::flash::{Tier, TierConfig};
use kvstore::{Engine, EngineConfig, LogEngine, StoreMode, StoreRequest};
use libfuzzer_sys::fuzz_target;

const NOW: u32 = 1_000_000;

fn config() -> EngineConfig {
    EngineConfig {
        max_bytes: 1 << 20,
        max_item_size: 4096,
        no_evict: false,
        use_cas: true,
    }
}

type Frames = (Vec<u8>, Vec<Vec<u8>>);

/// A real snapshot's magic and frame payloads (header first).
fn real() -> &'static Frames {
    static REAL: OnceLock<Frames> = OnceLock::new();
    REAL.get_or_init(|| dumped(&LogEngine::new(config()), 300))
}

/// The same of an engine with a flash tier holding most of its items (the tier's file is
/// removed once the snapshot is taken).
fn real_flash() -> &'static Frames {
    static REAL: OnceLock<Frames> = OnceLock::new();
    REAL.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fuzz-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let e = LogEngine::with_layout(config(), kvstore::IndexLayout::Wide);
        let tier = Tier::create(&TierConfig {
            files: vec![(dir.join("flash"), 16 << 20)],
            page_bytes: e.segment_size(),
            write_threads: 1,
            write_buffer: 1 << 20,
            direct: false,
        })
        .expect("a tier");
        e.attach_flash(tier).expect("attach");
        let frames = dumped(&e, 30_000);
        assert_eq!(frames.0[7], kvstore::SNAPSHOT_VERSION, "flash frames in it");
        drop(e);
        let _ = std::fs::remove_dir_all(&dir);
        frames
    })
}

/// `n` items stored in `e`, then its snapshot.
fn dumped(e: &LogEngine, n: u32) -> Frames {
    for i in 0..n {
        let key = format!("key{i}");
        let req = StoreRequest {
            mode: StoreMode::Set,
            key: key.as_bytes(),
            value: &vec![b'v'; (i % 90) as usize],
            flags: i,
            exptime: if i % 3 == 0 { NOW + 100 } else { 0 },
        };
        e.store(req, NOW);
    }
    let mut file = Vec::new();
    e.dump(&mut file, 0).expect("dump");
    kvstore::split_snapshot_frames(&file).expect("a whole snapshot")
}

/// Read as a stream and from memory (as kvcached maps it): the same verdict, and nothing
/// left of a refused file.
fn check(file: &[u8]) {
    let e = LogEngine::new(config());
    let streamed = e.restore(&mut &file[..], NOW);
    if streamed.is_err() {
        assert_eq!(e.stats().curr_items, 0, "a refused snapshot left items");
    }
    let m = LogEngine::new(config());
    let mapped = m.restore_bytes(file, NOW);
    if mapped.is_err() {
        assert_eq!(m.stats().curr_items, 0, "a refused snapshot left items");
    }
    assert_eq!(streamed, mapped, "stream and memory disagree");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 3 == 0 {
        check(rest);
        return;
    }
    // Damage: (frame index, offset, bytes to write there), repeated.
    let (magic, frames) = if mode % 3 == 1 { real() } else { real_flash() };
    let mut frames = frames.clone();
    let mut input = rest;
    while let [idx, hi, lo, n, tail @ ..] = input {
        let n = usize::from(*n % 16).min(tail.len());
        let (patch, next) = tail.split_at(n);
        let i = usize::from(*idx) % (frames.len() + 1);
        if i == frames.len() {
            // Drop or duplicate a frame.
            if *hi % 2 == 0 && frames.len() > 1 {
                frames.remove(usize::from(*lo) % frames.len());
            } else {
                let f = frames[usize::from(*lo) % frames.len()].clone();
                frames.push(f);
            }
        } else {
            let frame = &mut frames[i];
            let at = usize::from(u16::from_be_bytes([*hi, *lo]));
            if at <= frame.len() {
                let end = (at + patch.len()).min(frame.len());
                frame[at..end].copy_from_slice(&patch[..end - at]);
                frame.extend_from_slice(&patch[end - at..]);
            }
        }
        input = next;
    }
    check(&kvstore::join_snapshot_frames(magic, &frames));
});
