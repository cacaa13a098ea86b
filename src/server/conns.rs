//! The open-connection table: `limits.max_connections` slots, and who gives one up when they are
//! all taken.
//!
//! A connection is *busy* from the moment a request on it reaches the service until its response
//! body is finished or dropped (a stream included), and *idle* otherwise: between keep-alive
//! requests, or before its first request's headers are complete (a slow or silent client).
//! When a new connection arrives and every slot is taken, the connection idle the longest is
//! closed to make room (an idle HTTP/1.1 connection may be closed at any time; clients reconnect),
//! so a client that opens many connections and sends nothing cannot lock others out. Busy
//! connections are never evicted; when every slot is busy the new connection is closed at once.
//!
//! The evicted connection's slot goes to the connection that evicted it, directly (a hand-over,
//! not the semaphore's queue): under a flood of new connections each arrival waits only for its
//! own victim to close, never behind every earlier arrival's eviction.
//!
//! A new connection enters the table the moment it is admitted, while it still waits for its
//! victim's slot: under a flood the table always holds the newest arrivals as idle candidates,
//! so a later arrival never finds "no idle victim" just because every listed connection was
//! already chosen and the arrivals that chose them were not yet listed. An arrival evicted while
//! it waits passes the slot it then receives straight on to its own evictor.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};

/// How long a new connection waits for the slot of the connection it evicted.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// One open connection's entry.
pub struct Conn {
    id: u64,
    busy: AtomicUsize,
    /// Milliseconds since the table's epoch at which the connection last became idle (or opened).
    idle_since_ms: AtomicU64,
    evict: Notify,
    /// Set when evicted: where this connection's slot goes when it closes.
    handover: Mutex<Option<oneshot::Sender<OwnedSemaphorePermit>>>,
    table: Arc<ConnTable>,
}

/// The table of open connections.
pub struct ConnTable {
    slots: Arc<Semaphore>,
    epoch: Instant,
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
}

/// What [`ConnTable::admit`] decided for a new connection; the entry is already in the table.
pub enum Admit {
    /// A free slot: serve it.
    Slot(OwnedSemaphorePermit, Arc<Conn>),
    /// An idle connection was told to close; wait (off the accept loop) for its slot.
    AfterEviction(oneshot::Receiver<OwnedSemaphorePermit>, Arc<Conn>),
    /// Every slot is busy: close the new connection.
    Full,
}

impl ConnTable {
    pub fn new(max: usize) -> Arc<ConnTable> {
        Arc::new(ConnTable { slots: Arc::new(Semaphore::new(max)), epoch: Instant::now(), next: AtomicU64::new(0), conns: Mutex::new(HashMap::new()) })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decide for a newly accepted connection and enter it in the table (see the module docs);
    /// it leaves the table by [`Conn::close`].
    pub fn admit(self: &Arc<Self>) -> Admit {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            let c = self.entry();
            self.lock().insert(c.id, c.clone());
            return Admit::Slot(p, c);
        }
        // Choose, mark and remove under one lock: a connection closing meanwhile
        // ([`Conn::close`] takes the lock before [`Conn::release`]) is either not chosen or
        // finds its hand-over set.
        let mut conns = self.lock();
        let Some(v) = conns.values().filter(|c| c.busy.load(Ordering::SeqCst) == 0).min_by_key(|c| (c.idle_since_ms.load(Ordering::SeqCst), c.id)).cloned() else {
            return Admit::Full;
        };
        let (tx, rx) = oneshot::channel();
        *v.handover.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        // Out of the table at once, so the next arrival picks another victim; the newcomer in.
        conns.remove(&v.id);
        let c = self.entry();
        conns.insert(c.id, c.clone());
        drop(conns);
        v.evict.notify_one();
        Admit::AfterEviction(rx, c)
    }

    /// Wait for the slot of the connection evicted for this one ([`Admit::AfterEviction`]);
    /// None after [`EVICT_WAIT`].
    pub async fn slot_after_eviction(slot: oneshot::Receiver<OwnedSemaphorePermit>) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(EVICT_WAIT, slot).await.ok()?.ok()
    }

    /// A new, idle entry (not yet in the table).
    fn entry(self: &Arc<Self>) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        Arc::new(Conn {
            id,
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            evict: Notify::new(),
            handover: Mutex::new(None),
            table: self.clone(),
        })
    }

    /// Open connections in the table.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Conn {
    /// Resolves when this connection was chosen for eviction.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// A request on this connection starts; the connection is busy until the guard drops.
    pub fn busy(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard(self.clone())
    }

    /// Whether a request (or its response body) is in progress.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) != 0
    }

    /// Remove the entry (the connection closed).
    pub fn close(&self) {
        self.table.lock().remove(&self.id);
    }

    /// Give up the slot after [`Conn::close`]: to the connection that evicted this one, if any
    /// (and still waiting), else back to the table.
    pub fn release(&self, slot: OwnedSemaphorePermit) {
        let to = self.handover.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = to {
            // A receiver that gave up hands the slot back to the semaphore (dropped).
            let _ = tx.send(slot);
        }
    }
}

/// Held while a request (and its response body) is in progress on a connection.
pub struct BusyGuard(Arc<Conn>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let c = &self.0;
        c.idle_since_ms.store(c.table.now_ms(), Ordering::SeqCst);
        c.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its connection busy until it is finished or dropped.
struct Tracked {
    inner: Body,
    _guard: BusyGuard,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `body`, holding `guard` until it is finished or dropped.
pub fn track(body: Body, guard: BusyGuard) -> Body {
    Body::new(Tracked { inner: body, _guard: guard })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_longest_idle_connection_is_evicted_and_busy_ones_never() {
        let t = ConnTable::new(2);
        let Admit::Slot(p1, a) = t.admit() else { panic!("free slot") };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let Admit::Slot(p2, b) = t.admit() else { panic!("free slot") };
        // Both idle: the older (a) goes first; the newcomer is listed at once.
        let Admit::AfterEviction(slot, c) = t.admit() else { panic!("evicts") };
        tokio::time::timeout(Duration::from_secs(1), a.evicted()).await.expect("a notified");
        assert_eq!(t.len(), 2);
        // a's task ends and hands its slot to the newcomer, not to the semaphore's queue.
        a.close();
        a.release(p1);
        assert!(t.slots.available_permits() == 0);
        let p3 = ConnTable::slot_after_eviction(slot).await.expect("slot");
        // b busy, c idle: c goes, even though b is older.
        let g = b.busy();
        let Admit::AfterEviction(_, d) = t.admit() else { panic!("evicts") };
        tokio::time::timeout(Duration::from_secs(1), c.evicted()).await.expect("c notified");
        // The newcomer d is idle and listed: the next arrival evicts it, never busy b.
        let Admit::AfterEviction(_, e) = t.admit() else { panic!("evicts the waiting newcomer") };
        tokio::time::timeout(Duration::from_secs(1), d.evicted()).await.expect("d notified");
        // Only b and e: e busy as well, so a newcomer is refused.
        let ge = e.busy();
        assert!(matches!(t.admit(), Admit::Full));
        drop((g, ge));
        assert!(matches!(t.admit(), Admit::AfterEviction(..)), "b idle again");
        drop((p2, p3));
    }

    /// The flood race (stop 42's CI failure): every listed connection already chosen, the
    /// arrivals that chose them still waiting for their slots. The next arrival must find one of
    /// those waiting arrivals to evict, and the slot must travel down the chain.
    #[tokio::test]
    async fn arrivals_waiting_for_a_slot_are_evictable_and_pass_the_slot_on() {
        let t = ConnTable::new(1);
        let Admit::Slot(p, a) = t.admit() else { panic!("free slot") };
        let Admit::AfterEviction(to_b, b) = t.admit() else { panic!("evicts a") };
        let Admit::AfterEviction(to_c, c) = t.admit() else { panic!("evicts the waiting b, not refused") };
        tokio::time::timeout(Duration::from_secs(1), b.evicted()).await.expect("b notified");
        // a closes: its slot goes to b, which was evicted meanwhile and passes it on to c.
        a.close();
        a.release(p);
        let pb = ConnTable::slot_after_eviction(to_b).await.expect("b's slot");
        b.close();
        b.release(pb);
        let pc = ConnTable::slot_after_eviction(to_c).await.expect("c's slot");
        assert_eq!(t.len(), 1);
        assert_eq!(t.slots.available_permits(), 0);
        drop(pc);
        c.close();
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn a_tracked_body_keeps_its_connection_busy_until_dropped() {
        let t = ConnTable::new(1);
        let Admit::Slot(_p, c) = t.admit() else { panic!() };
        let body = track(Body::from("x"), c.busy());
        assert!(matches!(t.admit(), Admit::Full));
        drop(body);
        assert!(matches!(t.admit(), Admit::AfterEviction(..)));
    }
}
