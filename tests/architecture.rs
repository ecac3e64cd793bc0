//! ARCHITECTURE.md is a map that names code; this test fails when something it names in
//! backticks is gone, so the map cannot drift from the code without a failing test.
//!
//! What is checked, span by span (`...` outside fenced blocks):
//! - a path (it has a `/` or a file extension): it exists, taken from the repository's
//!   root, from the crate or folder of the section it is in (the first backticked path of
//!   the `###` heading), or from that crate's `src/`; a bare file name may be anywhere under
//!   the section's folder or, failing that, the repository; `*` matches within a name;
//! - a code path (`module::name`, `Type::name`, `kvproto::text::parse`, an optional `()`):
//!   a crate name narrows the search to that crate, a module name to the files and folders
//!   of that name, a type name to the files that mention it, and the last name must then
//!   occur in the code (comments aside) of what is left; the section's crate is searched
//!   first, then the whole repository;
//! - a lone type name (`CamelCase`) or a name with an underscore (`close_for`,
//!   `OUTPUT_HIGH_WATER`): it occurs in the code.
//!
//! Spans with spaces or other punctuation (options such as `-o io`, commands, attributes)
//! are not code names and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates and their folders.
const CRATES: &[(&str, &str)] = &[
    ("kvproto", "crates/kvproto"),
    ("kvstore", "crates/kvstore"),
    ("kvtls", "crates/kvtls"),
    ("kvblast", "crates/kvblast"),
    ("kvcached", "crates/kvcached"),
];

/// Folders never walked: build output, fuzzing's corpus and crashes, version control.
const SKIP_DIRS: &[&str] = &[
    "target",
    ".git",
    "fuzz/target",
    "fuzz/corpus",
    "fuzz/artifacts",
];

/// The repository as the checks see it: every file and folder (relative, `/`-separated),
/// and the identifiers in the code of each Rust file.
struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
    idents: BTreeMap<String, BTreeSet<String>>,
}

impl Tree {
    fn read(root: &Path) -> Tree {
        let mut tree = Tree {
            files: BTreeSet::new(),
            dirs: BTreeSet::new(),
            idents: BTreeMap::new(),
        };
        tree.walk(root, "");
        tree
    }

    fn walk(&mut self, root: &Path, rel: &str) {
        let dir = root.join(rel);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry"));
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if SKIP_DIRS.contains(&path.as_str()) {
                continue;
            }
            let kind = e.file_type().expect("a file type");
            if kind.is_dir() {
                self.dirs.insert(path.clone());
                self.walk(root, &path);
            } else if kind.is_file() {
                // This file names what must not exist, to test the checks.
                if path.ends_with(".rs") && path != "tests/architecture.rs" {
                    let text = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
                    self.idents.insert(path.clone(), idents(&text));
                }
                self.files.insert(path);
            }
        }
    }

    fn exists(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        if path.contains('*') {
            return self.files.iter().any(|f| glob(path, f));
        }
        self.files.contains(path) || self.dirs.contains(path)
    }

    /// The Rust files under folder `base` ("" for all).
    fn rust_under(&self, base: &str) -> Vec<&str> {
        self.idents
            .keys()
            .map(String::as_str)
            .filter(|f| base.is_empty() || f.starts_with(&format!("{base}/")))
            .collect()
    }

    fn has(&self, file: &str, ident: &str) -> bool {
        self.idents.get(file).is_some_and(|s| s.contains(ident))
    }
}

/// The identifiers in Rust source, `//` comments left out.
fn idents(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether `path` matches `pattern`, whose `*`s match within one name.
fn glob(pattern: &str, path: &str) -> bool {
    let (p, f): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), path.split('/').collect());
    p.len() == f.len()
        && p.iter().zip(&f).all(|(p, f)| match p.split_once('*') {
            None => p == f,
            Some((head, tail)) => {
                f.len() >= head.len() + tail.len() && f.starts_with(head) && f.ends_with(tail)
            }
        })
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_type(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().any(|c| c.is_ascii_lowercase())
}

/// What a backticked span names, if it names a path or code.
#[derive(Debug, PartialEq)]
enum Named<'a> {
    Path(&'a str),
    Code(Vec<&'a str>),
}

fn classify(span: &str) -> Option<Named<'_>> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let span = span.split('<').next().unwrap_or_default();
    if span.is_empty()
        || span.starts_with(['-', '#', '/', '.'])
        || span.replace("::", "").contains(':')
        || span.contains(|c: char| c.is_whitespace() || "=!{}(),;'\"$&|>".contains(c))
    {
        return None;
    }
    const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".sh", ".py", ".dict", ".lock"];
    if span.contains('/') || EXTENSIONS.iter().any(|x| span.ends_with(x)) {
        return Some(Named::Path(span));
    }
    if span.contains("::") {
        let segs: Vec<&str> = span.split("::").collect();
        return segs
            .iter()
            .all(|s| is_ident(s))
            .then_some(Named::Code(segs));
    }
    (is_ident(span) && (is_type(span) || span.contains('_'))).then(|| Named::Code(vec![span]))
}

/// The backticked spans of `doc` outside fenced blocks, each with the folder of the
/// section it is in ("" for the root). A span may run over a line break.
fn spans(doc: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut base = String::new();
    let mut fenced = false;
    let mut text = String::new();
    let flush = |text: &mut String, base: &str, out: &mut Vec<(String, String)>| {
        let mut parts = text.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            out.push((
                base.to_string(),
                code.split_whitespace().collect::<Vec<_>>().join(" "),
            ));
        }
        text.clear();
    };
    for line in doc.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.starts_with('#') {
            flush(&mut text, &base, &mut out);
            base = match line.split('`').nth(1) {
                Some(p) if line.starts_with("### ") && p.contains('/') => {
                    p.trim_end_matches('/').to_string()
                }
                _ => String::new(),
            };
        }
        text.push_str(line);
        text.push('\n');
    }
    flush(&mut text, &base, &mut out);
    out
}

/// What in `doc` names something `tree` does not have.
fn stale(doc: &str, tree: &Tree) -> Vec<String> {
    let mut problems = Vec::new();
    for (base, span) in spans(doc) {
        let found = match classify(&span) {
            None => continue,
            Some(Named::Path(p)) => path_exists(tree, &base, p),
            Some(Named::Code(segs)) => code_exists(tree, &base, &segs),
        };
        if !found {
            let section = if base.is_empty() { "the root" } else { &base };
            problems.push(format!("`{span}` (in the section of {section})"));
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn path_exists(tree: &Tree, base: &str, path: &str) -> bool {
    let mut candidates = vec![path.to_string()];
    if !base.is_empty() {
        candidates.push(format!("{base}/{path}"));
        candidates.push(format!("{base}/src/{path}"));
    }
    if candidates.iter().any(|c| tree.exists(c)) {
        return true;
    }
    // A bare file name: anywhere under the section's folder, else anywhere.
    !path.contains('/')
        && [base, ""].iter().any(|b| {
            tree.files.iter().any(|f| {
                (b.is_empty() || f.starts_with(&format!("{b}/")))
                    && f.ends_with(&format!("/{path}"))
            })
        })
}

fn code_exists(tree: &Tree, base: &str, segs: &[&str]) -> bool {
    if let Some(&(_, dir)) = CRATES.iter().find(|(name, _)| Some(name) == segs.first()) {
        return resolve(
            tree,
            tree.rust_under(dir),
            segs.get(1..).unwrap_or_default(),
        );
    }
    let section = CRATES
        .iter()
        .find(|(_, dir)| !base.is_empty() && base.starts_with(dir))
        .map(|&(_, dir)| dir)
        .unwrap_or(base);
    (!section.is_empty() && resolve(tree, tree.rust_under(section), segs))
        || resolve(tree, tree.rust_under(""), segs)
}

/// Whether the names `segs` lead, from the Rust files `scope`, to something that exists.
fn resolve(tree: &Tree, mut scope: Vec<&str>, segs: &[&str]) -> bool {
    let Some((&leaf, quals)) = segs.split_last() else {
        return true; // a crate's name alone
    };
    for &q in quals {
        if is_type(q) {
            scope.retain(|f| tree.has(f, q));
        } else {
            let named: Vec<&str> = scope
                .iter()
                .copied()
                .filter(|f| {
                    f.trim_end_matches(".rs")
                        .split('/')
                        .any(|component| component == q)
                })
                .collect();
            if !named.is_empty() {
                scope = named;
            } else {
                // An inline module or a function: its name must be there.
                scope.retain(|f| tree.has(f, q));
            }
        }
        if scope.is_empty() {
            return false;
        }
    }
    scope.iter().any(|f| {
        tree.has(f, leaf)
            || f.trim_end_matches(".rs")
                .split('/')
                .any(|component| component == leaf)
    })
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_path_and_name_in_architecture_md_exists() {
    let root = workspace();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let tree = Tree::read(&root);
    let checked = spans(&doc)
        .iter()
        .filter(|(_, s)| classify(s).is_some())
        .count();
    assert!(
        checked > 100,
        "only {checked} paths and names found to check"
    );
    let stale = stale(&doc, &tree);
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md names what does not exist (update it with the code):\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn architecture_md_stays_a_short_map() {
    let doc =
        std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let words = doc.split_whitespace().count();
    assert!(
        words <= 3200,
        "ARCHITECTURE.md has {words} words: a map, not a copy of the code"
    );
}

/// The checks find what is gone and accept what is there, in each kind of span.
#[test]
fn the_checks_tell_a_stale_map_from_a_true_one() {
    let tree = Tree::read(&workspace());
    let good = "# Map\n\n### `crates/kvproto` — x\n\n`text.rs`, `src/meta.rs`, \
                `crates/kvstore/src/log/`, `kvproto::text::parse`, `text::read_keys`, \
                `Limits`, `MetaReply`, `client::binary::parse_response`, `MAX_REPLY_LINE`, \
                `bench/*.sh`, `-o io`, `get`.\n\n```text\n`not/checked.rs`\n```\n\n\
                ### `crates/kvcached` — y\n\n`runtime/conn.rs`, `Conn::drive`, \
                `Reactor::drain`, `close_for`, `server::run`.\n";
    assert_eq!(stale(good, &tree), Vec::<String>::new());
    let bad = "### `crates/kvproto` — x\n\n`nothing.rs`, `src/no/such.rs`, \
               `kvproto::text::no_such_fn`, `text::no_such_fn`, `kvproto::nomodule::parse`, \
               `NoSuchType`, `NoSuchType::parse`, `no_such_name`, `bench/*.nosuch`.\n";
    assert_eq!(stale(bad, &tree).len(), 9, "{:?}", stale(bad, &tree));
    assert_eq!(classify("-o io"), None);
    assert_eq!(classify("get"), None);
    assert_eq!(classify("Vec<u8>"), Some(Named::Code(vec!["Vec"])));
    assert_eq!(
        classify("Conn::drive()"),
        Some(Named::Code(vec!["Conn", "drive"]))
    );
}
