//! Every error code is listed once, in `docs/ERRORS.md`, with its exit code: the
//! refusals by their enum, every other code by the literals the source uses.

use std::path::Path;

use strum::VariantNames;

/// Upper-case literals in `src/` that are not error codes, and why.
const NOT_CODES: &[(&str, &str)] = &[
    ("SCREAMING_SNAKE_CASE", "a serde/strum case style"),
    ("FENCELOG_TOKEN_FILE", "environment variable"),
    ("FENCELOG_SERVER", "environment variable"),
    ("FENCELOG_DIR", "environment variable"),
    ("FENCELOG_ETCD", "environment variable"),
    ("FENCELOG_ETCD_PREFIX", "environment variable"),
    ("FENCELOG_HOST_ID", "test-only environment variable (a simulated host)"),
    ("NOTIFY_SOCKET", "systemd's environment variable"),
    ("WATCHDOG_USEC", "systemd's environment variable"),
    ("WATCHDOG_PID", "systemd's environment variable"),
    ("CARGO_PKG_VERSION", "cargo's build-time variable (env!)"),
    ("CARGO_MANIFEST_DIR", "cargo's build-time variable (env!)"),
    ("FENCELOG_BLESS", "test-only environment variable (rewrite a golden file)"),
    ("FENCELOG_LISTEN", "environment variable"),
    ("FENCELOG_HOME", "environment variable"),
    ("FENCELOG_DRAIN_GRACE_MS", "environment variable"),
    ("FENCELOG_HANDOVER", "environment variable"),
    ("FENCELOG_UNIX", "environment variable"),
    ("FENCELOG_HEADER_READ_TIMEOUT_MS", "environment variable"),
    ("FENCELOG_ACCESS_LOG", "environment variable"),
    ("FENCELOG_LOG_FORMAT", "environment variable"),
    ("PATH", "environment variable"),
    ("FAILPOINTS", "test-only environment variable"),
    ("FENCELOG", "a magic or prefix"),
    ("FLOCK", "a lock mechanism's name in messages"),
    ("FLSNAP01", "the snapshot file magic"),
    ("LOCK", "the lock file's name"),
    ("POST", "an HTTP method"),
    ("SIGINT", "a signal's name"),
    ("SIGTERM", "a signal's name"),
];

fn sources(dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// `"ABCD"` / `"AB_CD"` string literals: upper case, digits and underscores, four or more.
fn upper_literals(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.len() >= 4
                && s.starts_with(|c: char| c.is_ascii_uppercase())
                && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
        .collect()
}

/// Proves: docs/ERRORS.md has a row for every refusal code and every other code
/// literal in the source (a new code fails this test until it is documented), and
/// each row gives an exit code; and the exit-code classes are the contract's.
#[test]
fn every_error_code_is_in_the_table_with_its_exit_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ERRORS.md")).unwrap();
    let mut texts = vec![];
    sources(&root.join("src"), &mut texts);
    let mut codes: Vec<String> = fencelog::model::Refusal::VARIANTS.iter().map(|s| s.to_string()).collect();
    codes.extend(texts.iter().flat_map(|t| upper_literals(t)));
    codes.sort();
    codes.dedup();
    codes.retain(|c| !NOT_CODES.iter().any(|(n, _)| n == c));
    assert!(codes.len() > 40, "the scan found the codes: {codes:?}");
    // Process end codes are not errors: their table has no exit column.
    let (errors, end_codes) = doc.split_once("### Supervisor: process end codes").expect("the end-code section");
    let mut missing = vec![];
    for c in &codes {
        let row = errors.lines().find(|l| l.starts_with(&format!("| `{c}` |")));
        match row {
            Some(row) => {
                let exit = row.split('|').nth(2).unwrap_or("").trim().to_owned();
                let ok = ["0", "1", "2", "3", "4"].iter().any(|e| exit.starts_with(e)) || exit == "—";
                assert!(ok, "{c}: the exit column says {exit:?}");
            }
            None if end_codes.contains(&format!("| `{c}` |")) => {}
            None => missing.push(c.clone()),
        }
    }
    assert!(missing.is_empty(), "codes not in docs/ERRORS.md: {missing:?}");
    for class in
        ["| 1 | I/O error", "| 2 | usage error, invalid input, not a log", "| 3 | refused by the state machine"]
    {
        assert!(doc.contains(class), "the exit classes: {class}");
    }
    assert!(doc.contains("| 4 | `fencelog audit` only"), "exit 4 is the audit's");
}
