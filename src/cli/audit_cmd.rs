//! `applianced audit`: check the server's hash-chained audit log (format in src/audit/mod.rs and
//! docs/server.md).

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};

use super::common::CliError;
use crate::audit::{verify_file, AuditError};

#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Verify the hash chain of an audit log: every record's own hash, its sequence number and its
    /// link to the previous record. Names the first broken record by line number. Exit 0 when
    /// intact, 1 when broken, 3 on I/O errors, 17 when the chain is intact but ends in a torn
    /// tail: an incomplete last line left by a crash or a full disk mid-write (not an edited
    /// record); `applianced serve` truncates it at start and records that it did.
    Verify {
        /// The audit log (JSON lines).
        file: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Exit status of `audit verify` for an intact chain followed by a torn tail.
pub const TORN_TAIL_EXIT: i32 = 17;

pub fn exec(args: Args) -> Result<(), CliError> {
    match args.command {
        AuditCommand::Verify { file, json } => match verify_file(&file) {
            Ok(r) => {
                if json {
                    let torn = r.torn_tail.as_ref().map(|t| serde_json::json!({"offset": t.offset, "bytes": t.bytes}));
                    println!("{}", serde_json::json!({"ok": r.torn_tail.is_none(), "records": r.records, "last_hash": r.last_hash, "torn_tail": torn}));
                } else {
                    println!("ok: {} records, chain intact; last hash {}", r.records, r.last_hash);
                }
                match r.torn_tail {
                    None => Ok(()),
                    Some(t) => {
                        if !json {
                            eprintln!(
                                "error: {}: torn tail: {} bytes at offset {} after the last complete record are an incomplete write (a crash or a full disk), not an edited record; `applianced serve` truncates them at start and records it",
                                file.display(),
                                t.bytes,
                                t.offset
                            );
                        }
                        Err(CliError::Reported(TORN_TAIL_EXIT))
                    }
                }
            }
            Err(AuditError::Broken { path, line, msg }) => {
                if json {
                    println!("{}", serde_json::json!({"ok": false, "line": line, "error": msg}));
                    Err(CliError::Reported(1))
                } else {
                    Err(CliError::Audit(AuditError::Broken { path, line, msg: format!("record is broken: {msg}") }))
                }
            }
            Err(AuditError::Io { path, source }) => {
                if json {
                    println!("{}", serde_json::json!({"ok": false, "error": format!("{}: {source}", path.display())}));
                } else {
                    eprintln!("error: {}: {source}", path.display());
                }
                Err(CliError::Reported(3))
            }
            Err(e) => Err(CliError::Audit(e)),
        },
    }
}
