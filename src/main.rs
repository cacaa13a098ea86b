//! Thin entry point: parse, run, exit with the code `cli` chose.
#![deny(unsafe_code)]

fn main() {
    applianced::model::use_one_malloc_arena();
    // The default SIGPIPE action, so that writing to a closed pipe (`applianced inspect x.zlb |
    // head`) ends the process quietly like other Unix tools instead of panicking in println!.
    applianced::sys::set_signal(libc::SIGPIPE, applianced::sys::Disposition::Default);
    std::process::exit(applianced::cli::main());
}
