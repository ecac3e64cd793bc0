//! The argument checks memcached makes on its slab allocator and LRU commands (`slabs`,
//! `lru`, `lru_crawler`) before it acts on them, and which `lru_crawler` or `extstore`
//! subcommand a well-formed line names. kvcached has no slabs and no LRU to tune, so it
//! cannot honour most of these commands, but a client that sends malformed ones gets the
//! reply memcached 1.6.45 sends (`proto_text.c`: `process_slabs_command`,
//! `process_slabs_automove_command`, `process_lru_command`, `process_lru_crawler_command`,
//! `process_extstore_command`),
//! written out by hand because it must match memcached's quirks exactly: subcommands match
//! as C `strncmp` prefixes (`slabs re 1 2` is `reassign`), and token counts include the
//! command itself.

use crate::syntax::{c_strncmp_eq, tok_i32, tok_u32};

const ERROR: &[u8] = b"ERROR\r\n";
const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

/// memcached's `uriencode`, used for keys in `lru_crawler metadump` and `watch` lines:
/// letters, digits and `-._~` as they are, every other byte as `%XX`.
pub fn uri_encode(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', hex_digit(b >> 4), hex_digit(b & 15)]);
        }
    }
}

/// The upper-case hex digit of `n`'s low four bits.
fn hex_digit(n: u8) -> u8 {
    match n & 15 {
        d @ 0..=9 => b'0' + d,
        d => b'A' + d - 10,
    }
}

/// Which listing `lru_crawler SUB CLASSES` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    /// `metadump`: a `key=... exp=... ...` line per item.
    Meta,
    /// `mgdump`: an `mg KEY` line per item.
    Keys,
}

/// The listing `lru_crawler`'s subcommand `sub` names, or None for another subcommand.
/// memcached tries `crawl`, then `metadump`, then `mgdump`, each as a C `strncmp` prefix
/// (`lru_crawler m all` is `metadump`).
pub fn dump_kind(sub: &[u8]) -> Option<DumpKind> {
    if c_strncmp_eq(sub, b"crawl") {
        None
    } else if c_strncmp_eq(sub, b"metadump") {
        Some(DumpKind::Meta)
    } else if c_strncmp_eq(sub, b"mgdump") {
        Some(DumpKind::Keys)
    } else {
        None
    }
}

/// The slab classes an `lru_crawler crawl|metadump|mgdump` argument names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrawlerClasses {
    /// `all` or `hash`.
    All,
    /// A comma-separated list: bit `c` set for class `c` (1 to 63).
    Some(u64),
    /// A list with no class in it (`,`): memcached starts nothing.
    None,
    /// A class that is not a number from 1 to 63: `BADCLASS`.
    Bad,
}

/// Parse the classes argument as memcached does: `all`, `hash`, or class ids separated by
/// commas (empty entries skipped), each from 1 to 63.
pub fn crawler_classes(arg: &[u8]) -> CrawlerClasses {
    if arg == b"all" || arg == b"hash" {
        return CrawlerClasses::All;
    }
    let mut mask = 0u64;
    for t in arg.split(|&b| b == b',').filter(|t| !t.is_empty()) {
        match tok_u32(t) {
            Some(c) if (1..64).contains(&c) => mask |= 1 << c,
            _ => return CrawlerClasses::Bad,
        }
    }
    if mask == 0 {
        CrawlerClasses::None
    } else {
        CrawlerClasses::Some(mask)
    }
}

/// What a well-formed `lru_crawler` command asks for (one [`refusal`] let through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrawlerCommand<'a> {
    /// `crawl CLASSES`: reclaim the expired items now.
    Crawl(&'a [u8]),
    /// `metadump|mgdump CLASSES`.
    Dump(DumpKind, &'a [u8]),
    /// `tocrawl N` or `sleep MICROSECONDS`: pacing of memcached's crawler.
    Tune,
    Enable,
    Disable,
}

/// The `lru_crawler` subcommand `args` name, matched as memcached matches them (`crawl`,
/// `metadump`, `mgdump`, `tocrawl`, `sleep` with one argument, `enable` and `disable`
/// alone, each a C `strncmp` prefix, in that order); None for what [`refusal`] refuses.
pub fn crawler_command<'a>(args: &[&'a [u8]]) -> Option<CrawlerCommand<'a>> {
    match *args {
        [sub, arg] => {
            if c_strncmp_eq(sub, b"crawl") {
                Some(CrawlerCommand::Crawl(arg))
            } else if let Some(kind) = dump_kind(sub) {
                Some(CrawlerCommand::Dump(kind, arg))
            } else if c_strncmp_eq(sub, b"tocrawl") || c_strncmp_eq(sub, b"sleep") {
                Some(CrawlerCommand::Tune)
            } else {
                None
            }
        }
        [sub] if c_strncmp_eq(sub, b"enable") => Some(CrawlerCommand::Enable),
        [sub] if c_strncmp_eq(sub, b"disable") => Some(CrawlerCommand::Disable),
        _ => None,
    }
}

/// memcached's reply to `name` (`slabs`, `lru` or `lru_crawler`) with arguments `args`
/// (the tokens after the command) when it refuses them, or None when they are valid and
/// memcached would act on them.
pub fn refusal(name: &[u8], args: &[&[u8]]) -> Option<&'static [u8]> {
    // memcached counts the command as a token.
    let ntokens = args.len() + 1;
    let sub = args.first().copied();
    let arg = |i: usize| args.get(i).copied().unwrap_or_default();
    match name {
        b"slabs" => {
            let sub = sub?;
            if ntokens == 4 && c_strncmp_eq(sub, b"reassign") {
                return (tok_i32(arg(1)).is_none() || tok_i32(arg(2)).is_none())
                    .then_some(BAD_FORMAT);
            }
            if ntokens >= 3 && c_strncmp_eq(sub, b"automove") {
                return automove(args);
            }
            Some(ERROR)
        }
        b"lru_crawler" => {
            let Some(sub) = sub else {
                return Some(ERROR);
            };
            let known = |lit: &[u8]| c_strncmp_eq(sub, lit);
            if ntokens == 3 {
                if known(b"crawl") || known(b"metadump") || known(b"mgdump") {
                    return None;
                }
                if known(b"tocrawl") {
                    return tok_u32(arg(1)).is_none().then_some(BAD_FORMAT);
                }
                if known(b"sleep") {
                    return match tok_u32(arg(1)) {
                        None => Some(BAD_FORMAT),
                        Some(us) if us > 1_000_000 => {
                            Some(b"CLIENT_ERROR sleep must be one second or less\r\n")
                        }
                        Some(_) => None,
                    };
                }
                return Some(ERROR);
            }
            if ntokens == 2 && (known(b"enable") || known(b"disable")) {
                return None;
            }
            Some(ERROR)
        }
        b"lru" => {
            let Some(sub) = sub else {
                return Some(ERROR);
            };
            if c_strncmp_eq(sub, b"tune") && ntokens >= 6 {
                let (Some(hot), Some(warm), Some(hot_factor), Some(factor)) = (
                    tok_u32(arg(1)),
                    tok_u32(arg(2)),
                    tok_f64(arg(3)),
                    tok_f64(arg(4)),
                ) else {
                    return Some(ERROR);
                };
                if u64::from(hot) + u64::from(warm) > 80 {
                    return Some(b"ERROR hot and warm pcts must not exceed 80\r\n");
                }
                if factor <= 0.0 || hot_factor <= 0.0 {
                    return Some(b"ERROR hot/warm age factors must be greater than 0\r\n");
                }
                return None;
            }
            if c_strncmp_eq(sub, b"mode") && ntokens >= 3 {
                return (arg(1) != b"flat" && arg(1) != b"segmented").then_some(ERROR);
            }
            if c_strncmp_eq(sub, b"temp_ttl") && ntokens >= 3 {
                return tok_i32(arg(1)).is_none().then_some(ERROR);
            }
            Some(ERROR)
        }
        _ => None,
    }
}

/// `slabs automove ...` (`args[0]` is `automove`).
fn automove(args: &[&[u8]]) -> Option<&'static [u8]> {
    let ntokens = args.len() + 1;
    let sub = args.get(1).copied()?;
    let value = args.get(2).copied().unwrap_or_default();
    if c_strncmp_eq(sub, b"ratio") || c_strncmp_eq(sub, b"freeratio") {
        return (ntokens < 4 || tok_f64(value).is_none()).then_some(ERROR);
    }
    if c_strncmp_eq(sub, b"window") {
        return match tok_u32(value).filter(|_| ntokens >= 4) {
            None => Some(BAD_FORMAT),
            Some(w) if !(3..=1800).contains(&w) => {
                Some(b"CLIENT_ERROR automove window too low or too high\r\n")
            }
            Some(_) => None,
        };
    }
    match tok_u32(sub) {
        None => Some(BAD_FORMAT),
        Some(0..=2) => None,
        Some(_) => Some(ERROR),
    }
}

/// What a well-formed `extstore` command asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtstoreCommand {
    /// `item_size N`: items smaller than N bytes stay off flash.
    ItemSize(u32),
    /// `recache_rate N`: copy one in N flash items read again back to memory.
    RecacheRate(u32),
    /// `compact_under N`: make room on flash while fewer than N pages are free.
    CompactUnder(u32),
    /// `drop_unread N`: compaction moves only items read while on flash (N not 0).
    DropUnread(bool),
    /// `max_frag F`: compact only pages less full than the fraction F, here in
    /// thousandths (0 to 1000; a fraction outside 0 to 1 is the nearer end).
    MaxFrag(u32),
    /// A well-formed setting that kvcached's flash tier has no use for (`item_age`,
    /// `low_ttl`, `drop_under`, `max_sleep`, and the deprecated `free_memchunks`): `OK`,
    /// as their `-o` forms are accepted.
    Unused,
}

/// The `extstore` subcommand `args` name, matched as memcached 1.6.45 matches them (each a
/// C `strncmp` prefix, in memcached's order: `free_memchunks` with two numbers, the first
/// a class below 64; `item_size`, `item_age`, `low_ttl`, `recache_rate`, `compact_under`,
/// `drop_under`, `max_sleep`, `drop_unread` with a whole number, `max_frag` with a
/// number; tokens after those are ignored); None where memcached answers `ERROR`.
pub fn extstore_command(args: &[&[u8]]) -> Option<ExtstoreCommand> {
    let (&sub, rest) = args.split_first()?;
    if let [class, limit, ..] = *rest {
        if c_strncmp_eq(sub, b"free_memchunks") {
            tok_u32(limit)?;
            return (tok_u32(class)? < 64).then_some(ExtstoreCommand::Unused);
        }
    }
    let value = *rest.first()?;
    let whole = tok_u32(value);
    // The names start with distinct letters but for item_size/item_age (item_size is
    // tried first), max_sleep/max_frag and drop_under/drop_unread (max_sleep and
    // drop_under first), as in memcached's order.
    if c_strncmp_eq(sub, b"item_size") {
        whole.map(ExtstoreCommand::ItemSize)
    } else if c_strncmp_eq(sub, b"recache_rate") {
        whole.map(ExtstoreCommand::RecacheRate)
    } else if c_strncmp_eq(sub, b"compact_under") {
        whole.map(ExtstoreCommand::CompactUnder)
    } else if [
        b"item_age".as_slice(),
        b"low_ttl",
        b"drop_under",
        b"max_sleep",
    ]
    .iter()
    .any(|name| c_strncmp_eq(sub, name))
    {
        whole.map(|_| ExtstoreCommand::Unused)
    } else if c_strncmp_eq(sub, b"drop_unread") {
        whole.map(|v| ExtstoreCommand::DropUnread(v != 0))
    } else if c_strncmp_eq(sub, b"max_frag") {
        tok_f64(value).map(|f| ExtstoreCommand::MaxFrag(thousandths(f)))
    } else {
        None
    }
}

/// A fraction (`ext_max_frag`, which memcached takes as any number) in thousandths, within
/// 0 and 1000: one outside 0 to 1 is the nearer end.
pub fn thousandths(fraction: f64) -> u32 {
    // Saturating `as`: within 0 and 1000 after the clamp.
    (fraction.clamp(0.0, 1.0) * 1000.0).round() as u32
}

/// A double as memcached's `toktod` reads one (strtod of the whole token).
fn tok_f64(tok: &[u8]) -> Option<f64> {
    std::str::from_utf8(tok)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extstore_subcommands_match_as_memcached_matches_them() {
        use ExtstoreCommand::*;
        let cmd = |line: &str| {
            let toks: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            extstore_command(&toks)
        };
        assert_eq!(cmd("item_size 512"), Some(ItemSize(512)));
        assert_eq!(
            cmd("item 64"),
            Some(ItemSize(64)),
            "a prefix, item_size first"
        );
        assert_eq!(cmd("item_a 64"), Some(Unused), "item_age");
        assert_eq!(cmd("recache_rate 0 noreply"), Some(RecacheRate(0)));
        assert_eq!(cmd("r 7"), Some(RecacheRate(7)));
        assert_eq!(cmd("compact_under 2"), Some(CompactUnder(2)));
        assert_eq!(cmd("c 0"), Some(CompactUnder(0)));
        assert_eq!(cmd("drop_unread 1"), Some(DropUnread(true)));
        assert_eq!(cmd("drop_unr 0"), Some(DropUnread(false)));
        assert_eq!(cmd("drop_unread 7"), Some(DropUnread(true)), "not 0: on");
        assert_eq!(cmd("drop_un 1"), Some(Unused), "drop_under first");
        assert_eq!(cmd("drop_unread x"), None);
        assert_eq!(cmd("max_frag 0.5"), Some(MaxFrag(500)));
        assert_eq!(cmd("max_f 0.8"), Some(MaxFrag(800)));
        assert_eq!(cmd("max_frag 2"), Some(MaxFrag(1000)));
        assert_eq!(cmd("max_frag -1"), Some(MaxFrag(0)));
        for ok in [
            "low_ttl 10",
            "drop_under 1",
            "max_sleep 100",
            "max 100",
            "free_memchunks 1 2",
            "free 63 0",
        ] {
            assert_eq!(cmd(ok), Some(Unused), "{ok}");
        }
        for bad in [
            "item_size",
            "item_size -1",
            "item_size 4294967296",
            "item_size x",
            "max 0.5",
            "max_frag x",
            "free_memchunks 1",
            "free_memchunks 64 1",
            "free_memchunks 1 x",
            "page_size 1",
            "item_sizes 1",
            "",
        ] {
            assert_eq!(cmd(bad), None, "{bad:?}");
        }
        assert_eq!(extstore_command(&[]), None);
    }

    #[test]
    fn uri_encoding_is_memcacheds() {
        let mut out = Vec::new();
        uri_encode(&mut out, b"a:b c%d-e.f_g~h\x00\xff");
        assert_eq!(out, b"a%3Ab%20c%25d-e.f_g~h%00%FF");
    }

    #[test]
    fn crawler_subcommands_match_as_memcached_matches_them() {
        use CrawlerCommand::*;
        let rows: &[(&[&[u8]], Option<CrawlerCommand<'_>>)] = &[
            (&[b"crawl", b"1"], Some(Crawl(b"1"))),
            (&[b"c", b"all"], Some(Crawl(b"all"))),
            (&[b"m", b"all"], Some(Dump(DumpKind::Meta, b"all"))),
            (&[b"mg", b"1"], Some(Dump(DumpKind::Keys, b"1"))),
            (&[b"tocrawl", b"5"], Some(Tune)),
            (&[b"s", b"100"], Some(Tune)),
            (&[b"enable"], Some(Enable)),
            (&[b"e"], Some(Enable)),
            (&[b"disable"], Some(Disable)),
            (&[b"enable", b"x"], None),
            (&[b"crawl"], None),
            (&[b"foo"], None),
            (&[], None),
        ];
        for (args, want) in rows {
            assert_eq!(crawler_command(args), *want, "{args:?}");
        }
    }

    #[test]
    fn crawler_dump_arguments_as_memcached_reads_them() {
        assert_eq!(dump_kind(b"metadump"), Some(DumpKind::Meta));
        assert_eq!(
            dump_kind(b"m"),
            Some(DumpKind::Meta),
            "metadump is tried first"
        );
        assert_eq!(dump_kind(b"mg"), Some(DumpKind::Keys));
        assert_eq!(dump_kind(b"c"), None, "crawl");
        assert_eq!(dump_kind(b"metadumpx"), None);
        assert_eq!(crawler_classes(b"all"), CrawlerClasses::All);
        assert_eq!(crawler_classes(b"hash"), CrawlerClasses::All);
        assert_eq!(crawler_classes(b"alL"), CrawlerClasses::Bad);
        assert_eq!(crawler_classes(b"1,,3"), CrawlerClasses::Some(0b1010));
        assert_eq!(crawler_classes(b"63"), CrawlerClasses::Some(1 << 63));
        for bad in [&b"0"[..], b"64", b"200", b"x", b"1,x", b"-1", b"+1"] {
            assert_eq!(crawler_classes(bad), CrawlerClasses::Bad, "{bad:?}");
        }
        assert_eq!(crawler_classes(b","), CrawlerClasses::None);
    }

    fn check(line: &str) -> Option<&'static str> {
        let mut toks = line.split(' ');
        let name = toks.next().unwrap_or_default().as_bytes();
        let args: Vec<&[u8]> = toks.map(str::as_bytes).collect();
        refusal(name, &args).map(|r| std::str::from_utf8(r).unwrap_or("?"))
    }

    /// Each case as memcached 1.6.45 answers it (checked by hand against it; the
    /// differential test sends these commands to both servers too).
    #[test]
    fn memcached_refusals() {
        let bad = Some("CLIENT_ERROR bad command line format\r\n");
        let error = Some("ERROR\r\n");
        for (line, want) in [
            ("slabs automove invalid", bad),
            ("slabs automove 1", None),
            ("slabs automove 2", None),
            ("slabs automove 3", error),
            ("slabs automove -1", bad),
            ("slabs automove window 30", None),
            (
                "slabs automove window 2",
                Some("CLIENT_ERROR automove window too low or too high\r\n"),
            ),
            ("slabs automove window x", bad),
            ("slabs automove ratio 0.8", None),
            ("slabs automove ratio", error),
            ("slabs automove ratio x", error),
            ("slabs reassign 1 2", None),
            ("slabs re 1 2", None),
            ("slabs reassign x y", bad),
            ("slabs reassign 1", error),
            ("slabs foo", error),
            ("lru_crawler sleep x", bad),
            ("lru_crawler sleep 100", None),
            (
                "lru_crawler sleep 2000000",
                Some("CLIENT_ERROR sleep must be one second or less\r\n"),
            ),
            ("lru_crawler tocrawl 5", None),
            ("lru_crawler tocrawl -5", bad),
            ("lru_crawler crawl all", None),
            ("lru_crawler metadump all", None),
            ("lru_crawler enable", None),
            ("lru_crawler disable", None),
            ("lru_crawler foo", error),
            ("lru_crawler crawl", error),
            ("lru mode flat", None),
            ("lru mode segmented", None),
            ("lru mode x", error),
            ("lru temp_ttl 5", None),
            ("lru temp_ttl -1", None),
            ("lru temp_ttl x", error),
            ("lru tune 10 20 0.1 2", None),
            (
                "lru tune 50 40 0.1 2",
                Some("ERROR hot and warm pcts must not exceed 80\r\n"),
            ),
            (
                "lru tune 10 20 0 2",
                Some("ERROR hot/warm age factors must be greater than 0\r\n"),
            ),
            ("lru tune 10 20 x 2", error),
            ("lru foo", error),
        ] {
            assert_eq!(check(line), want, "{line}");
        }
    }
}
