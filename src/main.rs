//! Thin entry point: parse, run, exit with the code `cli` chose.
#![allow(unsafe_code)]

fn main() {
    applianced::model::use_one_malloc_arena();
    // SAFETY: restoring the default SIGPIPE action before any thread starts, so that writing to a
    // closed pipe (`applianced inspect x.zlb | head`) ends the process quietly like other Unix
    // tools instead of panicking in println!.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(applianced::cli::main());
}
