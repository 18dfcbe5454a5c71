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

/// Run `scripts/SCRIPT` on the code; it must pass. Returns the count it reports for
/// the core (`core/src: … N WHAT …`), to show it read the code.
fn script_count(script: &str, what: &str) -> usize {
    let out = Command::new("python3")
        .arg(format!("scripts/{script}"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("run python3 scripts/{script}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let core = text
        .lines()
        .find(|l| l.starts_with("core/src:"))
        .expect("the core read");
    core.split(&format!(" {what}"))
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count of {what}: {core}"))
}

/// No two modules of a crate import each other in a circle, directly or through
/// others (`scripts/module-cycles`, which reads every `crate::`, `super::` and
/// `self::` path of each crate's modules; on the code before `dispatcher::not_stored`
/// it finds `ingest`, `overheard` and `threads`).
#[test]
fn no_modules_import_each_other_in_a_circle() {
    // It read the code: the core's rooms name each other often.
    assert!(script_count("module-cycles", "edges") > 100);
}

/// Every module a file declares is named in that file's module doc, so a reader who
/// walks down from a crate's doc meets each one (`scripts/module-docs`, which reads
/// every `mod NAME;` outside test-only code and the leading `//!` lines above it).
#[test]
fn every_module_is_named_in_its_parents_doc() {
    // It read the code: the core declares more than a hundred modules.
    assert!(script_count("module-docs", "modules") > 100);
}

/// The check above can fail: a crate whose root declares `a` and `b` while its doc
/// names only `a` is refused, and the refusal names `b`.
#[test]
fn the_module_doc_check_fails_on_a_module_left_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("lib.rs"),
        "//! The fixture: [`a`] is named, its sibling is not.\n\nmod a;\nmod b;\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("a.rs"), "//! One module.\n").unwrap();
    std::fs::write(dir.path().join("b.rs"), "//! The other.\n").unwrap();
    let out = Command::new("python3")
        .arg("scripts/module-docs")
        .arg(dir.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run python3 scripts/module-docs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("lib.rs: mod b is not named"), "{text}");
    assert!(!text.contains("mod a is not named"), "{text}");
    assert!(text.contains("2 modules, 1 not named"), "{text}");
}
