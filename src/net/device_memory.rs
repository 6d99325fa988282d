//! Payload that stays in GPU memory while it is sent (`--use-peerdirect`, seed 000
//! §PeerDirect): the NIC reads it there, through GPUDirect RDMA, instead of from a host copy.
//!
//! The host cannot read such bytes (a CUDA device address is not mapped for the CPU, and a Rust
//! reference to it would be undefined behaviour), so they travel through the send path as
//! [`DeviceBytes`] — an address and a length — never as `&[u8]`. Only a transport that gathers
//! from registered device memory (`net::ibv`) sends them; every other transport refuses a
//! batch that holds any ([`super::SendBatch::host_only`]). The memory itself is lent to the
//! transport as a [`DeviceMemory`], which the transport registers once and keeps alive for as
//! long as the registration lasts.

use std::io;

/// Bytes in device memory, named by their address in the process's unified (CUDA UVA)
/// address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBytes {
    pub addr: u64,
    pub len: usize,
}

impl DeviceBytes {
    /// `len` bytes from `offset` on, or `None` if they do not lie inside.
    pub fn slice(&self, offset: usize, len: usize) -> Option<DeviceBytes> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| DeviceBytes {
            addr: self.addr + offset as u64,
            len,
        })
    }

    /// Whether `inner` lies wholly inside these bytes.
    pub fn contains(&self, inner: &DeviceBytes) -> bool {
        let end = self.addr as u128 + self.len as u128;
        inner.addr >= self.addr && inner.addr as u128 + inner.len as u128 <= end
    }
}

/// Device memory a NIC may be given to read.
///
/// # Safety
/// [`DeviceMemory::bytes`] gives the same range for as long as the value lives, and that range
/// stays allocated device memory (not freed, not remapped) meanwhile: a transport registers it
/// with the NIC and keeps the value until it has deregistered it.
pub unsafe trait DeviceMemory: Send + Sync {
    fn bytes(&self) -> DeviceBytes;
}

/// Why a batch with device payload cannot go out on a transport that copies packets.
pub fn not_gathered() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "packets whose payload stays in GPU memory (--use-peerdirect) can only be sent by \
         the ibverbs transport (--send-ibv)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{mem, PacketSender, SendBatch};

    /// A transport that copies packets refuses a batch with device payload (it cannot read
    /// it) and sends one without; the gathered packet's length counts its device bytes.
    #[test]
    fn copying_transports_refuse_device_payload() {
        let (mut tx, _rx) = mem::channel(4, 1);
        let header = [1u8; 8];
        let mut batch = SendBatch::default();
        batch.push_packet(&header, 0);
        tx.send_batch(&batch).unwrap();
        let (h, p) = (batch.header_buf().len(), batch.parts_buf().len());
        batch.header_buf().extend_from_slice(&header);
        let d = DeviceBytes {
            addr: 1 << 40,
            len: 100,
        };
        batch.finish_gathered(h, p, Some(d), 0);
        assert_eq!(batch.packet(1).len, 108);
        assert_eq!(batch.packet(1).device, Some(d));
        let e = tx.send_batch(&batch).unwrap_err();
        assert!(e.to_string().contains("--send-ibv"), "{e}");
        batch.clear();
        assert!(batch.host_only().is_ok());
    }

    #[test]
    fn slices_stay_inside() {
        let d = DeviceBytes {
            addr: 0x7f00_0000_0000,
            len: 1000,
        };
        let s = d.slice(200, 300).unwrap();
        assert_eq!((s.addr, s.len), (0x7f00_0000_0000 + 200, 300));
        assert!(d.contains(&s));
        assert_eq!(
            d.slice(999, 1),
            Some(DeviceBytes {
                addr: d.addr + 999,
                len: 1
            })
        );
        assert_eq!(d.slice(999, 2), None);
        assert_eq!(d.slice(usize::MAX, 2), None);
        assert!(!d.contains(&DeviceBytes {
            addr: d.addr - 1,
            len: 1
        }));
        assert!(!d.contains(&DeviceBytes {
            addr: d.addr + 1,
            len: 1000
        }));
    }
}
