//! Differential test of the binary protocol: the same seeded request sequences go to kvcached
//! and to Debian's memcached, and the parsed responses must agree (opcode, status, opaque,
//! extras, key, value), with CAS uniques normalized to "zero or not" and the version string
//! and stat values left out.
//!
//! Each request is followed by a `noop` fence, so quiet requests that send nothing are
//! compared too. CAS-conditioned requests use the unique each server itself last returned for
//! the key (or a wrong one on purpose).

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};

use common::{Kind, Server};
use kvproto::binary::{self as bin, opcode as op, ResponseParse};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const SEEDS: u64 = 6;
const STEPS: usize = 400;
const KEYS: &[&[u8]] = &[b"a", b"b", b"n", b"long-key-xxxxxxxxxxxxxxxx"];

/// A response reduced to what must agree between servers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    opcode: u8,
    status: u16,
    opaque: u32,
    cas_set: bool,
    extras: Vec<u8>,
    key: Vec<u8>,
    value: Vec<u8>,
}

struct Conn {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
    cas: HashMap<Vec<u8>, u64>,
}

impl Conn {
    fn new(server: &Server) -> Conn {
        let stream = server.connect().reader.into_inner();
        Conn {
            stream,
            buf: Vec::new(),
            cas: HashMap::new(),
        }
    }

    /// Send `request` then a noop fence; return the replies before the fence's.
    fn call(&mut self, request: &[u8], fence: u32) -> Vec<Reply> {
        let mut out = request.to_vec();
        bin::write_request(&mut out, op::NOOP, fence, 0, &[], &[], &[]);
        self.stream.write_all(&out).expect("send");
        let mut replies = Vec::new();
        loop {
            match bin::parse_response(&self.buf) {
                ResponseParse::Response(r, used) => {
                    let reply = Reply {
                        opcode: r.opcode,
                        status: r.status,
                        opaque: r.opaque,
                        cas_set: r.cas != 0,
                        extras: r.extras.to_vec(),
                        key: r.key.to_vec(),
                        value: match r.opcode {
                            op::VERSION => b"<version>".to_vec(),
                            op::STAT => Vec::new(),
                            _ => r.value.to_vec(),
                        },
                    };
                    if r.cas != 0 && !r.key.is_empty() {
                        self.cas.insert(r.key.to_vec(), r.cas);
                    }
                    let cas = r.cas;
                    self.buf.drain(..used);
                    if reply.opcode == op::NOOP && reply.opaque == fence {
                        return replies;
                    }
                    // A get without the key returns its CAS too: remember it by opaque.
                    if cas != 0 {
                        self.cas.insert(reply.opaque.to_be_bytes().to_vec(), cas);
                    }
                    if reply.opcode == op::STAT && !reply.key.is_empty() {
                        continue;
                    }
                    replies.push(reply);
                }
                ResponseParse::Incomplete => {
                    let mut chunk = [0u8; 65536];
                    let n = self.stream.read(&mut chunk).expect("read reply");
                    assert!(n > 0, "server closed the connection");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                ResponseParse::Invalid => panic!("invalid response bytes: {:?}", self.buf),
            }
        }
    }
}

/// One random request; `cas_of` gives this server's last CAS for a key.
fn request(rng: &mut StdRng, opaque: u32, cas_of: &dyn Fn(&[u8]) -> u64) -> Vec<u8> {
    let key = KEYS[rng.random_range(0..KEYS.len())];
    let mut out = Vec::new();
    let value: Vec<u8> = match rng.random_range(0..4) {
        0 => Vec::new(),
        1 => rng.random_range(0u64..1000).to_string().into_bytes(),
        2 => b"text".to_vec(),
        _ => vec![b'v'; rng.random_range(1..3000)],
    };
    let flags: u32 = rng.random_range(0..3);
    let store_extras = [flags.to_be_bytes(), 0u32.to_be_bytes()].concat();
    let cas = match rng.random_range(0..4) {
        0 => cas_of(key),
        1 => 12345,
        _ => 0,
    };
    let quiet = rng.random_range(0..4) == 0;
    let pick = |loud: u8, q: u8| if quiet { q } else { loud };
    match rng.random_range(0..14) {
        0 | 1 => {
            let code = [op::GET, op::GETQ, op::GETK, op::GETKQ][rng.random_range(0..4)];
            bin::write_request(&mut out, code, opaque, 0, &[], key, &[]);
        }
        2 | 3 => {
            let code = pick(op::SET, op::SETQ);
            bin::write_request(&mut out, code, opaque, cas, &store_extras, key, &value);
        }
        4 => bin::write_request(
            &mut out,
            pick(op::ADD, op::ADDQ),
            opaque,
            0,
            &store_extras,
            key,
            &value,
        ),
        5 => bin::write_request(
            &mut out,
            pick(op::REPLACE, op::REPLACEQ),
            opaque,
            cas,
            &store_extras,
            key,
            &value,
        ),
        6 => {
            let code = if rng.random_range(0..2) == 0 {
                pick(op::APPEND, op::APPENDQ)
            } else {
                pick(op::PREPEND, op::PREPENDQ)
            };
            bin::write_request(&mut out, code, opaque, 0, &[], key, &value);
        }
        7 => bin::write_request(
            &mut out,
            pick(op::DELETE, op::DELETEQ),
            opaque,
            cas,
            &[],
            key,
            &[],
        ),
        8 | 9 => {
            let code = if rng.random_range(0..2) == 0 {
                pick(op::INCREMENT, op::INCREMENTQ)
            } else {
                pick(op::DECREMENT, op::DECREMENTQ)
            };
            let delta: u64 = rng.random_range(0..5);
            let initial: u64 = rng.random_range(0..100);
            let exptime: u32 = if rng.random_range(0..3) == 0 {
                u32::MAX
            } else {
                0
            };
            let extras = [
                &delta.to_be_bytes()[..],
                &initial.to_be_bytes(),
                &exptime.to_be_bytes(),
            ]
            .concat();
            bin::write_request(&mut out, code, opaque, 0, &extras, key, &[]);
        }
        10 => {
            let code = [op::TOUCH, op::GAT, op::GATQ, op::GATK, op::GATKQ][rng.random_range(0..5)];
            bin::write_request(&mut out, code, opaque, 0, &1000u32.to_be_bytes(), key, &[]);
        }
        11 => {
            let code = [op::VERSION, op::NOOP][rng.random_range(0..2)];
            bin::write_request(&mut out, code, opaque, 0, &[], &[], &[]);
        }
        12 => {
            let group: &[u8] = [&b""[..], b"settings", b"bogus"][rng.random_range(0..3)];
            bin::write_request(&mut out, op::STAT, opaque, 0, &[], group, &[]);
        }
        _ => {
            if rng.random_range(0..20) == 0 {
                bin::write_request(
                    &mut out,
                    pick(op::FLUSH, op::FLUSHQ),
                    opaque,
                    0,
                    &[],
                    &[],
                    &[],
                );
            } else {
                bin::write_request(&mut out, op::GETK, opaque, 0, &[], key, &[]);
            }
        }
    }
    out
}

#[test]
fn binary_sequences_match_memcached() {
    let memcached =
        Server::start_verified(Kind::Memcached, &["-o", "no_lru_crawler,no_lru_maintainer"]);
    let kvcached = Server::start_verified(Kind::Kvcached, &[]);
    let mut compared = 0;
    for seed in 0..SEEDS {
        let mut mc = Conn::new(&memcached);
        let mut kv = Conn::new(&kvcached);
        let mut flush = Vec::new();
        bin::write_request(&mut flush, op::FLUSH, 0, 0, &[], &[], &[]);
        mc.call(&flush, u32::MAX);
        kv.call(&flush, u32::MAX);
        // Two generators with the same seed draw the same requests, except for CAS values,
        // which come from each server's own replies.
        let mut rng_mc = StdRng::seed_from_u64(seed);
        let mut rng_kv = StdRng::seed_from_u64(seed);
        for step in 0..STEPS {
            let opaque = step as u32 + 1;
            let req_mc = request(&mut rng_mc, opaque, &|k| {
                mc.cas.get(k).copied().unwrap_or(0)
            });
            let req_kv = request(&mut rng_kv, opaque, &|k| {
                kv.cas.get(k).copied().unwrap_or(0)
            });
            let want = mc.call(&req_mc, u32::MAX - 1);
            let got = kv.call(&req_kv, u32::MAX - 1);
            assert_eq!(
                got, want,
                "seed {seed} step {step}: request {req_kv:?}\nkvcached {got:?}\nmemcached {want:?}"
            );
            compared += 1;
        }
    }
    eprintln!("binary differential: {compared} requests compared over {SEEDS} seeds");
}
