//! Man pages from the CLI definition (the same clap structure `--help` is generated from):
//! `cargo run --release --example mangen -- OUT_DIR` writes applianced.1 and one page per
//! subcommand (applianced-verify.1, applianced-bundle-install.1, ...). The Debian package ships
//! them gzipped (scripts/ci-packaging.sh, scripts/release.sh).

use clap::CommandFactory as _;

fn main() {
    let out = std::env::args_os().nth(1).expect("usage: mangen OUT_DIR");
    let out = std::path::PathBuf::from(out);
    std::fs::create_dir_all(&out).expect("create OUT_DIR");
    let cmd = applianced::cli::Cli::command();
    clap_mangen::generate_to(cmd, &out).expect("write man pages");
}
