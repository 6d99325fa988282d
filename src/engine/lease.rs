//! Output buffers lent to a send thread until the NIC has read them (seed 000 §PeerDirect:
//! with GPUDirect RDMA an OutItem goes back to the free queue only once its data has been fully
//! transmitted, not once it has been copied to the host).
//!
//! A [`Ledger`] counts, per buffer (an output slot of device memory), the [`Lease`]s out on it:
//! the engine takes one for every heap it hands to the send thread, the send thread drops it
//! once the NIC is done with that heap (`SendStream::wait_sent`: its completions are in, or
//! its link failed and the sender took back everything the NIC held), and the engine writes
//! into the buffer again only when its count is back to zero. A lease is the only
//! way to hold a buffer, and dropping it (on any path: sent, skipped, or the send thread gone)
//! is the only way to give it back, so a buffer can be neither reused early nor lost.
//!
//! The counts sit behind one mutex, taken a few times per heap (never per packet); the
//! condition variable wakes an engine waiting for a buffer, and the mutex orders the send
//! thread's completions before the engine's next write.
#![deny(unsafe_code)]

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

struct Counts {
    out: Mutex<Vec<usize>>,
    returned: Condvar,
}

impl Counts {
    fn lock(&self) -> MutexGuard<'_, Vec<usize>> {
        // The counts are plain integers, consistent after any panic between updates.
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Leases out per buffer.
#[derive(Clone)]
pub struct Ledger(Arc<Counts>);

/// A hold on one buffer: while any lease on it lives, the buffer is not rewritten.
pub struct Lease {
    counts: Arc<Counts>,
    buffer: usize,
}

/// A buffer stayed lent past the wait's limit.
#[derive(Debug, thiserror::Error)]
#[error("output buffer {buffer} still lent to the send thread after {waited:?} (has the send thread stopped? its error is reported when it is joined)")]
pub struct NotReturned {
    pub buffer: usize,
    pub waited: Duration,
}

impl Ledger {
    /// A ledger of `buffers` buffers, none lent.
    pub fn new(buffers: usize) -> Ledger {
        Ledger(Arc::new(Counts {
            out: Mutex::new(vec![0; buffers]),
            returned: Condvar::new(),
        }))
    }

    /// Lend `buffer`.
    ///
    /// # Panics
    /// If `buffer` is not one of the ledger's (a bug in the caller, not outside input).
    pub fn lend(&self, buffer: usize) -> Lease {
        self.0.lock()[buffer] += 1;
        Lease {
            counts: Arc::clone(&self.0),
            buffer,
        }
    }

    /// Whether any lease on `buffer` is out.
    pub fn lent(&self, buffer: usize) -> bool {
        self.0.lock()[buffer] > 0
    }

    /// Wait until every lease on `buffer` is back, at most `limit`.
    pub fn wait_returned(&self, buffer: usize, limit: Duration) -> Result<(), NotReturned> {
        let start = Instant::now();
        let mut out = self.0.lock();
        while out[buffer] > 0 {
            let waited = start.elapsed();
            if waited >= limit {
                return Err(NotReturned { buffer, waited });
            }
            out = self
                .0
                .returned
                .wait_timeout(out, limit - waited)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}

impl Lease {
    /// The buffer this lease holds.
    pub fn buffer(&self) -> usize {
        self.buffer
    }
}

impl Clone for Lease {
    fn clone(&self) -> Lease {
        self.counts.lock()[self.buffer] += 1;
        Lease {
            counts: Arc::clone(&self.counts),
            buffer: self.buffer,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut out = self.counts.lock();
        out[self.buffer] -= 1;
        if out[self.buffer] == 0 {
            self.counts.returned.notify_all();
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({})", self.buffer)
    }
}
