//! The CLI meets its ecosystem's conventions: shell completions that the shell
//! accepts, man pages that cannot rot (the committed ones are what the code
//! makes), a machine-readable version, USAGE errors that name what is missing,
//! and `serve` taking its flags from the environment. Through the real binary.

use std::process::Command;

use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
const MAN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/man");

fn fl(args: &[&str]) -> std::process::Output {
    Command::new(FENCELOG).args(args).env_remove("FENCELOG_DIR").output().unwrap()
}

/// Proves: `fencelog completions bash` is a script bash parses (`bash -n`), and
/// the zsh and fish scripts name every top-level command.
#[test]
fn completions_are_scripts_each_shell_accepts() {
    let bash = fl(&["completions", "bash"]);
    assert_eq!(bash.status.code(), Some(0));
    let t = tempfile::tempdir().unwrap();
    let script = t.path().join("fencelog.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(check.status.success(), "bash -n: {}", String::from_utf8_lossy(&check.stderr));
    for shell in ["zsh", "fish"] {
        let out = fl(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for cmd in ["claim", "takeover", "serve", "inspect", "audit", "process", "completions"] {
            assert!(text.contains(cmd), "{shell} completions name {cmd}");
        }
    }
    let bad = fl(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown shell is a usage error");
}

/// Proves: the man pages committed in `docs/man/` are exactly what `fencelog man`
/// makes from the code (the same files, byte for byte), so a flag added without
/// regenerating them fails here; every page is a roff man page (`.TH`).
/// Regenerate: `cargo run -- man --out docs/man`.
#[test]
fn the_committed_man_pages_are_what_the_code_makes() {
    let t = tempfile::tempdir().unwrap();
    let out = fl(&["man", "--out", t.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let listed = |dir: &std::path::Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    let made = listed(t.path());
    assert_eq!(listed(std::path::Path::new(MAN_DIR)), made, "the same pages (regenerate docs/man)");
    assert!(made.contains(&"fencelog.1".to_owned()) && made.contains(&"fencelog-inspect-verify.1".to_owned()));
    for name in &made {
        let fresh = std::fs::read(t.path().join(name)).unwrap();
        assert!(fresh.starts_with(b".ie") || String::from_utf8_lossy(&fresh).contains(".TH"), "{name} is roff");
        assert_eq!(std::fs::read(std::path::Path::new(MAN_DIR).join(name)).unwrap(), fresh, "{name} differs");
    }
}

/// Proves: `fencelog version --json` says the version, the format version it
/// writes and those it reads, and its features; the text form says the same.
#[test]
fn version_json_names_the_formats_read_and_written() {
    let out = fl(&["version", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["format_version_written"], 2);
    assert_eq!(v["format_versions_read"], serde_json::json!([1, 2]));
    assert_eq!(v["features"], serde_json::json!(["cli", "daemon", "etcd"]));
    let text = String::from_utf8(fl(&["version"]).stdout).unwrap();
    assert!(text.starts_with(&format!("fencelog {}", env!("CARGO_PKG_VERSION"))), "{text}");
}

/// Proves: a missing argument is named in the USAGE error's one JSON line (it was
/// cut at "were not provided:"), and the exit code is 2.
#[test]
fn usage_errors_name_the_missing_argument() {
    let out = fl(&["claim", "--subject", "x"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), v["error"]["code"].as_str()), (Some(2), Some("USAGE")));
    assert!(v["error"]["message"].as_str().unwrap().contains("--dir"), "{v}");
    let out = fl(&["heartbeat", "--dir", "/nonexistent"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--subject") && message.contains("--generation"), "{v}");
}

/// Proves: `serve --help` does not offer `--server` (meaningless for the server
/// itself), and every one of serve's flags names its environment variable.
#[test]
fn serve_takes_every_flag_from_the_environment_and_offers_no_server() {
    let help = String::from_utf8(fl(&["serve", "--help"]).stdout).unwrap();
    assert!(!help.contains("--server"), "{help}");
    for var in [
        "FENCELOG_DIR",
        "FENCELOG_ETCD",
        "FENCELOG_ETCD_PREFIX",
        "FENCELOG_TOKEN_FILE",
        "FENCELOG_LISTEN",
        "FENCELOG_HOME",
        "FENCELOG_DRAIN_GRACE_MS",
        "FENCELOG_HANDOVER",
        "FENCELOG_UNIX",
        "FENCELOG_HEADER_READ_TIMEOUT_MS",
    ] {
        assert!(help.contains(&format!("[env: {var}")), "serve --help names {var}");
    }
}

/// Proves: `serve` started with no flags at all, only `FENCELOG_DIR`,
/// `FENCELOG_LISTEN`, `FENCELOG_HOME` and `FENCELOG_ACCESS_LOG=1` (a flag's `1`,
/// as systemd environment files write it) in its environment, uses them: it
/// listens where told, keeps its log in that directory, and claims that home.
#[test]
fn serve_configured_by_the_environment_alone_uses_it() {
    use std::io::BufRead;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let mut child = Command::new(FENCELOG)
        .arg("serve")
        .env("FENCELOG_DIR", &dir)
        .env("FENCELOG_LISTEN", "127.0.0.1:0")
        .env("FENCELOG_HOME", "env/home")
        .env("FENCELOG_ACCESS_LOG", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(ready["listening"].as_str().unwrap().starts_with("127.0.0.1:"), "{ready}");
    let out = fl(&["inspect", "dump", dir.to_str().unwrap(), "--json"]);
    let first: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["events"][0]["subject"], "env/home", "{first}");
}

/// Proves: the package carries what `cargo publish` needs (a license with its
/// text, a rust-version, a description), so `cargo publish --dry-run` is not
/// refused for metadata; the dry run itself (it reaches the registry and
/// compiles the packaged crate) is in the closing notes, not in the suite.
#[test]
fn the_manifest_carries_what_publishing_needs() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let field = |name: &str| {
        manifest.lines().find_map(|l| l.strip_prefix(&format!("{name} = "))).map(|v| v.trim_matches('"').to_owned())
    };
    assert_eq!(field("license").as_deref(), Some("MIT"));
    assert!(field("rust-version").is_some_and(|v| v.starts_with("1.")), "rust-version");
    assert!(field("description").is_some_and(|d| !d.is_empty()));
    let license = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/LICENSE")).unwrap();
    assert!(license.starts_with("MIT License"));
}
