//! In-process transport over a bounded channel: the test double for UDP, and the way engines
//! are wired together inside one process in tests.
#![deny(unsafe_code)]

use std::io;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::{PacketReceiver, PacketSender, Received, RecvBatch, SendBatch};

/// A connected pair: packets sent on the [`MemSender`] (to any destination) arrive at the
/// [`MemReceiver`] in order. `capacity` packets may be queued; senders block beyond that.
pub fn channel(capacity: usize, destinations: usize) -> (MemSender, MemReceiver) {
    let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
    (
        MemSender {
            tx,
            destinations: destinations.max(1),
        },
        MemReceiver {
            rx,
            timeout: Duration::from_millis(20),
        },
    )
}

/// A receiver that replays a fixed list of packets, then reports [`Received::End`].
pub fn from_packets(packets: Vec<Vec<u8>>) -> MemReceiver {
    let (tx, rx) = crossbeam_channel::unbounded();
    for p in packets {
        // Unbounded: cannot fail while rx is alive.
        let _ = tx.send(p);
    }
    MemReceiver {
        rx,
        timeout: Duration::ZERO,
    }
}

pub struct MemSender {
    tx: Sender<Vec<u8>>,
    destinations: usize,
}

impl PacketSender for MemSender {
    fn destinations(&self) -> usize {
        self.destinations
    }

    fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
        batch.host_only()?;
        for i in 0..batch.len() {
            self.tx.send(batch.to_vec(i)).map_err(|_| {
                io::Error::new(io::ErrorKind::BrokenPipe, "in-memory receiver is gone")
            })?;
        }
        Ok(())
    }
}

pub struct MemReceiver {
    rx: Receiver<Vec<u8>>,
    timeout: Duration,
}

impl PacketReceiver for MemReceiver {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        match self.rx.recv_timeout(self.timeout) {
            Ok(p) => {
                batch.push(&p);
            }
            Err(RecvTimeoutError::Timeout) => return Ok(Received::Idle),
            Err(RecvTimeoutError::Disconnected) => return Ok(Received::End),
        }
        while batch.len() < batch.capacity() {
            match self.rx.try_recv() {
                Ok(p) => {
                    batch.push(&p);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        Ok(Received::Packets(batch.len()))
    }
}
