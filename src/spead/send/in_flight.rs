//! What each interface's NIC may still hold, call by call, so that when a link failure loses
//! the last packets a NIC had taken (`net::LinkDown`: a NIC sends in order, so the lost ones
//! are always the latest) the heaps they carried are counted as well as the packets.
//!
//! Per interface, a list of spans, oldest first: the packets each send call handed to that
//! interface, and the heaps of that call it carried pieces of (a call's heaps are spread over
//! the interfaces, `super::stream`; the caller says how many heaps each send adds). A loss of
//! `n` packets is matched against the latest spans; every call it reaches counts its heaps on
//! that interface whole (in round-robin mode each heap of a call's share on one interface has
//! packets in every burst there, so a loss in any part damages them all, as
//! `SendCounters::lost_heaps` counts whole calls). A wait that finds everything sent
//! (`wait_sent`) clears the list; so does a failure (the sender took back everything its NIC
//! held). Spans further back than any NIC can hold (`net::MAX_IN_FLIGHT` packets) are
//! forgotten, so the list stays bounded where nothing ever waits (the socket transports).
//!
//! Pure bookkeeping, tested against loss patterns worked out by hand.
#![deny(unsafe_code)]

use std::collections::VecDeque;

use crate::net::MAX_IN_FLIGHT;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    call: u64,
    packets: u64,
    heaps: u64,
}

#[derive(Debug, Clone, Default)]
struct Held {
    spans: VecDeque<Span>,
    packets: u64,
}

/// Per interface, the calls whose packets its NIC may still hold.
#[derive(Debug, Clone)]
pub struct InFlight {
    links: Vec<Held>,
    /// The current call's number.
    call: u64,
}

impl InFlight {
    pub fn new(interfaces: usize) -> InFlight {
        InFlight {
            links: vec![Held::default(); interfaces],
            call: 0,
        }
    }

    /// A send call begins.
    pub fn begin(&mut self) {
        self.call += 1;
    }

    /// Interface `i` took `packets` packets of the current call, carrying pieces of `heaps`
    /// heaps of it that it had not carried yet (0 for more of the same heaps).
    pub fn sent(&mut self, i: usize, packets: usize, heaps: usize) {
        let held = &mut self.links[i];
        let (packets, heaps) = (packets as u64, heaps as u64);
        match held.spans.back_mut() {
            Some(s) if s.call == self.call => {
                s.packets += packets;
                s.heaps += heaps;
            }
            _ => held.spans.push_back(Span {
                call: self.call,
                packets,
                heaps,
            }),
        }
        held.packets += packets;
        while let Some(front) = held.spans.front() {
            if held.packets - front.packets < MAX_IN_FLIGHT as u64 {
                break;
            }
            held.packets -= front.packets;
            held.spans.pop_front();
        }
    }

    /// Interface `i`'s NIC has sent everything it took.
    pub fn confirmed(&mut self, i: usize) {
        let held = &mut self.links[i];
        held.spans.clear();
        held.packets = 0;
    }

    /// Interface `i`'s link failed and the last `packets` packets it took were not sent: the
    /// heaps the interface carried of the calls they belong to (each call's share whole). Nothing it took is held any more.
    pub fn lost(&mut self, i: usize, packets: u64) -> u64 {
        let mut left = packets;
        let mut heaps = 0;
        for s in self.links[i].spans.iter().rev() {
            if left == 0 {
                break;
            }
            heaps += s.heaps;
            left = left.saturating_sub(s.packets);
        }
        self.confirmed(i);
        heaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls of (heaps, [(interface, packets), ...] in order); a loss of n packets on an
    /// interface counts the heaps of the calls holding its last n packets, worked out by hand.
    #[test]
    fn a_loss_counts_the_heaps_of_the_calls_it_reaches() {
        let mut f = InFlight::new(2);
        // Call 1: 4 heaps, 10 packets on 0. Call 2: 2 heaps, 3 on 0 then 5 on 1 (a failover
        // mid-call). Call 3: 4 heaps on 0 in two sends, and 1 heap on 1, its sends between
        // theirs (a call spread over both), then one more heap on 0.
        f.begin();
        f.sent(0, 6, 4);
        f.sent(0, 4, 0);
        f.begin();
        f.sent(0, 3, 2);
        f.sent(1, 5, 2);
        f.begin();
        f.sent(0, 4, 4);
        f.sent(1, 2, 1);
        f.sent(0, 2, 0);
        f.sent(0, 1, 1);
        // The last 7 on 0 are call 3's alone (its 5 heaps there); 8 reach into call 2; 11
        // do not reach call 1.
        assert_eq!(f.clone().lost(0, 7), 5);
        assert_eq!(f.clone().lost(0, 8), 7);
        assert_eq!(f.clone().lost(0, 10), 7);
        assert_eq!(f.clone().lost(0, 11), 11);
        assert_eq!(f.clone().lost(0, 0), 0);
        // More than was held (a transport that over-reports) counts what there is.
        assert_eq!(f.clone().lost(0, 1000), 11);
        // On 1, call 3's one heap; further back, call 2's two.
        assert_eq!(f.clone().lost(1, 1), 1);
        assert_eq!(f.clone().lost(1, 3), 3);
        // After a loss nothing is held: a second report finds nothing.
        let mut g = f.clone();
        assert_eq!(g.lost(0, 7), 5);
        assert_eq!(g.lost(0, 7), 0);
        assert_eq!(g.lost(1, 7), 3, "the other interface keeps its own");
        // A confirmation clears one interface.
        f.confirmed(0);
        assert_eq!(f.clone().lost(0, 3), 0);
        assert_eq!(f.lost(1, 3), 3);
    }

    /// The record stops at what a NIC can hold: a loss reaches back over `MAX_IN_FLIGHT`
    /// packets (and into the call they start in), never further. With calls of 1000 packets
    /// that is the last 66 (the fewest whose packets reach 65536).
    #[test]
    fn the_record_is_bounded_by_what_a_nic_can_hold() {
        let mut f = InFlight::new(1);
        for _ in 0..1000 {
            f.begin();
            f.sent(0, 1000, 1);
        }
        assert_eq!(f.links[0].spans.len(), 66);
        assert_eq!(f.links[0].packets, 66_000);
        assert_eq!(f.lost(0, u64::MAX), 66);
    }
}
