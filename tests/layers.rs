//! The Architecture Invariants about dependencies, checked on the source: no module of a crate
//! imports another that imports it back (directly or through others), and the server's
//! layers point one way (ARCHITECTURE.md): setup → state → exec::session (and its output's
//! exec::splice) → features →
//! executors → runtime → server → main.
//!
//! A module's dependencies are the `crate::...` paths in its code (in `use` lines and inline,
//! not in comments), resolved to the longest module path that exists; `use crate::a::{b, c}`
//! counts `a::b` and `a::c` when they are modules, and `a` when an item of `a` is named.

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
        } else if p.extension().is_some_and(|x| x == "rs") {
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

/// The module graph of the crate whose root file is in `root`.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            // Comments (doc links included) are not imports.
            let code: String = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            (module_of(root, f), code)
        })
        .collect();
    let modules: BTreeSet<String> = texts.iter().map(|(m, _)| m.clone()).collect();
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

#[test]
fn kvstore_has_no_import_circle() {
    assert_acyclic(&workspace().join("crates/kvstore/src"));
}

#[test]
fn kvblast_has_no_import_circle() {
    assert_acyclic(&workspace().join("crates/kvblast/src"));
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
