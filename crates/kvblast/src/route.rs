//! Which server a key goes to: classic ketama (libmemcached `ketama_weighted` with equal
//! weights, spymemcached's KETAMA_HASH) or modulo.
//!
//! Ketama: for each server and i in 0..40, MD5("name-i") gives four points on a ring of u32
//! (little-endian words of the digest); a key goes to the first point at or above the
//! little-endian u32 of MD5(key)'s first four bytes, wrapping around. `name` is "host:port",
//! except that libmemcached leaves ":11211" out; [`Ring::ketama`] takes the names as given,
//! and [`point_name`] applies libmemcached's rule.

use md5::{Digest, Md5};

use crate::units::BadChoice;

/// Points per MD5 digest and digests per server: 4 × 40 = 160 points per server.
const POINTS_PER_DIGEST: usize = 4;
const DIGESTS_PER_SERVER: usize = 40;

/// How keys are spread over servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    Ketama,
    Modulo,
}

impl Routing {
    pub fn parse(s: &str) -> Result<Routing, BadChoice> {
        match s {
            "ketama" => Ok(Routing::Ketama),
            "modulo" => Ok(Routing::Modulo),
            _ => Err(BadChoice {
                setting: "routing",
                given: s.to_string(),
                choices: "ketama | modulo",
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Routing::Ketama => "ketama",
            Routing::Modulo => "modulo",
        }
    }
}

/// The name libmemcached hashes for a server: "host:port", or "host" when the port is 11211.
pub fn point_name(host: &str, port: u16) -> String {
    if port == 11211 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

fn md5(data: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update(data);
    h.finalize().into()
}

/// The ketama hash of a key: the little-endian u32 of the first four bytes of MD5(key).
pub fn key_hash(key: &[u8]) -> u32 {
    let d = md5(key);
    u32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

/// A key-to-server map.
#[derive(Debug, Clone)]
pub struct Ring {
    servers: usize,
    routing: Routing,
    /// Sorted (point, server) pairs, for ketama.
    points: Vec<(u32, u32)>,
}

impl Ring {
    /// A ketama continuum over servers named `names` (as hashed: see [`point_name`]).
    pub fn ketama(names: &[String]) -> Ring {
        let mut points = Vec::with_capacity(names.len() * DIGESTS_PER_SERVER * POINTS_PER_DIGEST);
        for (s, name) in names.iter().enumerate() {
            for i in 0..DIGESTS_PER_SERVER {
                let d = md5(format!("{name}-{i}").as_bytes());
                for w in d.chunks_exact(4) {
                    points.push((u32::from_le_bytes([w[0], w[1], w[2], w[3]]), s as u32));
                }
            }
        }
        // Ties (astronomically rare) are broken by server order, as a stable sort of
        // libmemcached's insertion order would.
        points.sort_by_key(|p| p.0);
        Ring {
            servers: names.len(),
            routing: Routing::Ketama,
            points,
        }
    }

    pub fn modulo(servers: usize) -> Ring {
        Ring {
            servers,
            routing: Routing::Modulo,
            points: Vec::new(),
        }
    }

    pub fn new(routing: Routing, names: &[String]) -> Ring {
        match routing {
            Routing::Ketama => Ring::ketama(names),
            Routing::Modulo => Ring::modulo(names.len()),
        }
    }

    pub fn servers(&self) -> usize {
        self.servers
    }

    /// The continuum, for tests.
    pub fn points(&self) -> &[(u32, u32)] {
        &self.points
    }

    /// The server for a key hash (ketama) .
    pub fn server_for_hash(&self, hash: u32) -> usize {
        if self.points.is_empty() {
            return 0;
        }
        let i = self.points.partition_point(|p| p.0 < hash);
        let i = if i == self.points.len() { 0 } else { i };
        self.points[i].1 as usize
    }

    /// The server for a key.
    pub fn server_for(&self, key: &[u8]) -> usize {
        if self.servers <= 1 {
            return 0;
        }
        match self.routing {
            Routing::Ketama => self.server_for_hash(key_hash(key)),
            // Modulo over the same MD5 key hash (libmemcached's default hash differs; this
            // is the plain "hash mod N" strategy with a well-mixed hash).
            Routing::Modulo => key_hash(key) as usize % self.servers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 40th point (and the last) of the published continuum for four servers
    /// 192.168.1.101..104:11210 (Couchbase SDK RFC 26, "ketama-hashes.json", which lists all
    /// 640 points with their server): (point, server index).
    const PUBLISHED: [(u32, u32); 17] = [
        (19069626, 3),
        (253143406, 1),
        (555178880, 1),
        (867125393, 1),
        (1108283090, 1),
        (1387658621, 1),
        (1691435574, 3),
        (1905064504, 2),
        (2147967778, 0),
        (2392356161, 2),
        (2636022808, 1),
        (2950191403, 0),
        (3176144561, 0),
        (3375736893, 0),
        (3667582053, 3),
        (3938091434, 0),
        (4294628205, 1),
    ];

    fn four() -> Ring {
        let names: Vec<String> = (101..=104)
            .map(|h| format!("192.168.1.{h}:11210"))
            .collect();
        Ring::ketama(&names)
    }

    #[test]
    fn continuum_matches_published_vector() {
        let ring = four();
        assert_eq!(ring.points().len(), 640);
        for (k, want) in PUBLISHED.iter().enumerate() {
            let i = if k == PUBLISHED.len() - 1 {
                639
            } else {
                k * 40
            };
            assert_eq!(ring.points()[i], *want, "point {i}");
        }
    }

    #[test]
    fn lookup_takes_first_point_at_or_above_and_wraps() {
        let ring = four();
        assert_eq!(ring.server_for_hash(0), 3);
        assert_eq!(ring.server_for_hash(19069626), 3);
        assert_eq!(ring.server_for_hash(2147967778), 0);
        assert_eq!(ring.server_for_hash(2147967777), 0);
        assert_eq!(ring.server_for_hash(4294628205), 1);
        // Past the last point: wrap to the first.
        assert_eq!(ring.server_for_hash(4294628206), 3);
        assert_eq!(ring.server_for_hash(u32::MAX), 3);
    }

    /// An independent, deliberately naive implementation: linear scan for the smallest point
    /// >= hash (or the smallest point overall), with its own MD5-to-u32 conversion.
    fn naive(names: &[String], key: &[u8]) -> usize {
        let h = {
            let d = md5(key);
            (d[0] as u32) | (d[1] as u32) << 8 | (d[2] as u32) << 16 | (d[3] as u32) << 24
        };
        let mut best: Option<(u32, usize)> = None;
        let mut lowest: Option<(u32, usize)> = None;
        for (s, n) in names.iter().enumerate() {
            for i in 0..40 {
                let d = md5(format!("{n}-{i}").as_bytes());
                for j in 0..4 {
                    let p = (d[4 * j] as u32)
                        | (d[4 * j + 1] as u32) << 8
                        | (d[4 * j + 2] as u32) << 16
                        | (d[4 * j + 3] as u32) << 24;
                    if lowest.is_none_or(|(q, _)| p < q) {
                        lowest = Some((p, s));
                    }
                    if p >= h && best.is_none_or(|(q, _)| p < q) {
                        best = Some((p, s));
                    }
                }
            }
        }
        best.or(lowest).map(|b| b.1).unwrap_or(0)
    }

    #[test]
    fn agrees_with_naive_implementation() {
        let names: Vec<String> = vec![
            point_name("127.0.0.1", 11211),
            point_name("127.0.0.1", 11212),
            point_name("10.0.0.7", 22122),
        ];
        assert_eq!(names[0], "127.0.0.1");
        let ring = Ring::ketama(&names);
        let mut counts = [0usize; 3];
        for i in 0..2000 {
            let key = format!("key:{i}");
            let s = ring.server_for(key.as_bytes());
            assert_eq!(s, naive(&names, key.as_bytes()), "{key}");
            counts[s] += 1;
        }
        // 160 points each spread keys roughly evenly.
        for c in counts {
            assert!((400..=950).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn md5_known_answer() {
        // RFC 1321 test suite: MD5("abc") = 900150983cd24fb0d6963f7d28e17f72.
        assert_eq!(
            md5(b"abc"),
            [
                0x90, 0x01, 0x50, 0x98, 0x3c, 0xd2, 0x4f, 0xb0, 0xd6, 0x96, 0x3f, 0x7d, 0x28, 0xe1,
                0x7f, 0x72
            ]
        );
        assert_eq!(key_hash(b"abc"), 0x9850_0190);
    }

    #[test]
    fn modulo_and_single_server() {
        let r = Ring::modulo(3);
        assert_eq!(r.server_for(b"abc"), 0x9850_0190 % 3);
        assert_eq!(Ring::modulo(1).server_for(b"x"), 0);
        assert_eq!(Ring::ketama(&["a:1".to_string()]).server_for(b"x"), 0);
    }
}
