//! How a sender reports a link that failed after its NIC had taken packets: a transport that
//! hands packets to the NIC and learns their fate only from its completions (`ibv`) can lose
//! packets that [`super::PacketSender::send_batch`] had already accepted. It then takes back
//! everything the NIC held (so that the NIC reads none of that memory again) and says how many
//! packets it had accepted and never sent, in the error it returns, so that the send stream
//! can count them (and the heaps they carried) against the interface.
//!
//! The count travels inside an [`io::Error`] of kind [`io::ErrorKind::NetworkDown`], a link
//! error to the send stream (`spead::send::balance::is_link_error`) like the errno a socket
//! returns, so that a transport needs no other channel than the trait's results.
#![deny(unsafe_code)]

use std::io;

/// A send interface's link failed. The sender has taken back everything its NIC held, so the
/// NIC reads none of it again (payload it pointed into may be rewritten); of the packets it
/// accepted in earlier calls, the last `packets` were never sent (a NIC sends in order, so the
/// lost ones are always the latest).
#[derive(Debug, thiserror::Error)]
#[error("{cause} ({packets} packets the NIC had taken were not sent)")]
pub struct LinkDown {
    pub packets: u64,
    pub cause: String,
}

impl LinkDown {
    /// As a link error.
    pub fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::NetworkDown, self)
    }
}

/// Packets that a link error says were lost in flight: its [`LinkDown`]'s count, 0 for any
/// other error (a socket's errno: the kernel had copied what it accepted).
pub fn lost_in_flight(e: &io::Error) -> u64 {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<LinkDown>())
        .map_or(0, |l| l.packets)
}

/// Most packets any transport keeps in flight past `send_batch` (the ibverbs send ring's
/// largest, `ibv::MAX_SLOTS`): how far back a [`LinkDown`] can reach.
pub const MAX_IN_FLIGHT: usize = 65536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_travels_in_the_error() {
        let e = LinkDown {
            packets: 17,
            cause: "completion failed".into(),
        }
        .into_io();
        assert_eq!(e.kind(), io::ErrorKind::NetworkDown);
        assert_eq!(lost_in_flight(&e), 17);
        assert!(e.to_string().contains("17 packets"), "{e}");
        assert_eq!(
            lost_in_flight(&io::Error::from_raw_os_error(libc::ENETDOWN)),
            0
        );
        assert_eq!(lost_in_flight(&io::Error::other("x")), 0);
    }
}
