//! Multicast groups: one allocation, in a fixed order, from the configured prefix, so that
//! every F-engine's output list and every XB-engine's input are the same groups by
//! construction, and a second plan of the same config gives the same addresses.
#![deny(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};

/// Consecutive groups on one port: `first+(count-1):port` in the engines' endpoint syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    pub first: Ipv4Addr,
    pub count: u32,
    pub port: u16,
}

impl Groups {
    /// The engines' endpoint text (`A.B.C.D+N:port`, `+N` meaning N more groups).
    pub fn endpoint(&self) -> String {
        match self.count {
            1 => format!("{}:{}", self.first, self.port),
            n => format!("{}+{}:{}", self.first, n - 1, self.port),
        }
    }

    /// The i-th group alone.
    pub fn nth(&self, i: u32) -> Groups {
        debug_assert!(i < self.count);
        Groups {
            first: Ipv4Addr::from(u32::from(self.first) + i),
            count: 1,
            port: self.port,
        }
    }

    pub fn addrs(&self) -> impl Iterator<Item = SocketAddrV4> + '_ {
        (0..self.count).map(|i| SocketAddrV4::new(self.nth(i).first, self.port))
    }
}

/// Hands out groups from a prefix, in order.
#[derive(Debug, Clone)]
pub struct Allocator {
    next: u32,
    end: u32,
    port: u16,
}

impl Allocator {
    /// From `A.B.C.D/len`, which must lie inside 224.0.0.0/4 with no host bits set below
    /// `len`; `Err` says why not.
    pub fn new(prefix: &str, port: u16) -> Result<Allocator, String> {
        let (addr, len) = prefix
            .split_once('/')
            .ok_or_else(|| format!("{prefix:?} is not A.B.C.D/len"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        let len: u32 = len
            .parse()
            .ok()
            .filter(|l| (4..=32).contains(l))
            .ok_or_else(|| format!("prefix length {len:?} is not 4 to 32"))?;
        if !addr.is_multicast() {
            return Err(format!("{addr} is not a multicast address (224.0.0.0/4)"));
        }
        let base = u32::from(addr);
        let size = 1u64 << (32 - len);
        if u64::from(base) % size != 0 {
            return Err(format!("{addr} has bits set below the /{len}"));
        }
        Ok(Allocator {
            next: base,
            end: (u64::from(base) + size - 1) as u32,
            port,
        })
    }

    /// The next `count` groups, or `None` when the prefix is exhausted. (The prefix lies
    /// below 240.0.0.0, so `last + 1` cannot overflow.)
    pub fn take(&mut self, count: u32) -> Option<Groups> {
        let last = self.next.checked_add(count.checked_sub(1)?)?;
        if last > self.end {
            return None;
        }
        let g = Groups {
            first: Ipv4Addr::from(self.next),
            count,
            port: self.port,
        };
        self.next = last + 1;
        Some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_order_and_refuses_bad_prefixes() {
        let mut a = Allocator::new("239.10.0.0/30", 7148).unwrap();
        let g = a.take(3).unwrap();
        assert_eq!(g.endpoint(), "239.10.0.0+2:7148");
        assert_eq!(g.nth(2).endpoint(), "239.10.0.2:7148");
        assert_eq!(a.take(1).unwrap().endpoint(), "239.10.0.3:7148");
        assert_eq!(a.take(1), None);
        let mut top = Allocator::new("239.255.255.254/31", 1).unwrap();
        assert!(top.take(2).is_some());
        assert_eq!(top.take(1), None);
        for bad in [
            "10.0.0.0/8",
            "239.10.0.1/16",
            "239.10.0.0",
            "239.10.0.0/33",
            "x/8",
        ] {
            assert!(Allocator::new(bad, 7148).is_err(), "{bad}");
        }
    }
}
