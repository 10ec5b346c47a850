//! `fencelog man --out DIR`: one roff page for `fencelog` and one for each of its
//! (visible) commands, `fencelog-claim.1`, `fencelog-inspect-verify.1`, …, made by
//! clap_mangen from the same definitions as `--help`. `docs/man/` is written by
//! this command; a test fails when it differs from what the code makes.

use std::path::Path;

use clap::CommandFactory;

/// Write every page to `out`; the file names written, sorted.
pub(crate) fn write_pages(out: &Path) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(out)?;
    let mut cmd = crate::cli::Cli::command();
    cmd.build();
    let mut names = vec![];
    page(&cmd, "fencelog", out, &mut names)?;
    names.sort();
    Ok(names)
}

fn page(cmd: &clap::Command, name: &str, out: &Path, names: &mut Vec<String>) -> std::io::Result<()> {
    let named = cmd.clone().name(name.to_owned()).bin_name(name.replace('-', " "));
    let mut roff = Vec::new();
    clap_mangen::Man::new(named).render(&mut roff)?;
    let file = format!("{name}.1");
    std::fs::write(out.join(&file), roff)?;
    names.push(file);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        page(sub, &format!("{name}-{}", sub.get_name()), out, names)?;
    }
    Ok(())
}
