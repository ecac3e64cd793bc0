//! Large values spliced into a connection's output instead of copied into it.
//!
//! A reply is built in the session's output buffer, but a value of [`SPLICE_MIN`] bytes or
//! more is not copied there: the engine leases it ([`kvstore::ValueLease`]: its bytes stay
//! put in the log until the lease is dropped), and the lease is queued here with the
//! position in the buffer it goes before. The runtime then writes the buffer and the
//! leased values together with one vectored write (`writev`, or `sendmsg` in the io_uring
//! runtime), so the only copy of the value is the kernel's into the socket. memcached
//! sends from its items in the same way (an iovec per item, holding a reference).
//!
//! The output is then a stream of pieces: `buf[pos..at0]`, value 0, `buf[at0..at1]`,
//! value 1, ..., `buf[atN..]`. [`Splices::gather`] lists the pending pieces as I/O slices
//! and [`Splices::advance`] consumes what a write took, dropping each lease once its value
//! is fully written.

use std::collections::VecDeque;
use std::io::IoSlice;

use kvstore::{ItemView, ValueLease};

/// The queue `q` and a lease of `item`'s value, if the value is to be spliced: the
/// connection splices (`q` is given), the value is at least [`SPLICE_MIN`] bytes, and the
/// engine can lease it. `None`: copy the value.
#[inline]
pub fn lease_into<'q>(
    q: Option<&'q mut Splices>,
    item: &ItemView<'_>,
) -> Option<(&'q mut Splices, ValueLease)> {
    if item.value.len() < SPLICE_MIN {
        return None;
    }
    let q = q?;
    Some((q, item.lease()?))
}

/// Values at least this long are spliced rather than copied (when the engine can lease
/// them). Below it a copy costs less than a lease (an atomic update of the segment's
/// lease count on the way in and out) and a slice of its own in every write.
pub const SPLICE_MIN: usize = 16 * 1024;

/// Most slices one write gathers (Linux's `IOV_MAX` is 1024).
pub const MAX_SLICES: usize = 64;

/// Leased values waiting to be written, in order, each before a position of the output
/// buffer.
#[derive(Debug, Default)]
pub struct Splices {
    q: VecDeque<(usize, ValueLease)>,
    /// Bytes of the front value already written.
    done: usize,
    /// Bytes of every queued value not written yet.
    bytes: usize,
}

impl Splices {
    /// Queue `value` to be written just before `buf[at]` (`at` no less than any position
    /// queued before). An empty value has nothing to write and is not queued.
    pub fn push(&mut self, at: usize, value: ValueLease) {
        if value.is_empty() {
            return;
        }
        self.bytes += value.len();
        self.q.push_back((at, value));
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Bytes of the queued values not written yet.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The buffer was cut back to `len` bytes: drop the values queued after it.
    pub fn truncate(&mut self, len: usize) {
        while self.q.back().is_some_and(|&(at, _)| at > len) {
            if let Some((_, v)) = self.q.pop_back() {
                if self.q.is_empty() {
                    // The front value: part of it may be written already.
                    self.bytes -= v.len() - self.done;
                    self.done = 0;
                } else {
                    self.bytes -= v.len();
                }
            }
        }
    }

    /// The pending output, `buf[pos..]` with the values spliced in, as slices in `out`
    /// (as many as fit, empty pieces left out); returns how many.
    pub fn gather<'a>(&'a self, buf: &'a [u8], pos: usize, out: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut put = |piece: &'a [u8]| match out.get_mut(n) {
            Some(slot) if !piece.is_empty() => {
                *slot = IoSlice::new(piece);
                n += 1;
            }
            _ => {}
        };
        let mut from = pos;
        for (i, (at, v)) in self.q.iter().enumerate() {
            let at = (*at).clamp(from, buf.len());
            put(buf.get(from..at).unwrap_or_default());
            from = at;
            put(v
                .get(if i == 0 { self.done } else { 0 }..)
                .unwrap_or_default());
        }
        put(buf.get(from..).unwrap_or_default());
        n
    }

    /// A write took `n` bytes of the pending output `buf[pos..]` (of `buf_len` bytes) with
    /// the values spliced in: drop the values it finished; returns the new `pos`.
    pub fn advance(&mut self, buf_len: usize, mut pos: usize, mut n: usize) -> usize {
        while n > 0 {
            let next = self.q.front().map_or(buf_len, |&(at, _)| at.min(buf_len));
            if pos < next {
                let take = n.min(next - pos);
                pos += take;
                n -= take;
                continue;
            }
            let Some((_, v)) = self.q.front() else {
                // Past the end of the output: a write cannot take more than it was given.
                break;
            };
            let take = n.min(v.len() - self.done);
            self.done += take;
            self.bytes -= take;
            n -= take;
            if self.done == v.len() {
                self.q.pop_front();
                self.done = 0;
            }
        }
        pos
    }
}

/// Leases of `values`, stored as `k0`, `k1`, ... in an engine of their own (a lease cannot
/// be made without one), for tests.
#[cfg(test)]
pub fn test_leases(values: &[&[u8]]) -> (kvstore::LogEngine, Vec<ValueLease>) {
    use kvstore::{Engine, EngineConfig, LogEngine, ReadOptions, StoreMode, StoreRequest};
    let e = LogEngine::new(EngineConfig {
        max_bytes: 64 << 20,
        max_item_size: 1 << 20,
        no_evict: false,
        use_cas: true,
    });
    let mut out = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        e.store(
            StoreRequest {
                mode: StoreMode::Set,
                key: key.as_bytes(),
                value: v,
                flags: 0,
                exptime: 0,
            },
            1,
        );
        e.get(key.as_bytes(), 1, ReadOptions::default(), &mut |item| {
            out.extend(item.lease());
        });
    }
    assert_eq!(out.len(), values.len(), "every value leased");
    (e, out)
}

#[cfg(test)]
mod tests {
    use super::test_leases as leases;
    use super::*;

    fn flat(s: &Splices, buf: &[u8], pos: usize) -> Vec<u8> {
        let mut slices = [IoSlice::new(&[]); 16];
        let n = s.gather(buf, pos, &mut slices);
        slices[..n].iter().flat_map(|x| x.iter().copied()).collect()
    }

    #[test]
    fn values_go_between_their_buffer_bytes() {
        let (_e, mut l) = leases(&[b"VALUE1", b"VALUE2"]);
        let mut s = Splices::default();
        let buf = b"head1;mid;tail".to_vec();
        let second = l.pop().expect("two");
        s.push(6, l.pop().expect("two"));
        s.push(10, second);
        assert_eq!(s.bytes(), 12);
        let all = b"head1;VALUE1mid;VALUE2tail".to_vec();
        assert_eq!(flat(&s, &buf, 0), all);
        // Write it a few bytes at a time: every step's pending output is the rest.
        let mut pos = 0;
        let mut written = 0;
        for step in [1, 5, 3, 4, 2, 7, 4] {
            pos = s.advance(buf.len(), pos, step);
            written += step;
            assert_eq!(
                flat(&s, &buf, pos),
                all[written..].to_vec(),
                "after {written}"
            );
        }
        assert_eq!(written, all.len());
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
        assert_eq!(pos, buf.len());
    }

    #[test]
    fn gather_stops_at_max_slices() {
        let (_e, l) = leases(&[b"a", b"b", b"c"]);
        let mut s = Splices::default();
        for (i, v) in l.into_iter().enumerate() {
            s.push(2 * i + 1, v);
        }
        let buf = b"0123456".to_vec();
        let mut three = [IoSlice::new(&[]); 3];
        assert_eq!(s.gather(&buf, 0, &mut three), 3);
        assert_eq!(flat(&s, &buf, 0), b"0a12b34c56".to_vec());
    }

    #[test]
    fn truncate_drops_values_after_the_cut() {
        let (_e, mut l) = leases(&[b"AAAA", b"BBBB"]);
        let mut s = Splices::default();
        let b = l.pop().expect("two");
        s.push(2, l.pop().expect("two"));
        s.push(5, b);
        s.truncate(4);
        assert_eq!(s.bytes(), 4);
        assert_eq!(flat(&s, b"0123", 0), b"01AAAA23".to_vec());
        s.truncate(1);
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }
}
