//! Access control: who may talk to the socket. Two layers: the socket file's mode and group (the
//! kernel refuses `connect` without write permission), then the peer's credentials read with
//! SO_PEERCRED on every accepted connection, checked against an allowlist of uids and gids.
//!
//! SO_PEERCRED reports the peer's effective uid and gid at `connect` time; supplementary groups are
//! not seen, so list the uids or make the allowed group the clients' primary group.

use super::config::AccessConfig;

/// Peer credentials of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

impl Peer {
    pub fn of(stream: &tokio::net::UnixStream) -> std::io::Result<Peer> {
        let c = stream.peer_cred()?;
        Ok(Peer { uid: c.uid(), gid: c.gid(), pid: c.pid() })
    }
}

/// The effective uid of this process.
pub fn own_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// The resolved allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl Allowlist {
    /// From the config; both lists empty = this process's uid and root.
    pub fn from_config(c: &AccessConfig) -> Allowlist {
        if c.allow_uids.is_empty() && c.allow_gids.is_empty() {
            let mut uids = vec![own_uid(), 0];
            uids.dedup();
            return Allowlist { uids, gids: Vec::new() };
        }
        Allowlist { uids: c.allow_uids.clone(), gids: c.allow_gids.clone() }
    }

    pub fn allows(&self, p: &Peer) -> bool {
        self.uids.contains(&p.uid) || self.gids.contains(&p.gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn allowlist() {
        let a = Allowlist::from_config(&AccessConfig::default());
        assert!(a.allows(&Peer { uid: own_uid(), gid: 12345, pid: None }));
        assert!(a.allows(&Peer { uid: 0, gid: 0, pid: None }));
        let a = Allowlist::from_config(&AccessConfig { allow_uids: vec![7], allow_gids: vec![9], presets: None });
        assert!(a.allows(&Peer { uid: 7, gid: 1, pid: None }));
        assert!(a.allows(&Peer { uid: 8, gid: 9, pid: None }));
        assert!(!a.allows(&Peer { uid: 8, gid: 1, pid: None }));
    }
}
