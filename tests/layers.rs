//! The Architecture Invariants about dependencies, checked on the source: no module of a crate
//! imports another that imports it back (directly or through others), the server's layers
//! point one way (ARCHITECTURE.md): setup → state → exec::session (and its output's
//! exec::splice) → features → executors → runtime → server → main, and so do the storage
//! engine's parts (`store_layer`).
//!
//! A module's dependencies are the `crate::...` paths in its code (in `use` lines and inline,
//! not in comments or an inline test module), resolved to the longest module path that
//! exists; `use crate::a::{b, c}` counts `a::b` and `a::c` when they are modules, and `a` when
//! an item of `a` is named. Relative paths (`super::`, `self::`, a child module's bare name in
//! its parent's `use`) are made absolute first. A module's use of its own ancestors is not
//! counted (a `mod.rs` declares its children).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            // (A `tests.rs` is a test module: its imports are not the crate's.)
            out.push(p);
        }
    }
}

/// Module path of a file relative to the crate root: `exec/text.rs` → `exec::text`,
/// `exec/mod.rs` → `exec`, `main.rs`/`lib.rs` → `crate`.
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under the root");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "main" || parts[0] == "lib") {
        return "crate".into();
    }
    parts.join("::")
}

fn ident_len(s: &str) -> usize {
    s.bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count()
}

/// The modules `text` refers to through `crate::` paths.
fn deps_of(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        // The path: identifiers joined by `::`, maybe ending in a `{...}` group.
        let mut path: Vec<&str> = Vec::new();
        let mut s = rest;
        let mut group: Option<&str> = None;
        loop {
            let n = ident_len(s);
            if n == 0 {
                if let Some(inner) = s.strip_prefix('{') {
                    group = inner.find('}').map(|end| &inner[..end]);
                }
                break;
            }
            path.push(&s[..n]);
            s = &s[n..];
            match s.strip_prefix("::") {
                Some(next) => s = next,
                None => break,
            }
        }
        // Longest prefix that is a module.
        let Some(module) = (1..=path.len())
            .rev()
            .map(|i| path[..i].join("::"))
            .find(|p| modules.contains(p))
        else {
            continue;
        };
        // A group names submodules (counted as such) and items of the module itself.
        let mut itself = group.is_none();
        for item in group.into_iter().flat_map(|g| g.split(',')) {
            let item = item.trim();
            let first = &item[..ident_len(item)];
            let sub = format!("{module}::{first}");
            if modules.contains(&sub) {
                deps.insert(sub);
            } else if !first.is_empty() {
                itself = true;
            }
        }
        if itself {
            deps.insert(module);
        }
    }
    deps
}

/// `text` (the code of module `m`) with its relative paths made absolute: `super::` and
/// `self::` become `crate::` paths, and so does a `use` of one of `m`'s child modules by its
/// bare name (`use write::Commit;` in `log/mod.rs`), so that [`deps_of`] sees them.
fn absolute_paths(m: &str, text: &str, modules: &BTreeSet<String>) -> String {
    let parts: Vec<&str> = if m == "crate" {
        Vec::new()
    } else {
        m.split("::").collect()
    };
    let prefix = |n: usize| {
        let mut p = String::from("crate::");
        for part in &parts[..parts.len().saturating_sub(n)] {
            p.push_str(part);
            p.push_str("::");
        }
        p
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        // A path segment starts after a character that cannot be part of an identifier.
        let at_start = out
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        if at_start {
            let mut up = 0;
            let mut r = rest;
            while let Some(next) = r.strip_prefix("super::") {
                up += 1;
                r = next;
            }
            if up > 0 {
                out.push_str(&prefix(up));
                rest = r;
                continue;
            }
            if let Some(next) = rest.strip_prefix("self::") {
                out.push_str(&prefix(0));
                rest = next;
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    // `use child::...` at the start of a line.
    let own = if m == "crate" {
        String::new()
    } else {
        format!("{m}::")
    };
    out.lines()
        .map(|l| {
            let t = l.trim_start();
            if let Some(path) = t
                .strip_prefix("use ")
                .or_else(|| t.strip_prefix("pub use "))
            {
                let first = &path[..ident_len(path)];
                if !first.is_empty()
                    && path[first.len()..].starts_with("::")
                    && modules.contains(&format!("{own}{first}"))
                {
                    return l.replacen(
                        &format!("use {first}::"),
                        &format!("use crate::{own}{first}::"),
                        1,
                    );
                }
            }
            l.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module graph of the crate whose root file is in `root`.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let raw: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            // Comments (doc links included) are not imports; nor is the code of an inline
            // test module (at the end of its file).
            let text = match text.find("\n#[cfg(test)]\nmod tests {") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let code: String = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            (module_of(root, f), code)
        })
        .collect();
    let modules: BTreeSet<String> = raw.iter().map(|(m, _)| m.clone()).collect();
    let texts: Vec<(String, String)> = raw
        .into_iter()
        .map(|(m, code)| {
            let code = absolute_paths(&m, &code, &modules);
            (m, code)
        })
        .collect();
    texts
        .iter()
        .map(|(m, text)| {
            let mut d = deps_of(text, &modules);
            d.remove(m);
            // A folder's mod.rs only declares its children.
            d.retain(|x| !m.starts_with(&format!("{x}::")));
            (m.clone(), d)
        })
        .collect()
}

/// A cycle in the graph, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            match state.get(d) {
                Some(1) => {
                    let from = stack.iter().position(|x| x == d).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(g, d, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if !state.contains_key(m) {
            let mut stack = Vec::new();
            if let Some(c) = visit(g, m, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn assert_acyclic(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let g = graph(root);
    assert!(g.len() > 1, "no modules found under {}", root.display());
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "import circle in {}: {}",
            root.display(),
            cycle.join(" -> ")
        );
    }
    g
}

#[test]
fn the_graph_reader_finds_a_circle() {
    let modules: BTreeSet<String> = ["a", "b", "b::c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        deps_of(
            "use crate::b::{c, Thing};\nfn f() { crate::a::g(); }",
            &modules
        ),
        ["a", "b", "b::c"].iter().map(|s| s.to_string()).collect()
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b::c".to_string()]));
    g.insert("b::c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".to_string(), "b::c".to_string(), "a".to_string()])
    );
    g.insert("b::c".to_string(), BTreeSet::new());
    assert_eq!(find_cycle(&g), None);
}

/// The server's layer of a module: a module may use modules of its own layer or below.
fn layer(module: &str) -> usize {
    let order: [(&str, usize); 9] = [
        ("setup", 0),
        ("state", 1),
        ("exec::session", 2),
        ("exec::splice", 2),
        ("features", 3),
        ("exec", 4),
        ("runtime", 5),
        ("server", 6),
        ("crate", 7),
    ];
    order
        .iter()
        .find(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}::")))
        .map(|(_, l)| *l)
        .unwrap_or_else(|| {
            panic!("{module} is in no layer: add it to tests/layers.rs and ARCHITECTURE.md")
        })
}

#[test]
fn kvcached_has_no_import_circle_and_its_layers_point_down() {
    let g = assert_acyclic(&workspace().join("crates/kvcached"));
    let mut upward = Vec::new();
    for (m, deps) in &g {
        for d in deps {
            if layer(d) > layer(m) {
                upward.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers: {}",
        upward.join(", ")
    );
}

#[test]
fn kvproto_has_no_import_circle() {
    assert_acyclic(&workspace().join("crates/kvproto/src"));
}

/// kvstore's layer of a module: a part may use parts of its own layer or below. The engine's
/// parts are `impl LogEngine` blocks; a part's use of its parent (the engine's type and the
/// helpers every path shares, in `log/mod.rs`) is not counted, as for any `mod.rs`.
fn store_layer(module: &str) -> usize {
    let order: [(&str, usize); 41] = [
        // Foundations: formats and structures that own their state.
        ("number", 0),
        // The flash tier's page store: bytes and files, nothing of items.
        ("flash::layout", 0),
        ("flash::file", 0),
        ("flash::tier", 0),
        ("flash", 0),
        ("log::sync", 0),
        ("log::flush", 0),
        ("log::format", 0),
        ("log::mem", 0),
        ("log::cas", 0),
        ("log::tally", 0),
        ("log::repl::remembered", 0),
        ("log::written", 0),
        ("log::arena", 0),
        ("log::order", 0),
        ("log::stats", 0),
        ("log::sweep", 0),
        ("log::index", 1),
        ("log::lease", 1),
        ("log::sketch", 1),
        ("log::seg", 1),
        ("log::repl::wire", 1),
        // The types replication shares with the write and eviction paths.
        ("log::repl", 1),
        // Segments' lives: taking, opening, sealing, retiring; open segments.
        ("log::segments", 2),
        ("log::ttl", 2),
        ("log::open", 2),
        // The paths that write, evict and grow.
        ("log::write", 3),
        ("log::evict", 3),
        ("log::grow", 3),
        // The flash tier's engine side: demotion, binding, reads.
        ("log::flash", 3),
        ("log::compact", 4),
        ("log::meta", 4),
        // What is built on them.
        ("log::repl::serve", 5),
        ("log::repl::apply", 5),
        ("log::repl::notes", 5),
        ("log::walk", 5),
        ("log::engine", 5),
        ("log::snapshot", 6),
        // The engine that composes the parts, and the model.
        ("log", 7),
        ("model", 7),
        ("crate", 8),
    ];
    order
        .iter()
        .find(|(m, _)| module == *m)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| {
            panic!("{module} is in no layer: add it to tests/layers.rs and ARCHITECTURE.md")
        })
}

/// The imports of `g` against `layer` (from a module to one of a higher layer).
fn upward(g: &BTreeMap<String, BTreeSet<String>>, layer: fn(&str) -> usize) -> Vec<String> {
    let mut up = Vec::new();
    for (m, deps) in g {
        for d in deps {
            if layer(d) > layer(m) {
                up.push(format!("{m} -> {d}"));
            }
        }
    }
    up
}

#[test]
fn kvstore_has_no_import_circle_and_its_layers_point_down() {
    let g = assert_acyclic(&workspace().join("crates/kvstore/src"));
    let up = upward(&g, store_layer);
    assert!(
        up.is_empty(),
        "imports against the layers: {}",
        up.join(", ")
    );
}

/// The test of the tests: in a crate made here, an import written with `super::`, with
/// `self::`, or by a child's bare name in its parent makes the circle it makes, and an
/// import of a higher layer is reported.
#[test]
fn relative_imports_count_and_an_added_circle_or_upward_import_is_found() {
    let dir = std::env::temp_dir().join(format!("kvcache-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("log")).expect("make a crate");
    let write = |path: &str, text: &str| {
        std::fs::write(dir.join(path), text).expect("write a module");
    };
    write("lib.rs", "mod log;\n");
    write(
        "log/mod.rs",
        "mod format;\nmod segments;\nuse segments::Open;\nuse self::format::Rec;\n",
    );
    write("log/format.rs", "pub struct Rec;\n");
    write(
        "log/segments.rs",
        "use super::format::Rec;\npub struct Open;\n#[cfg(test)]\nmod tests {\n    use super::super::*;\n}\n",
    );
    let g = graph(&dir);
    assert_eq!(
        g["log"],
        BTreeSet::from(["log::format".to_string(), "log::segments".to_string()])
    );
    assert_eq!(
        g["log::segments"],
        BTreeSet::from(["log::format".to_string()])
    );
    assert_eq!(find_cycle(&g), None);
    fn layer(m: &str) -> usize {
        match m {
            "log::format" => 0,
            "log::segments" => 1,
            _ => 2,
        }
    }
    assert!(upward(&g, layer).is_empty());
    // An upward import (format uses segments) is reported, and it closes a circle.
    write("log/format.rs", "pub struct Rec(super::segments::Open);\n");
    let g = graph(&dir);
    assert_eq!(upward(&g, layer), vec!["log::format -> log::segments"]);
    assert!(find_cycle(&g).is_some(), "{g:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// kvblast's layers, lowest first; a module imports only from its own layer or the ones
/// below (ARCHITECTURE.md and `crates/kvblast/src/lib.rs` list them).
fn blast_layer(module: &str) -> usize {
    const LAYERS: &[(&str, usize)] = &[
        ("units", 0),
        ("dist", 0),
        ("route", 0),
        ("workload", 1),
        ("transport", 1),
        ("stats", 2),
        ("engine", 3),
        ("capacity", 4),
        ("plot", 5),
        ("cli", 5),
        ("agent", 6),
        ("crate", 7),
    ];
    LAYERS
        .iter()
        .find(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}::")))
        .map(|&(_, n)| n)
        .unwrap_or_else(|| {
            panic!("{module} is in no layer: add it to tests/layers.rs and ARCHITECTURE.md")
        })
}

#[test]
fn kvblast_has_no_import_circle_and_its_layers_point_down() {
    let g = assert_acyclic(&workspace().join("crates/kvblast/src"));
    let up = upward(&g, blast_layer);
    assert!(
        up.is_empty(),
        "imports against the layers: {}",
        up.join(", ")
    );
}

#[test]
fn kvtls_has_no_import_circle() {
    assert_acyclic(&workspace().join("crates/kvtls/src"));
}

/// kvtls knows nothing of memcached's protocols, the store or the server.
#[test]
fn kvtls_depends_on_no_other_crate_of_the_workspace() {
    let manifest = std::fs::read_to_string(workspace().join("crates/kvtls/Cargo.toml"))
        .expect("read kvtls's manifest");
    for other in ["kvproto", "kvstore", "kvblast", "kvcached"] {
        assert!(
            !manifest.contains(other),
            "kvtls must not depend on {other}"
        );
    }
}
