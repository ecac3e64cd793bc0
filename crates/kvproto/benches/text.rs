//! Micro-benchmarks of the text protocol hot path: parsing `get`/`set` lines and composing
//! `VALUE` replies. Run with `cargo bench -p kvproto --bench text`.

use divan::{black_box, Bencher};
use kvproto::text::{self, Limits, Parse, Request};

fn main() {
    divan::main();
}

const LIMITS: Limits = Limits::new(1 << 20);

#[divan::bench]
fn parse_get() -> usize {
    match text::parse(black_box(b"get user:1234567890:profile\r\n"), &LIMITS) {
        Parse::Request(Request::Get { keys, .. }, n) => n + keys.count(),
        _ => 0,
    }
}

#[divan::bench]
fn parse_multiget_10() -> usize {
    let line = b"get key:0001 key:0002 key:0003 key:0004 key:0005 key:0006 key:0007 key:0008 key:0009 key:0010\r\n";
    match text::parse(black_box(line), &LIMITS) {
        Parse::Request(Request::Get { keys, .. }, n) => n + keys.count(),
        _ => 0,
    }
}

#[divan::bench(args = [32, 1024])]
fn parse_set(bencher: Bencher, size: usize) {
    let mut buf = format!("set user:1234567890:profile 0 3600 {size}\r\n").into_bytes();
    buf.resize(buf.len() + size, b'v');
    buf.extend_from_slice(b"\r\n");
    bencher.bench(|| match text::parse(black_box(&buf), &LIMITS) {
        Parse::Request(Request::Store { data, .. }, n) => n + data.len(),
        _ => 0,
    });
}

#[divan::bench]
fn parse_pipeline_16_gets(bencher: Bencher) {
    let buf: Vec<u8> = (0..16)
        .flat_map(|i| format!("get key:{i:04}\r\n").into_bytes())
        .collect();
    bencher.bench(|| {
        let mut rest = black_box(&buf[..]);
        let mut count = 0;
        while let Parse::Request(_, n) = text::parse(rest, &LIMITS) {
            rest = &rest[n..];
            count += 1;
        }
        count
    });
}

/// The prefetch hint's scan of the same batch (`read_keys`, run before the batch executes).
#[divan::bench]
fn read_keys_pipeline_16_gets(bencher: Bencher) {
    let buf: Vec<u8> = (0..16)
        .flat_map(|i| format!("get key:{i:04}\r\n").into_bytes())
        .collect();
    bencher.bench(|| text::read_keys(black_box(&buf[..])).count());
}

/// The cross-connection hint's test of one receive (`single_read_key`).
#[divan::bench]
fn single_read_key(bencher: Bencher) {
    let buf = b"get user:1234567890:profile\r\n";
    bencher.bench(|| text::single_read_key(black_box(&buf[..])).map_or(0, <[u8]>::len));
}

#[divan::bench]
fn write_value_with_cas(bencher: Bencher) {
    let mut out = Vec::with_capacity(4096);
    let data = [b'v'; 100];
    bencher.bench_local(|| {
        out.clear();
        text::write_value(
            &mut out,
            black_box(b"user:1234567890:profile"),
            black_box(42),
            &data,
            Some(black_box(1234567)),
        );
        out.extend_from_slice(text::END);
        out.len()
    });
}
