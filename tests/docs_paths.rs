//! Docs that cannot rot: every repository path that the README, `docs/`,
//! `log-format/`, the scripts and the sources cite (`src/…`, `docs/…`,
//! `tests/…`, `benches/…`, `examples/…`, `scripts/…`, `log-format/…`,
//! `fixtures/…`) exists. A path followed by `*`, `{` or `<` is a pattern: some
//! file must start with it.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TOP: [&str; 8] = ["src/", "docs/", "tests/", "benches/", "examples/", "scripts/", "log-format/", "fixtures/"];

fn files(dir: &Path, ext: Option<&str>, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, ext, out);
        } else if ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)) {
            out.push(p);
        }
    }
}

/// Citations in `text`: (path, whether it is a pattern's prefix).
fn cited(text: &str) -> Vec<(String, bool)> {
    let bytes = text.as_bytes();
    let path_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'/' | b'-');
    let mut out = vec![];
    for top in TOP {
        let mut from = 0;
        while let Some(i) = text[from..].find(top).map(|i| i + from) {
            from = i + top.len();
            // Only where a path starts (not inside a longer path nor `crate::docs/`).
            if i > 0 && (path_char(bytes[i - 1]) || bytes[i - 1] == b':') {
                continue;
            }
            let mut end = i + top.len();
            while end < bytes.len() && path_char(bytes[end]) {
                end += 1;
            }
            // A sentence's full stop, a trailing slash or hyphen are not the path's.
            let path = text[i..end].trim_end_matches(['.', '-']).to_owned();
            let pattern = bytes.get(end).is_some_and(|c| matches!(c, b'*' | b'{' | b'<'));
            if path.len() > top.len() || pattern {
                out.push((path, pattern));
            }
        }
    }
    out
}

/// Proves: no file in the repository cites a path that is not there.
#[test]
fn every_path_the_docs_and_sources_cite_exists() {
    let root = Path::new(ROOT);
    let mut sources = vec![root.join("README.md")];
    files(&root.join("docs"), Some("md"), &mut sources);
    files(&root.join("log-format"), Some("md"), &mut sources);
    files(&root.join("scripts"), None, &mut sources);
    files(&root.join("src"), Some("rs"), &mut sources);
    files(&root.join("tests"), Some("rs"), &mut sources);
    files(&root.join("benches"), Some("rs"), &mut sources);
    sources.push(root.join(".ci/run"));
    let mut missing = vec![];
    let mut checked = 0;
    for src in &sources {
        let text = std::fs::read_to_string(src).unwrap();
        for (path, pattern) in cited(&text) {
            checked += 1;
            let full = root.join(path.trim_end_matches('/'));
            let found = if pattern {
                let (dir, stem) = path.rsplit_once('/').unwrap();
                std::fs::read_dir(root.join(dir))
                    .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with(stem)))
                    .unwrap_or(false)
            } else {
                full.exists() || full.with_extension("rs").exists()
            };
            if !found {
                missing.push(format!("{} cites {path}", src.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(checked > 100, "the scan found the citations: {checked}");
    assert!(missing.is_empty(), "cited but missing:\n{}", missing.join("\n"));
}
