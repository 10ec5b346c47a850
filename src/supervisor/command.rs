//! What a `run` asks for, resolved before anything is recorded: the real path of
//! the executable and a fingerprint of it, the arguments, the real working
//! directory, and the `--env` entries (names in clear, values as blake3). The
//! command fingerprint is the blake3 of all of it: the same request id with
//! another fingerprint is another command.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::model::{ARGS_BYTES_MAX, ARGS_MAX, CommandSpec, ENV_ENTRIES_MAX, EnvDigest, Refusal};
use crate::ops::OpError;

fn invalid(detail: impl Into<String>) -> OpError {
    OpError::Refused(Refusal::InvalidInput { detail: detail.into() })
}

/// `dev:inode:size:mtime_ns` of a file: what changes when it is replaced or
/// rewritten.
pub fn file_fingerprint(path: &Path) -> std::io::Result<String> {
    let m = std::fs::metadata(path)?;
    Ok(format!("{}:{}:{}:{}", m.dev(), m.ino(), m.size(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
}

/// The executable `program` names, as `execvp` would find it (a name without a
/// slash is looked for in `PATH`; a relative path is taken from `cwd`), resolved to
/// its real path.
fn resolve_exe(program: &str, cwd: &Path, path_var: Option<&std::ffi::OsStr>) -> Result<PathBuf, OpError> {
    let executable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    let found = if program.contains('/') {
        let p = cwd.join(program);
        executable(&p).then_some(p)
    } else {
        path_var
            .map(std::env::split_paths)
            .into_iter()
            .flatten()
            .map(|d| cwd.join(d).join(program))
            .find(|p| executable(p))
    };
    let found = found.ok_or_else(|| OpError::Usage {
        code: "COMMAND_NOT_FOUND",
        message: format!("no executable file {program:?} (looked from {} and in PATH)", cwd.display()),
    })?;
    std::fs::canonicalize(&found)
        .map_err(|e| OpError::Usage { code: "COMMAND_NOT_FOUND", message: format!("{}: {e}", found.display()) })
}

/// Resolve `argv` run in `cwd` (default: the caller's) with `env` set.
/// `key`: the log's environment key ([`super::secrets::env_key`]), needed when
/// `env` is not empty.
pub fn resolve(
    argv: &[String],
    cwd: Option<&Path>,
    env: &[(String, String)],
    key: Option<&[u8; 32]>,
) -> Result<CommandSpec, OpError> {
    if argv.is_empty() || argv.len() > ARGS_MAX {
        return Err(invalid(format!("a command has 1..={ARGS_MAX} arguments (the program included)")));
    }
    if argv.iter().map(String::len).sum::<usize>() > ARGS_BYTES_MAX {
        return Err(invalid(format!("a command's arguments total at most {ARGS_BYTES_MAX} bytes")));
    }
    if argv.iter().any(|a| a.as_bytes().contains(&0)) || argv[0].is_empty() {
        return Err(invalid("an argument holds no NUL byte, and the program is named"));
    }
    if env.len() > ENV_ENTRIES_MAX {
        return Err(invalid(format!("at most {ENV_ENTRIES_MAX} --env entries")));
    }
    let here = std::env::current_dir().map_err(|e| OpError::Io { message: format!("current directory: {e}") })?;
    let cwd = match cwd {
        Some(c) => here.join(c),
        None => here,
    };
    let cwd = std::fs::canonicalize(&cwd)
        .ok()
        .filter(|c| c.is_dir())
        .ok_or_else(|| invalid(format!("working directory {} is not a directory", cwd.display())))?;
    let mut names = std::collections::BTreeSet::new();
    let mut digests = Vec::with_capacity(env.len());
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.as_bytes().contains(&0) || v.as_bytes().contains(&0) {
            return Err(invalid(format!("--env {k:?}: a name is not empty and holds no '=' or NUL")));
        }
        if !names.insert(k.clone()) {
            return Err(invalid(format!("--env {k} is given twice")));
        }
        // Keyed: a digest in the log (and in every process view) cannot be tested
        // against guesses without the key, nor linked across logs.
        let value_blake3 = match key {
            Some(key) => super::secrets::env_digest(key, v.as_bytes()),
            None => return Err(invalid("--env needs the log's environment key (env.key)")),
        };
        digests.push(EnvDigest { name: k.clone(), value_blake3 });
    }
    digests.sort();
    // PATH as the command will see it: the one given with --env, else ours.
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    let exe = resolve_exe(&argv[0], &cwd, path_var.as_deref())?;
    let exe_fingerprint =
        file_fingerprint(&exe).map_err(|e| OpError::Io { message: format!("{}: {e}", exe.display()) })?;
    let utf8 = |p: &Path, what: &str| {
        std::str::from_utf8(p.as_os_str().as_bytes())
            .map(str::to_owned)
            .map_err(|_| invalid(format!("the {what} path {} is not UTF-8", p.display())))
    };
    Ok(CommandSpec {
        exe: utf8(&exe, "executable")?,
        exe_fingerprint,
        argv: argv.to_vec(),
        cwd: utf8(&cwd, "working directory")?,
        env: digests,
    })
}

/// The command fingerprint: blake3 of everything in the spec (env values as their
/// digests). Part of the log's meaning: never changes for a given spec.
pub fn fingerprint(spec: &CommandSpec) -> [u8; 32] {
    crate::ledger::intent_digest(&("command", spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_enter_only_as_digests_and_order_does_not_matter() {
        let a = resolve(
            &["sh".into(), "-c".into(), "true".into()],
            Some(Path::new("/")),
            &[("B".into(), "secret-b".into()), ("A".into(), "secret-a".into())],
            Some(&[7; 32]),
        )
        .unwrap();
        let b = resolve(
            &["sh".into(), "-c".into(), "true".into()],
            Some(Path::new("/")),
            &[("A".into(), "secret-a".into()), ("B".into(), "secret-b".into())],
            Some(&[7; 32]),
        )
        .unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("secret"), "{json}");
        assert_eq!(a.env[0].name, "A");
        let c = resolve(
            &["sh".into(), "-c".into(), "true".into()],
            Some(Path::new("/")),
            &[("A".into(), "x".into())],
            Some(&[7; 32]),
        )
        .unwrap();
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn a_missing_program_is_named() {
        let e = resolve(&["no-such-program-fencelog".into()], None, &[], None).unwrap_err();
        assert_eq!(e.code(), "COMMAND_NOT_FOUND");
    }
}
