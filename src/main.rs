//! Thin entry point: parse, run, exit with the code `cli` chose.
fn main() {
    std::process::exit(applianced::cli::main());
}
