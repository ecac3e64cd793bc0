//! Memory per item of `LogEngine`, as its own accounting counts it (deterministic: no RSS,
//! no timing). The full-size figures, throughput and restore speed are measurements:
//! `cargo bench -p kvstore --bench measure` (benches/measure.rs).

#[path = "support/fill.rs"]
mod fill;

use fill::bytes_per_item;
use kvstore::IndexLayout;

#[test]
fn log_bytes_per_item_small() {
    // 200k items: the same per-item figure as 2M at a tenth of the size.
    let (acct, _) = bytes_per_item(200_000, 14 << 20, IndexLayout::Compact);
    eprintln!("accounted bytes per item: {acct:.1}");
    // About 67 bytes before the index kept a 2-byte last access time per slot (meta `l`,
    // `me`'s `la`), which adds about 3.4 bytes per item at this fill.
    assert!(acct <= 71.5, "{acct}");
}

/// The wide index (8-byte slots, seven to a cache line) costs a few bytes more per item:
/// the same fill, its own bound.
#[test]
fn log_bytes_per_item_small_wide() {
    let (compact, _) = bytes_per_item(200_000, 14 << 20, IndexLayout::Compact);
    let (wide, _) = bytes_per_item(200_000, 14 << 20, IndexLayout::Wide);
    eprintln!("accounted bytes per item: compact {compact:.1}, wide {wide:.1}");
    assert!(wide > compact, "{wide} {compact}");
    assert!(wide <= compact + 8.0, "{wide} {compact}");
}
