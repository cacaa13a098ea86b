//! The few pieces of the systemd protocol the server speaks, written out (no libsystemd):
//! `sd_notify` (a datagram to `$NOTIFY_SOCKET`, abstract when it starts with `@`), socket
//! activation (`$LISTEN_PID`/`$LISTEN_FDS`, first fd 3) and the watchdog interval
//! (`$WATCHDOG_USEC`/`$WATCHDOG_PID`).

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::time::Duration;

/// Send `state` (e.g. `READY=1`) to the service manager; a no-op outside systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt as _;
        if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name) {
            let _ = sock.send_to_addr(state.as_bytes(), &addr);
        }
    } else {
        let _ = sock.send_to(state.as_bytes(), &path);
    }
}

fn for_us(pid_var: &str) -> bool {
    std::env::var(pid_var).ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id())
}

/// The listening socket passed by systemd socket activation, if any (the variables are then
/// removed so children do not see them).
pub fn activated_listener() -> std::io::Result<Option<UnixListener>> {
    if !for_us("LISTEN_PID") {
        return Ok(None);
    }
    let n: u32 = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    if n == 0 {
        return Ok(None);
    }
    if n > 1 {
        return Err(std::io::Error::other(format!("systemd passed {n} sockets; applianced.socket must have exactly one ListenStream=")));
    }
    use std::os::fd::FromRawFd as _;
    #[allow(unsafe_code)]
    // SAFETY: under the socket-activation protocol (LISTEN_PID is our pid, LISTEN_FDS = 1) fd 3 is
    // an open socket handed to this process and owned by nothing else in it; we take ownership once
    // (the variables are removed above, so no second call can do it again).
    let l = unsafe { UnixListener::from_raw_fd(3) };
    // Reject an fd that is not a listening Unix stream socket (e.g. a TCP ListenStream=).
    let addr = l.local_addr()?;
    if addr.as_pathname().is_none() && addr.is_unnamed() {
        return Err(std::io::Error::other("the socket passed by systemd is not a Unix path socket"));
    }
    Ok(Some(l))
}

/// How often to send `WATCHDOG=1` (half the configured timeout), if the watchdog is on for us.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if std::env::var_os("WATCHDOG_PID").is_some() && !for_us("WATCHDOG_PID") {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
