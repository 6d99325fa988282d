//! Which byte ranges of a heap have arrived: duplicate and overlap detection for heaps whose
//! packets may come out of order.
#![deny(unsafe_code)]

/// Sorted, disjoint, merged half-open ranges. In-order heaps keep a single range, so the
/// vector does not grow on the hot path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadRanges(Vec<(u64, u64)>);

impl PayloadRanges {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Record [start, end); false (and nothing recorded) if it overlaps bytes already there.
    pub fn add(&mut self, start: u64, end: u64) -> bool {
        let r = &mut self.0;
        let i = r.partition_point(|x| x.1 <= start);
        if r.get(i).is_some_and(|x| x.0 < end) {
            return false;
        }
        if start == end {
            return true;
        }
        r.insert(i, (start, end));
        if i + 1 < r.len() && r[i + 1].0 == end {
            r[i].1 = r[i + 1].1;
            r.remove(i + 1);
        }
        if i > 0 && r[i - 1].1 == start {
            r[i - 1].1 = r[i].1;
            r.remove(i);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_detects_overlap() {
        let mut l = PayloadRanges::default();
        assert!(l.add(10, 20));
        assert!(l.add(0, 10));
        assert!(l.add(30, 40));
        assert!(!l.add(15, 25));
        assert!(!l.add(0, 40));
        assert!(l.add(20, 30));
        assert_eq!(l.0, [(0, 40)]);
        assert!(l.add(40, 40));
    }
}

/// The heap counters most recently completed, so that a late duplicate of a finished heap is
/// counted as a duplicate instead of opening a new, never-completing heap.
#[derive(Debug, Clone)]
pub struct RecentCnts {
    ring: Vec<u64>,
    next: usize,
}

impl RecentCnts {
    pub fn new(len: usize) -> RecentCnts {
        RecentCnts {
            ring: vec![u64::MAX; len.max(1)],
            next: 0,
        }
    }

    pub fn insert(&mut self, cnt: u64) {
        self.ring[self.next] = cnt;
        self.next = (self.next + 1) % self.ring.len();
    }

    pub fn contains(&self, cnt: u64) -> bool {
        self.ring.contains(&cnt)
    }
}
