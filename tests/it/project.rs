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
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
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
