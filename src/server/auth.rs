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
    crate::sys::euid()
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

/// Audit records of refused peers, rate-limited per uid: the first refusal of a uid in each
/// [`RefusalLog::interval`] is recorded (with how many refusals of that uid went unrecorded since
/// its previous record); the rest are only counted (`applianced_refused_peers_total`), and their
/// count is written as a `refused_peer_summary` record by [`RefusalLog::due`] once the interval
/// has passed, or at shutdown. A flood from a refused peer costs one record per uid per interval.
#[derive(Debug)]
pub struct RefusalLog {
    interval: std::time::Duration,
    /// uid → (start of its interval, refusals not recorded in it).
    peers: std::collections::HashMap<u32, (std::time::Instant, u64)>,
}

/// uids tracked at once; past it, entries whose interval is over are dropped (their unrecorded
/// counts go out through [`RefusalLog::due`] first when it ran), then the oldest.
const REFUSAL_PEERS: usize = 4096;

impl RefusalLog {
    pub fn new(interval: std::time::Duration) -> RefusalLog {
        RefusalLog { interval, peers: std::collections::HashMap::new() }
    }

    pub fn interval(&self) -> std::time::Duration {
        self.interval
    }

    /// A refusal of `uid` now: Some(unrecorded refusals of that uid before this one) when this one
    /// is to be recorded, None when it is only counted.
    pub fn refused(&mut self, uid: u32, now: std::time::Instant) -> Option<u64> {
        if let Some((start, n)) = self.peers.get_mut(&uid) {
            if now.duration_since(*start) < self.interval {
                *n += 1;
                return None;
            }
            let before = *n;
            *start = now;
            *n = 0;
            return Some(before);
        }
        if self.peers.len() >= REFUSAL_PEERS {
            let interval = self.interval;
            self.peers.retain(|_, (start, n)| now.duration_since(*start) < interval || *n > 0);
            if self.peers.len() >= REFUSAL_PEERS {
                if let Some(oldest) = self.peers.iter().min_by_key(|(_, (s, _))| *s).map(|(u, _)| *u) {
                    self.peers.remove(&oldest);
                }
            }
        }
        self.peers.insert(uid, (now, 0));
        Some(0)
    }

    /// Unrecorded refusals whose interval is over (all of them with `all`), as (uid, count), and
    /// their counts reset.
    pub fn due(&mut self, now: std::time::Instant, all: bool) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let interval = self.interval;
        for (uid, (start, n)) in self.peers.iter_mut() {
            if *n > 0 && (all || now.duration_since(*start) >= interval) {
                out.push((*uid, *n));
                *n = 0;
            }
        }
        self.peers.retain(|_, (start, n)| *n > 0 || now.duration_since(*start) < interval);
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn one_record_per_uid_per_interval_with_counts() {
        let mut r = RefusalLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(r.refused(7, t0), Some(0));
        for i in 1..300 {
            assert_eq!(r.refused(7, t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(r.refused(8, t0), Some(0), "another uid has its own interval");
        assert!(r.due(t0 + Duration::from_secs(1), false).is_empty());
        assert_eq!(r.due(t0 + Duration::from_secs(61), false), vec![(7, 299)]);
        assert_eq!(r.refused(7, t0 + Duration::from_secs(62)), Some(0));
        assert_eq!(r.refused(7, t0 + Duration::from_secs(63)), None);
        assert_eq!(r.refused(7, t0 + Duration::from_secs(130)), Some(1));
        assert_eq!(r.refused(7, t0 + Duration::from_secs(131)), None);
        assert_eq!(r.due(t0 + Duration::from_secs(132), true), vec![(7, 1)]);
    }

    #[test]
    fn table_is_bounded() {
        let mut r = RefusalLog::new(Duration::from_secs(60));
        let t0 = Instant::now();
        for uid in 0..(REFUSAL_PEERS as u32 * 3) {
            assert_eq!(r.refused(uid, t0), Some(0));
        }
        assert!(r.peers.len() <= REFUSAL_PEERS);
    }
}
