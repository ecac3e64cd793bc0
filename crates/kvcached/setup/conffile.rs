//! `--config-file FILE` (kvcached's own): options read from a file, one per line, the way
//! Debian's wrapper reads `/etc/memcached.conf`, so that a memcached.conf can be copied
//! over unchanged.
//!
//! The file's rules (those of Debian's `systemd-memcached-wrapper`):
//! - `#` starts a comment that runs to the end of the line; `\#` is a literal `#`;
//! - blank lines are skipped;
//! - a line starting with `-` holds an option and its value, as on the command line
//!   (`-m 64`, `-l 127.0.0.1`, `-o modern,lru_crawler`); words are split on white space,
//!   with no quoting;
//! - `-d` and `-h` lines are skipped: the service manager runs the server in the
//!   foreground, and a help text would stop it;
//! - `logfile PATH` is skipped: logs go to stderr, which systemd sends to the journal.
//!
//! Any other line is an error naming the file and the line. The file's options take the
//! place of `--config-file FILE` on the command line, so options after it override it.

use std::ffi::OsString;
use std::path::Path;

/// The long option, spelled in full (it is not in memcached's table, so no prefix of it
/// is accepted).
pub const OPTION: &str = "--config-file";

/// The command line with every `--config-file FILE` (or `--config-file=FILE`) replaced by
/// the options the file holds, and notes to log about lines that were skipped. `read`
/// returns a file's text.
pub fn expand(
    args: Vec<OsString>,
    mut read: impl FnMut(&Path) -> std::io::Result<String>,
) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut out = Vec::with_capacity(args.len());
    let mut notes = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let path = if arg == OPTION {
            match args.next() {
                Some(p) => p,
                None => return Err(format!("option '{OPTION}' requires an argument")),
            }
        } else if let Some(p) = arg
            .to_str()
            .and_then(|s| s.strip_prefix(OPTION))
            .and_then(|s| s.strip_prefix('='))
        {
            OsString::from(p)
        } else {
            out.push(arg);
            continue;
        };
        let path = Path::new(&path);
        let text = read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (words, skipped) = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        notes.extend(
            skipped
                .into_iter()
                .map(|s| format!("{}: {s}", path.display())),
        );
        out.extend(words.into_iter().map(OsString::from));
    }
    Ok((out, notes))
}

/// The words of a configuration file's options, and a note for each line skipped.
pub fn parse(text: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let mut words = Vec::new();
    let mut notes = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        let mut parts = line.split_whitespace();
        let Some(first) = parts.next() else { continue };
        let lineno = n + 1;
        if first.starts_with('-') {
            let bundled =
                !first.starts_with("--") && (first.starts_with("-d") || first.starts_with("-h"));
            if bundled || matches!(first, "--daemon" | "--help") {
                notes.push(format!(
                    "line {lineno}: '{first}' skipped (the service runs in the foreground)"
                ));
                continue;
            }
            words.push(first.to_string());
            words.extend(parts.map(str::to_string));
        } else if first == "logfile" {
            notes.push(format!(
                "line {lineno}: 'logfile' skipped (logs go to stderr, which systemd journals)"
            ));
        } else {
            return Err(format!(
                "line {lineno}: '{first}' is neither an option (starting with '-') nor 'logfile'"
            ));
        }
    }
    Ok((words, notes))
}

/// The line up to its first `#` that is not written `\#`, with every `\#` made `#`.
fn strip_comment(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'#') => {
                out.push('#');
                chars.next();
            }
            '#' => break,
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    const DEBIAN: &str = "\
# memcached default config file
-d

# Log memcached's output to /var/log/memcached
logfile /var/log/memcached.log
# -v
-m 64
-p 11211   # the default
-u memcache
-l 127.0.0.1
-o modern,lru_crawler
-P /var/run/memcached/memcached.pid
";

    #[test]
    fn reads_debians_memcached_conf() {
        let (words, notes) = parse(DEBIAN).unwrap();
        assert_eq!(
            words,
            [
                "-m",
                "64",
                "-p",
                "11211",
                "-u",
                "memcache",
                "-l",
                "127.0.0.1",
                "-o",
                "modern,lru_crawler",
                "-P",
                "/var/run/memcached/memcached.pid"
            ]
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("line 2: '-d' skipped"), "{notes:?}");
        assert!(
            notes[1].starts_with("line 5: 'logfile' skipped"),
            "{notes:?}"
        );
    }

    #[test]
    fn comments_escapes_and_bundled_daemon_flags() {
        let (words, notes) = parse("  -Y /etc/a\\#b # c\n-dv\n--help\n\t\n").unwrap();
        assert_eq!(words, ["-Y", "/etc/a#b"]);
        assert_eq!(notes.len(), 2);
    }

    #[test]
    fn other_lines_are_errors_with_their_number() {
        let err = parse("-m 64\nport 11211\n").unwrap_err();
        assert!(err.starts_with("line 2: 'port'"), "{err}");
    }

    #[test]
    fn expands_in_place_so_later_options_win() {
        let read = |p: &Path| {
            assert_eq!(p, Path::new("/etc/kvcached.conf"));
            Ok("-m 64\n-p 1\n".to_string())
        };
        let (args, _) = expand(
            os(&["-v", "--config-file", "/etc/kvcached.conf", "-p", "2"]),
            read,
        )
        .unwrap();
        assert_eq!(args, os(&["-v", "-m", "64", "-p", "1", "-p", "2"]));
        let (args, _) = expand(os(&["--config-file=/etc/kvcached.conf"]), read).unwrap();
        assert_eq!(args, os(&["-m", "64", "-p", "1"]));
    }

    #[test]
    fn errors_name_the_file() {
        let missing = |_: &Path| Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let err = expand(os(&["--config-file", "/nope"]), missing).unwrap_err();
        assert!(err.starts_with("cannot read /nope:"), "{err}");
        let err = expand(os(&["--config-file"]), missing).unwrap_err();
        assert!(err.contains("requires an argument"), "{err}");
        let bad = |_: &Path| Ok("bogus\n".to_string());
        let err = expand(os(&["--config-file", "/etc/x.conf"]), bad).unwrap_err();
        assert!(err.starts_with("/etc/x.conf: line 1:"), "{err}");
    }

    #[test]
    fn nothing_after_double_dash_is_read() {
        let never = |_: &Path| -> std::io::Result<String> { panic!("read") };
        let (args, _) = expand(os(&["--", "--config-file", "x"]), never).unwrap();
        assert_eq!(args, os(&["--", "--config-file", "x"]));
    }
}
