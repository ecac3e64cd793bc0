//! Stage 1 of the command line: the arguments split the way glibc's `getopt_long` splits
//! them with memcached's option table ([`super::OPTIONS`]): bundled short flags (`-vv`,
//! `-dv`), values attached or separate (`-p11211`, `-p 11211`), long options with `=` or a
//! separate value (`--port=11211`, `--port 11211`), unambiguous long-option prefixes
//! (`--thr 4`), `--` ending the options, and arguments that are not options set aside as
//! operands (memcached ignores them). It knows the table's shape, not what any option means.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use super::{HasArg, Opt, OptSpec, OPTIONS};

/// The option a short letter names.
pub(super) fn short_spec(c: u8) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.short == Some(c))
}

/// Find a long option by its name or, like glibc, by an unambiguous prefix of it.
fn long_spec(name: &[u8]) -> Result<&'static OptSpec, String> {
    let shown = String::from_utf8_lossy(name);
    if let Some(o) = OPTIONS
        .iter()
        .find(|o| !o.long.is_empty() && o.long.as_bytes() == name)
    {
        return Ok(o);
    }
    let matches: Vec<&OptSpec> = OPTIONS
        .iter()
        .filter(|o| !o.long.is_empty() && o.long.as_bytes().starts_with(name))
        .collect();
    match matches.len() {
        0 => Err(format!(
            "unknown option '--{shown}' (kvcached -h lists the options)"
        )),
        1 => Ok(matches[0]),
        _ => Err(format!(
            "option '--{shown}' is ambiguous: it could be {}",
            matches
                .iter()
                .map(|o| format!("--{}", o.long))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// One option as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawOpt {
    /// The option.
    pub opt: Opt,
    /// What its value is (a path is not read as text).
    pub arg: HasArg,
    /// How it was spelled (`-p` or `--port`), for messages.
    pub spelling: String,
    /// Its value, leading white space removed (as memcached 1.6.32+ does).
    pub value: Option<OsString>,
}

/// getopt_long over memcached's option table.
pub(super) struct Lexer<'a> {
    args: &'a [OsString],
    /// Index of the next argument to look at.
    next: usize,
    /// Inside a bundle of short options: (argument index, byte offset of the next letter).
    bundle: Option<(usize, usize)>,
    /// Arguments that are not options (getopt permutes them to the end; memcached
    /// ignores them).
    pub operands: Vec<OsString>,
    /// `--` was seen: everything after it is an operand.
    no_more_options: bool,
}

fn trim_value(v: &[u8]) -> OsString {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    OsStr::from_bytes(&v[start..]).to_os_string()
}

impl<'a> Lexer<'a> {
    pub fn new(args: &'a [OsString]) -> Lexer<'a> {
        Lexer {
            args,
            next: 0,
            bundle: None,
            operands: Vec::new(),
            no_more_options: false,
        }
    }

    /// The next option, an error for a malformed one, or `None` at the end.
    pub fn next_opt(&mut self) -> Option<Result<RawOpt, String>> {
        if let Some((i, pos)) = self.bundle.take() {
            return Some(self.short_in_bundle(i, pos));
        }
        while self.next < self.args.len() {
            let i = self.next;
            self.next += 1;
            let arg = self.args[i].as_bytes();
            if self.no_more_options {
                self.operands.push(self.args[i].clone());
            } else if arg == b"--" {
                self.no_more_options = true;
            } else if let Some(rest) = arg.strip_prefix(b"--") {
                return Some(self.long(rest));
            } else if arg.len() > 1 && arg[0] == b'-' {
                return Some(self.short_in_bundle(i, 1));
            } else {
                self.operands.push(self.args[i].clone());
            }
        }
        None
    }

    fn short_in_bundle(&mut self, i: usize, pos: usize) -> Result<RawOpt, String> {
        let arg = self.args[i].as_bytes();
        let c = arg[pos];
        let Some(spec) = short_spec(c) else {
            return Err(if c.is_ascii_graphic() {
                format!(
                    "unknown option '-{}' (kvcached -h lists the options)",
                    c as char
                )
            } else {
                format!(
                    "unknown option byte 0x{c:02x} in '{}'",
                    String::from_utf8_lossy(arg)
                )
            });
        };
        let spelling = format!("-{}", c as char);
        let rest = &arg[pos + 1..];
        if !spec.arg.required() {
            if !rest.is_empty() {
                self.bundle = Some((i, pos + 1));
            }
            return Ok(RawOpt {
                opt: spec.opt,
                arg: spec.arg,
                spelling,
                value: None,
            });
        }
        let value = if !rest.is_empty() {
            rest
        } else if self.next < self.args.len() {
            self.next += 1;
            self.args[self.next - 1].as_bytes()
        } else {
            return Err(format!("option {spelling} needs a value"));
        };
        Ok(RawOpt {
            opt: spec.opt,
            arg: spec.arg,
            spelling,
            value: Some(trim_value(value)),
        })
    }

    fn long(&mut self, rest: &[u8]) -> Result<RawOpt, String> {
        let (name, inline) = match rest.iter().position(|&b| b == b'=') {
            Some(eq) => (&rest[..eq], Some(&rest[eq + 1..])),
            None => (rest, None),
        };
        let spec = long_spec(name)?;
        let spelling = format!("--{}", spec.long);
        let value = match (spec.arg, inline) {
            (HasArg::No, Some(_)) => {
                return Err(format!("option {spelling} does not take a value"));
            }
            (HasArg::No, None) | (HasArg::Optional, None) => None,
            (HasArg::Optional | HasArg::Required | HasArg::Path, Some(v)) => Some(trim_value(v)),
            (HasArg::Required | HasArg::Path, None) => {
                if self.next < self.args.len() {
                    self.next += 1;
                    Some(trim_value(self.args[self.next - 1].as_bytes()))
                } else {
                    return Err(format!("option {spelling} needs a value"));
                }
            }
        };
        Ok(RawOpt {
            opt: spec.opt,
            arg: spec.arg,
            spelling,
            value,
        })
    }
}
