//! An ibverbs sender's ring of frame slots: which of them its NIC still holds, and what
//! happens when the link fails under them. The verbs calls are behind [`Nic`], so that
//! failures are driven by a fake NIC in the tests.
//!
//! Slots are used and given back in ring order: a chain of requests takes consecutive slots
//! (never wrapping) and its one signalled completion, carrying the chain's length, gives them
//! back. A NIC shows a failed link in one of three ways: an error completion (the queue pair
//! has gone to the error state; the requests after it are flushed, and their completions,
//! signalled or not, say nothing more), no completion at all for [`STALL`] (the NIC holds the
//! requests), or the kernel's view of the link (`operstate`, read every [`LINK_CHECK`] while
//! waiting) turning down. Each ends the same way: the queue pair is reset, so that the NIC
//! drops every request it holds and reads none of their memory again, and brought back to
//! sending; the slots not completed are packets lost; and the caller gets a link error
//! ([`LinkDown`]) saying how many, so that the send stream moves the interface's share to
//! the others and counts them. Only after that may payload those requests pointed into (GPU
//! memory, `--use-peerdirect`) be rewritten. A sender that failed reads the link state before
//! it posts again (the stream's trial, after its retry interval) and fails at once, taking
//! nothing, while the kernel says the link is down, so that a trial costs no [`STALL`].
//!
//! If the reset itself fails the NIC may still hold requests: that is an error of the sender,
//! not of the link, which stops the stream and with it the queue pair before any payload is
//! given back (`engine::send_sink`).

use std::io;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use crate::net::LinkDown;

/// Longest wait for a completion: a NIC that completes nothing for this long has stopped (a
/// healthy one drains a full ring in milliseconds at line rate), and its link is treated as
/// failed. Longer than any pause a lossless network imposes; short enough that a heap waiting
/// on it stays well within the F-engine's wait for an output slot (`fengine::cuda_back`).
pub const STALL: Duration = Duration::from_secs(5);

/// How often a wait reads the kernel's link state: a link that goes down is noticed this
/// soon rather than after [`STALL`].
pub const LINK_CHECK: Duration = Duration::from_millis(10);

/// What one completion says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A chain of this many requests was sent.
    Sent(usize),
    /// A request failed (`ibv_wc_status_str`'s words, and the vendor's syndrome).
    Failed { status: &'static str, vendor: u32 },
}

/// The verbs side of a send queue.
pub trait Nic {
    /// Post the chain of send requests `first` heads.
    ///
    /// # Safety
    /// As `verbs::Qp::post_send`: the chain's memory stays untouched until its completion, or
    /// until [`Nic::reset`].
    unsafe fn post(&mut self, first: *mut ffi::ibv_send_wr) -> io::Result<()>;
    /// Completions now, in order, into `out`: how many.
    fn poll(&mut self, out: &mut [Completion]) -> io::Result<usize>;
    /// Let a little time pass before polling again (sleep on the completion channel, or spin).
    fn idle(&mut self) -> io::Result<()>;
    fn now(&self) -> Instant;
    /// Whether the kernel says the link is up.
    fn link_up(&self) -> bool;
    /// Reset the queue pair (the NIC drops every request and reads none of them again), forget
    /// any completions of those requests, and bring it back to where it sends.
    fn reset(&mut self) -> io::Result<()>;
}

/// Whether a link whose `/sys/class/net/<if>/operstate` reads `state` may carry packets:
/// only the states that say it cannot (RFC 2863's down, lower-layer-down, not-present) count
/// as down; `unknown` (drivers that do not report) and `dormant` do not, so that a driver
/// that says nothing leaves the decision to the completions.
pub fn operstate_up(state: &str) -> bool {
    !matches!(state.trim(), "down" | "lowerlayerdown" | "notpresent")
}

/// A ring of `slots` frame slots on a [`Nic`].
pub struct SendQueue<N> {
    nic: N,
    slots: usize,
    /// The next slot to fill, and how many are posted and not yet completed.
    next: usize,
    in_flight: usize,
    /// The link failed and no send has completed since: read its state before posting.
    suspect: bool,
    done: Vec<Completion>,
}

impl<N: Nic> SendQueue<N> {
    /// `slots` ≥ 1; completions are polled `poll` at a time.
    pub fn new(nic: N, slots: usize, poll: usize) -> SendQueue<N> {
        SendQueue {
            nic,
            slots,
            next: 0,
            in_flight: 0,
            suspect: false,
            done: vec![Completion::Sent(0); poll.max(1)],
        }
    }

    /// Where the next chain goes: its first slot and how many consecutive slots it may take
    /// (waiting while none is free). `posted_now`: requests of the current batch posted
    /// already (if the link fails now the whole batch is sent again elsewhere, so those are
    /// not counted as lost).
    pub fn room(&mut self, posted_now: usize) -> io::Result<(usize, usize)> {
        if self.suspect && !self.nic.link_up() {
            if self.in_flight == 0 {
                return Err(LinkDown {
                    packets: 0,
                    cause: "link still down".into(),
                }
                .into_io());
            }
            return Err(self.fail("link down".into(), posted_now));
        }
        self.reap(false, posted_now)?;
        if self.in_flight == self.slots {
            self.reap(true, posted_now)?;
        }
        let room = (self.slots - self.in_flight).min(self.slots - self.next);
        Ok((self.next, room))
    }

    /// Post the chain `first` heads: `n` requests in the slots [`SendQueue::room`] gave.
    ///
    /// # Safety
    /// As [`Nic::post`].
    pub unsafe fn post(
        &mut self,
        first: *mut ffi::ibv_send_wr,
        n: usize,
        posted_now: usize,
    ) -> io::Result<()> {
        // SAFETY: the caller's promise.
        if let Err(e) = unsafe { self.nic.post(first) } {
            return Err(self.fail(format!("posting sends failed: {e}"), posted_now));
        }
        self.in_flight += n;
        self.next = (self.next + n) % self.slots;
        Ok(())
    }

    /// Wait until the NIC is done with every request posted: sent, or (an error) taken back
    /// from a failed link.
    pub fn wait_sent(&mut self) -> io::Result<()> {
        while self.in_flight > 0 {
            self.reap(true, 0)?;
        }
        Ok(())
    }

    /// Take back the slots of completed chains; with `wait`, until at least one completes.
    fn reap(&mut self, wait: bool, posted_now: usize) -> io::Result<()> {
        let start = self.nic.now();
        let mut checked = start;
        loop {
            let n = match self.nic.poll(&mut self.done) {
                Ok(n) => n,
                Err(e) => return Err(self.fail(format!("polling completions: {e}"), posted_now)),
            };
            for k in 0..n {
                match self.done[k] {
                    Completion::Sent(count) => {
                        self.in_flight = self.in_flight.saturating_sub(count);
                        self.suspect = false;
                    }
                    Completion::Failed { status, vendor } => {
                        let cause = format!("a send failed: {status} (vendor error {vendor:#x})");
                        return Err(self.fail(cause, posted_now));
                    }
                }
            }
            if n > 0 || !wait {
                return Ok(());
            }
            let now = self.nic.now();
            if now.duration_since(start) >= STALL {
                let cause = format!("no send completed for {} s", STALL.as_secs());
                return Err(self.fail(cause, posted_now));
            }
            if now.duration_since(checked) >= LINK_CHECK {
                checked = now;
                if !self.nic.link_up() {
                    return Err(self.fail("link down".into(), posted_now));
                }
            }
            if let Err(e) = self.nic.idle() {
                return Err(self.fail(format!("waiting for completions: {e}"), posted_now));
            }
        }
    }

    /// The link failed (`cause`): reset the queue pair and count what it held, less the
    /// current batch's `posted_now`, as lost.
    fn fail(&mut self, cause: String, posted_now: usize) -> io::Error {
        if let Err(e) = self.nic.reset() {
            return io::Error::other(format!(
                "{cause}, and resetting the send queue failed ({e}): its NIC may still hold \
                 requests"
            ));
        }
        let lost = self.in_flight.saturating_sub(posted_now);
        self.in_flight = 0;
        self.next = 0;
        self.suspect = true;
        LinkDown {
            packets: lost as u64,
            cause,
        }
        .into_io()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::lost_in_flight;
    use std::collections::VecDeque;

    const FLUSHED: Completion = Completion::Failed {
        status: "Work Request Flushed Error",
        vendor: 0,
    };

    /// A NIC in simulated time: each poll returns the next scripted group of completions (none
    /// when the script is empty), each idle moves the clock 1 ms; posts, resets and link reads
    /// are counted.
    struct FakeNic {
        clock: Instant,
        script: VecDeque<Vec<Completion>>,
        link: bool,
        posts: Vec<usize>,
        resets: usize,
        reset_fails: bool,
    }

    fn queue(slots: usize) -> SendQueue<FakeNic> {
        let nic = FakeNic {
            clock: Instant::now(),
            script: VecDeque::new(),
            link: true,
            posts: Vec::new(),
            resets: 0,
            reset_fails: false,
        };
        SendQueue::new(nic, slots, 4)
    }

    impl Nic for FakeNic {
        unsafe fn post(&mut self, first: *mut ffi::ibv_send_wr) -> io::Result<()> {
            self.posts.push(first as usize);
            Ok(())
        }
        fn poll(&mut self, out: &mut [Completion]) -> io::Result<usize> {
            let group = self.script.pop_front().unwrap_or_default();
            assert!(group.len() <= out.len());
            out[..group.len()].copy_from_slice(&group);
            Ok(group.len())
        }
        fn idle(&mut self) -> io::Result<()> {
            self.clock += Duration::from_millis(1);
            Ok(())
        }
        fn now(&self) -> Instant {
            self.clock
        }
        fn link_up(&self) -> bool {
            self.link
        }
        fn reset(&mut self) -> io::Result<()> {
            self.resets += 1;
            self.script.clear();
            if self.reset_fails {
                Err(io::Error::other("modify_qp failed"))
            } else {
                Ok(())
            }
        }
    }

    /// Post a chain of `n` where [`SendQueue::room`] says, checking it has room for it.
    fn post(q: &mut SendQueue<FakeNic>, n: usize, posted_now: usize) -> io::Result<usize> {
        let (first, room) = q.room(posted_now)?;
        assert!(room >= n, "room {room} for {n}");
        // SAFETY: the fake NIC only records the pointer.
        unsafe { q.post(std::ptr::null_mut(), n, posted_now)? };
        Ok(first)
    }

    #[test]
    fn chains_take_consecutive_slots_and_completions_give_them_back() {
        let mut q = queue(8);
        assert_eq!(post(&mut q, 5, 0).unwrap(), 0);
        // Three left before the end of the ring: a chain does not wrap.
        assert_eq!(q.room(0).unwrap(), (5, 3));
        q.nic.script.push_back(vec![Completion::Sent(5)]);
        assert_eq!(q.room(0).unwrap(), (5, 3));
        assert_eq!(post(&mut q, 3, 0).unwrap(), 5);
        assert_eq!(q.room(0).unwrap(), (0, 5));
        q.nic.script.push_back(vec![Completion::Sent(3)]);
        q.wait_sent().unwrap();
        assert_eq!(q.room(0).unwrap(), (0, 8));
        assert_eq!(q.nic.resets, 0);
    }

    /// An error completion (then the flushed requests' own) while chains of 4 and 4 are out
    /// after the first completed: the queue pair is reset once, the 4 never completed are
    /// reported lost in a link error, every slot is free, and the next wait has nothing to
    /// wait for.
    #[test]
    fn an_error_completion_resets_and_reports_what_was_outstanding() {
        let mut q = queue(16);
        post(&mut q, 4, 0).unwrap();
        post(&mut q, 4, 0).unwrap();
        q.nic
            .script
            .push_back(vec![Completion::Sent(4), FLUSHED, FLUSHED]);
        let e = q.wait_sent().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NetworkDown);
        assert_eq!(lost_in_flight(&e), 4);
        assert!(e.to_string().contains("Flushed"), "{e}");
        assert_eq!(q.nic.resets, 1);
        q.wait_sent().unwrap();
        assert_eq!(q.room(0).unwrap(), (0, 16));
        assert_eq!(q.nic.resets, 1);
    }

    /// Found while posting a batch (the ring full, its next completion an error): the batch's
    /// own posted requests are not counted (the stream sends the whole batch again), the
    /// earlier ones are.
    #[test]
    fn a_failure_found_mid_batch_counts_only_earlier_batches() {
        let mut q = queue(8);
        post(&mut q, 6, 0).unwrap(); // an earlier batch
        post(&mut q, 2, 0).unwrap(); // this batch, first chain
        q.nic.script.push_back(vec![FLUSHED]);
        let e = q.room(2).unwrap_err();
        assert_eq!(lost_in_flight(&e), 6);
    }

    /// Nothing completes: with the link up the wait fails after [`STALL`] of (simulated) time;
    /// with the link going down it fails at the next link read, long before.
    #[test]
    fn a_silent_nic_fails_after_the_stall_and_a_down_link_at_once() {
        let mut q = queue(8);
        post(&mut q, 3, 0).unwrap();
        let t0 = q.nic.clock;
        let e = q.wait_sent().unwrap_err();
        assert_eq!(lost_in_flight(&e), 3);
        assert_eq!(q.nic.clock - t0, STALL);
        assert!(e.to_string().contains("no send completed"), "{e}");

        post(&mut q, 2, 0).unwrap();
        q.nic.link = false;
        let t1 = q.nic.clock;
        let e = q.wait_sent().unwrap_err();
        assert_eq!(lost_in_flight(&e), 2);
        assert_eq!(q.nic.clock - t1, LINK_CHECK);
        assert_eq!(q.nic.resets, 2);
    }

    /// After a failure the link is read before posting: while it is down the sender fails at
    /// once, posting nothing and resetting nothing more; once a send completes it is trusted
    /// again and no longer read before posting.
    #[test]
    fn a_failed_link_is_read_before_posting_until_a_send_completes() {
        let mut q = queue(8);
        post(&mut q, 1, 0).unwrap();
        q.nic.script.push_back(vec![FLUSHED]);
        q.wait_sent().unwrap_err();
        q.nic.link = false;
        let posts = q.nic.posts.len();
        let e = q.room(0).unwrap_err();
        assert_eq!(
            (e.kind(), lost_in_flight(&e)),
            (io::ErrorKind::NetworkDown, 0)
        );
        assert_eq!((q.nic.posts.len(), q.nic.resets), (posts, 1));
        q.nic.link = true;
        post(&mut q, 1, 0).unwrap();
        q.nic.script.push_back(vec![Completion::Sent(1)]);
        q.wait_sent().unwrap();
        q.nic.link = false;
        assert_eq!(q.room(0).unwrap(), (1, 7), "not read while trusted");
    }

    /// A reset that fails leaves requests the NIC may still read: an error of the sender, not
    /// a link error (the stream stops rather than reuse the memory).
    #[test]
    fn a_failed_reset_is_not_a_link_error() {
        let mut q = queue(8);
        q.nic.reset_fails = true;
        post(&mut q, 2, 0).unwrap();
        q.nic.script.push_back(vec![FLUSHED]);
        let e = q.wait_sent().unwrap_err();
        assert_ne!(e.kind(), io::ErrorKind::NetworkDown);
        assert!(e.to_string().contains("may still hold"), "{e}");
    }

    #[test]
    fn operstate_down_only_when_the_kernel_says_so() {
        for s in ["down\n", "lowerlayerdown", "notpresent"] {
            assert!(!operstate_up(s), "{s}");
        }
        for s in ["up\n", "unknown", "dormant", "testing"] {
            assert!(operstate_up(s), "{s}");
        }
    }
}
