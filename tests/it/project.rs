//! Promises the repository makes to someone building it: the `rust-version` in
//! Cargo.toml is one that can build the locked dependencies, and the license the
//! manifest names is there.

use std::process::Command;

fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text.split('.').map(|p| p.parse().unwrap()).collect();
    parts.resize(3, 0);
    parts
}

/// A `rust-version` older than a locked dependency's makes cargo fail on that
/// toolchain with an error about the dependency, not about lull.
#[test]
fn rust_version_covers_every_locked_dependency() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = metadata["packages"].as_array().unwrap();
    let ours = packages
        .iter()
        .find(|p| p["name"] == "lull")
        .and_then(|p| p["rust_version"].as_str())
        .expect("Cargo.toml names a rust-version");
    let needed: Vec<(String, &str)> = packages
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?.to_owned(), p["rust_version"].as_str()?)))
        .filter(|(_, v)| version(v) > version(ours))
        .collect();
    assert!(
        needed.is_empty(),
        "rust-version {ours} is older than these dependencies need: {needed:?}"
    );
}

#[test]
fn the_license_the_manifest_names_is_included() {
    let manifest = include_str!("../../Cargo.toml");
    assert!(manifest.contains("license = \"MIT\""));
    let license = include_str!("../../LICENSE");
    assert!(license.starts_with("MIT License"), "{license}");
}

/// The architecture, as cargo sees it: the core names no chat platform, no HTTP server,
/// no adapter and not the binary (not even through another crate); the adapters reach
/// the core only through the port.
#[test]
fn the_crate_graph_points_one_way() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let name_of = |id: &str| -> String {
        metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let node = |name: &str| {
        nodes
            .iter()
            .find(|n| name_of(n["id"].as_str().unwrap()) == name)
            .unwrap_or_else(|| panic!("{name} in the graph"))
    };
    // Normal (non-dev) dependencies, all the way down.
    let closure = |name: &str| -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![name.to_owned()];
        while let Some(next) = todo.pop() {
            for dep in node(&next)["deps"].as_array().unwrap() {
                let normal = dep["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null());
                let dep = name_of(dep["pkg"].as_str().unwrap());
                if normal && seen.insert(dep.clone()) {
                    todo.push(dep);
                }
            }
        }
        seen
    };
    let core = closure("lull-core");
    for forbidden in ["lull", "lull-adapters", "teloxide", "serenity", "axum"] {
        assert!(
            !core.contains(forbidden),
            "lull-core depends on {forbidden}"
        );
    }
    let port = closure("lull-port");
    for forbidden in [
        "lull",
        "lull-core",
        "lull-adapters",
        "rusqlite",
        "teloxide",
        "serenity",
    ] {
        assert!(
            !port.contains(forbidden),
            "lull-port depends on {forbidden}"
        );
    }
    let adapters = closure("lull-adapters");
    for forbidden in ["lull", "lull-core", "rusqlite"] {
        assert!(
            !adapters.contains(forbidden),
            "lull-adapters depends on {forbidden}"
        );
    }
    assert!(adapters.contains("lull-port"));
}

/// No two modules of a crate import each other in a circle, directly or through
/// others: each `crate::`/`super::` path in a module's code (its tests left out) is
/// an edge to the module it names, counted between the two siblings under their
/// lowest common ancestor (`dispatcher::round::generate` naming
/// `dispatcher::delivery` is `round → delivery`; a module naming its own parent or
/// child is no edge: a parent declares and re-exports its children). A cycle among
/// the siblings of any module fails with its path.
#[test]
fn no_modules_import_each_other_in_a_circle() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for krate in ["src", "port/src", "core/src", "adapters"] {
        let graph = module_graph(&root.join(krate));
        let edges: usize = graph.values().map(|to| to.len()).sum();
        eprintln!("{krate}: {} modules import {edges} siblings", graph.len());
        // The checker reads the code: the core's rooms name each other often.
        assert!(
            krate != "core/src" || edges > 50,
            "{krate}: only {edges} edges found"
        );
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "{krate}: modules import each other in a circle: {}",
                cycle.join(" → ")
            );
        }
    }
}

type Module = Vec<String>;

/// The sibling-level import edges of the crate under `src`.
fn module_graph(
    src: &std::path::Path,
) -> std::collections::BTreeMap<Module, std::collections::BTreeSet<Module>> {
    let mut files = Vec::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let module_of = |path: &std::path::Path| -> Module {
        let relative = path.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Module = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    };
    let known: std::collections::BTreeSet<Module> = files.iter().map(|f| module_of(f)).collect();
    let mut graph: std::collections::BTreeMap<Module, std::collections::BTreeSet<Module>> =
        Default::default();
    for file in &files {
        let from = module_of(file);
        let text = std::fs::read_to_string(file).unwrap();
        // The module's own code: its test module (at the end, by this code base's
        // habit) may reach anywhere.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for path in paths_in(&code) {
            let (base, rest) = match path.first().map(String::as_str) {
                Some("crate") => (Vec::new(), &path[1..]),
                Some("super") => {
                    let supers = path.iter().take_while(|p| *p == "super").count();
                    // A file module's `super` is its parent; `mod.rs`'s is the
                    // directory's parent, the same thing for the module path.
                    let keep = from.len().saturating_sub(supers);
                    (from[..keep].to_vec(), &path[supers..])
                }
                _ => continue,
            };
            let mut full = base;
            full.extend(rest.iter().cloned());
            // The longest prefix that is a module of this crate.
            let Some(to) = (0..=full.len())
                .rev()
                .map(|n| full[..n].to_vec())
                .find(|m| known.contains(m))
            else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            graph
                .entry(from[..=common].to_vec())
                .or_default()
                .insert(to[..=common].to_vec());
        }
    }
    graph
}

/// Every `crate::…`, `super::…` path in `code`, `use` trees expanded
/// (`super::{a, b::{c}}` gives `super::a`, `super::b::c`).
fn paths_in(code: &str) -> Vec<Vec<String>> {
    fn ident(s: &[u8], mut i: usize) -> (String, usize) {
        let start = i;
        while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
            i += 1;
        }
        (String::from_utf8_lossy(&s[start..i]).into_owned(), i)
    }
    /// The paths of the use tree starting at `i` (after a `::`), with `prefix`.
    fn tree(s: &[u8], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < s.len() && s[i] == b'{' {
            i += 1;
            loop {
                while i < s.len() && (s[i].is_ascii_whitespace() || s[i] == b',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == b'}' {
                    return i + 1;
                }
                let before = i;
                i = tree(s, i, prefix.clone(), out);
                if i == before {
                    i += 1;
                }
            }
        }
        let (name, next) = ident(s, i);
        if name.is_empty() {
            out.push(prefix);
            return i;
        }
        let mut path = prefix;
        path.push(name);
        if s[next..].starts_with(b"::") {
            return tree(s, next + 2, path, out);
        }
        out.push(path);
        next
    }
    let s = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary =
            i == 0 || !(s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_' || s[i - 1] == b':');
        let head = ["crate::", "super::"]
            .into_iter()
            .find(|h| s[i..].starts_with(h.as_bytes()));
        match head {
            Some(h) if boundary => {
                let mut prefix = vec![h.trim_end_matches("::").to_owned()];
                let mut j = i + h.len();
                while s[j..].starts_with(b"super::") {
                    prefix.push("super".into());
                    j += "super::".len();
                }
                i = tree(s, j, prefix, &mut out).max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// A cycle in `graph`, as the modules along it (the first repeated at the end).
fn find_cycle(
    graph: &std::collections::BTreeMap<Module, std::collections::BTreeSet<Module>>,
) -> Option<Vec<String>> {
    fn visit(
        node: &Module,
        graph: &std::collections::BTreeMap<Module, std::collections::BTreeSet<Module>>,
        state: &mut std::collections::BTreeMap<Module, bool>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(true) => {
                let start = stack.iter().position(|m| m == node).unwrap();
                let mut cycle: Vec<String> = stack[start..].iter().map(|m| m.join("::")).collect();
                cycle.push(node.join("::"));
                return Some(cycle);
            }
            Some(false) => return None,
            None => {}
        }
        state.insert(node.clone(), true);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node.clone(), false);
        None
    }
    let mut state = Default::default();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}
