//! The library's promise about its dependencies (issue 8 §5): without its default
//! features (`cli`, `daemon`) it builds, and pulls neither the command-line crates
//! nor tokio's multi-thread runtime.

use std::process::Command;

/// Proves: `cargo build --lib --no-default-features` succeeds without a warning,
/// and the dependency
/// tree of that build has no clap, indicatif, tracing-subscriber, ureq, axum or
/// mimalloc, and no tokio `rt-multi-thread`.
#[test]
fn the_library_builds_without_its_default_features_and_without_their_crates() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = env!("CARGO_MANIFEST_DIR");
    // Its own target directory: the outer build's lock and artefacts stay untouched.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-default-features");
    let build = Command::new(&cargo)
        .args(["build", "--lib", "--no-default-features", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root)
        .output()
        .expect("run cargo");
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    // Warning-free too: what only the binary, the tests or the daemon use is not
    // left dead in an embedder's build (the `internals` feature, `cfg` gates).
    let stderr = String::from_utf8_lossy(&build.stderr);
    assert!(!stderr.contains("warning"), "the library alone builds with warnings:\n{stderr}");
    let tree = |args: &[&str]| {
        let out = Command::new(&cargo)
            .args(["tree", "--no-default-features", "--prefix", "none", "--offline"])
            .args(args)
            .current_dir(root)
            .output()
            .expect("run cargo tree");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // (With the default features both lists below are found: the checks can fail.)
    let crates = tree(&["--edges", "normal"]);
    for name in ["clap", "indicatif", "tracing-subscriber", "ureq", "axum", "mimalloc"] {
        let line = format!("{name} v");
        assert!(!crates.lines().any(|l| l.starts_with(&line)), "{name} is in the library's tree:\n{crates}");
    }
    let tokio = tree(&["--edges", "normal,features", "--invert", "tokio"]);
    assert!(tokio.contains("tokio feature \"rt\""), "the tree of tokio's features was not read:\n{tokio}");
    assert!(!tokio.contains("rt-multi-thread"), "tokio's multi-thread runtime is in the library's tree:\n{tokio}");
}
