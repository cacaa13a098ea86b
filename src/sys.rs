//! Every call this crate makes into the C library, each behind a safe function whose SAFETY
//! argument is written once, here: process identity, thread CPU time, allocator tuning, signal
//! dispositions, the stderr swap used while GPU drivers print, and dynamic loading of the NVIDIA
//! libraries. (Constants such as `O_NONBLOCK` are used where they are needed.)
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::os::fd::{AsRawFd as _, RawFd};
use std::time::Duration;

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The real uid of this process.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// CPU time the calling thread has used (zero if the clock cannot be read).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec that we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim`; a no-op elsewhere).
pub fn malloc_trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's own arenas to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Limits glibc to one malloc arena (call before any thread starts; a no-op elsewhere).
pub fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// A signal's disposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    Ignore,
    Default,
}

/// Sets the disposition of `signal` (e.g. `libc::SIGPIPE`) for the whole process.
pub fn set_signal(signal: libc::c_int, d: Disposition) {
    let handler = match d {
        Disposition::Ignore => libc::SIG_IGN,
        Disposition::Default => libc::SIG_DFL,
    };
    // SAFETY: `signal` with SIG_IGN or SIG_DFL installs no handler code; the disposition is
    // process-wide and changing it is async-signal-safe and thread-safe.
    unsafe {
        libc::signal(signal, handler);
    }
}

/// fd 2 sent elsewhere until this is dropped, which puts the original back.
pub struct StderrRedirect {
    saved: RawFd,
}

/// Sends fd 2 to `to` (None if the descriptors cannot be duplicated; stderr is then unchanged).
pub fn redirect_stderr(to: &std::fs::File) -> Option<StderrRedirect> {
    // SAFETY: dup/dup2/close on descriptors this function owns (the duplicate of fd 2) or
    // borrows for the call (`to`); fd 2 refers to an open file before, during and after.
    unsafe {
        let saved = libc::dup(2);
        if saved < 0 {
            return None;
        }
        if libc::dup2(to.as_raw_fd(), 2) < 0 {
            libc::close(saved);
            return None;
        }
        Some(StderrRedirect { saved })
    }
}

impl Drop for StderrRedirect {
    fn drop(&mut self) {
        // SAFETY: restore fd 2 from the duplicate this value owns, then close the duplicate.
        unsafe {
            libc::dup2(self.saved, 2);
            libc::close(self.saved);
        }
    }
}

/// A shared library opened with `dlopen`, kept open for the life of the process (CUDA libraries
/// are reused by cudarc, and their function pointers must stay valid).
#[derive(Debug, Clone, Copy)]
pub struct DynLib(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; dlsym on it is thread-safe.
unsafe impl Send for DynLib {}
// SAFETY: as above.
unsafe impl Sync for DynLib {}

impl DynLib {
    /// Opens `path` with `RTLD_NOW` (and `RTLD_GLOBAL` with `global`, else `RTLD_LOCAL`).
    pub fn open(path: &str, global: bool) -> Result<DynLib, String> {
        let c = CString::new(path).map_err(|e| e.to_string())?;
        let flags = libc::RTLD_NOW | if global { libc::RTLD_GLOBAL } else { libc::RTLD_LOCAL };
        // SAFETY: dlopen with a valid C string; the handle is never closed.
        let lib = unsafe { libc::dlopen(c.as_ptr(), flags) };
        if lib.is_null() {
            return Err(format!("{path} could not be loaded ({})", dlerror()));
        }
        Ok(DynLib(lib))
    }

    /// The address of `name`, as a value of the function-pointer type `T`.
    ///
    /// # Safety
    /// `T` must be a pointer-sized function-pointer type whose signature is the symbol's.
    pub unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T, String> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>(), "symbol type must be pointer-sized");
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: dlsym on a live handle with a valid C string.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("the library lacks {name}"));
        }
        // SAFETY: T is pointer-sized (checked above) and, by the caller's contract, the symbol's
        // function-pointer type.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }
}

/// The last dynamic-loading error of this thread.
fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_clock() {
        assert_eq!(euid(), std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(euid()));
        let t0 = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() > t0);
    }

    #[test]
    fn dynamic_loading_reports_what_is_missing() {
        let e = DynLib::open("/nonexistent/libnothing.so", false).unwrap_err();
        assert!(e.contains("libnothing"), "{e}");
        let libc_so = DynLib::open("libc.so.6", false).unwrap();
        // SAFETY: getpid's signature.
        let getpid: unsafe extern "C" fn() -> libc::pid_t = unsafe { libc_so.symbol("getpid") }.unwrap();
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() } as u32, std::process::id());
        // SAFETY: not called.
        assert!(unsafe { libc_so.symbol::<unsafe extern "C" fn()>("no_such_symbol_here") }.is_err());
    }
}
