//! Frames of an ibverbs send, as data: each packet of a batch written into a slot of the
//! send ring behind its Ethernet/IPv4/UDP headers, and the gather list the NIC reads it by
//! (the slot, then any payload left in registered GPU memory, `--use-peerdirect`). Pure, so
//! that what the NIC would put on the wire is tested without one.

use std::io;

use super::verbs::Gather;
use crate::net::frame::{FrameHeaders, HEADERS_LEN};
use crate::net::{DeviceBytes, SendBatch};

/// Where a chain's frames go: the ring the NIC knows at `addr`, slots of `slot_len` bytes,
/// from slot `first` on.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    pub addr: u64,
    pub slot_len: usize,
    pub first: usize,
}

/// Frame packets `range` of `batch` into consecutive slots of `ring_bytes` (laid out as `ring`
/// says) and append to `out` how the NIC gathers each: its frame from its slot, then any
/// device payload from the region of `wire.1` (range, lkey) that holds it; `wire.0` are the
/// destinations' headers. Each frame takes the next IPv4 ident.
pub fn fill_chain(
    ring_bytes: &mut [u8],
    ring: Ring,
    (batch, range): (&SendBatch<'_>, std::ops::Range<usize>),
    (headers, regions): (&[FrameHeaders], &[(DeviceBytes, u32)]),
    ident: &mut u16,
    out: &mut Vec<Gather>,
) -> io::Result<()> {
    for (k, i) in range.enumerate() {
        let start = (ring.first + k) * ring.slot_len;
        let slot = ring_bytes
            .get_mut(start..start + ring.slot_len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "past the ring"))?;
        let len = write_frame(slot, headers, batch, i, *ident)?;
        *ident = ident.wrapping_add(1);
        let device = match batch.packet(i).device {
            Some(d) => Some(device_entry(regions, d)?),
            None => None,
        };
        out.push(Gather {
            frame: (ring.addr + start as u64, len as u32),
            device,
        });
    }
    Ok(())
}

/// The gather entry (address, length, lkey) for device payload `d`: the registered region
/// that holds it whole, or an error (payload outside every region would be read from memory
/// the NIC was never given).
pub fn device_entry(regions: &[(DeviceBytes, u32)], d: DeviceBytes) -> io::Result<(u64, u32, u32)> {
    let len = u32::try_from(d.len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "device payload over 4 GiB"))?;
    regions
        .iter()
        .find(|(r, _)| r.contains(&d))
        .map(|&(_, lkey)| (d.addr, len, lkey))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "device payload at {:#x} ({} bytes) lies in no registered region",
                    d.addr, d.len
                ),
            )
        })
}

/// Write packet `i` of `batch` into `out` as a frame: the Ethernet/IPv4/UDP headers for its
/// destination (`net::frame`, lengths counting the whole packet), then its SPEAD header and
/// host payload pieces; a device slice, if the packet has one, is left for the NIC to gather
/// after these. Returns the bytes written.
pub fn write_frame(
    out: &mut [u8],
    headers: &[FrameHeaders],
    batch: &SendBatch<'_>,
    i: usize,
    ident: u16,
) -> io::Result<usize> {
    let p = batch.packet(i);
    let h = headers.get(p.dest).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("destination {} out of range", p.dest),
        )
    })?;
    let len = HEADERS_LEN + p.len - p.device.map_or(0, |d| d.len);
    if len > out.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a {}-byte packet does not fit a {}-byte frame slot",
                p.len,
                out.len()
            ),
        ));
    }
    h.emit(out, p.len, ident)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut at = HEADERS_LEN;
    for piece in batch.pieces(i) {
        out[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::super::verbs::{chain_send, SEND_SGES};
    use super::*;
    use crate::net::frame::{self, UdpChecksum};
    use crate::net::PacketSender;
    use crate::spead::items::{FENG_ID_ID, FENG_RAW_ID, FREQUENCY_ID, TIMESTAMP_ID};
    use crate::spead::send::{Heap, HeapRef, SendMode, SendStream, SendStreamConfig};
    use crate::spead::wire::ParsedPacket;
    use ibverbs_sys as ffi;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::sync::{Arc, Mutex};

    const RING_ADDR: u64 = 0x1000_0000;
    const RING_LKEY: u32 = 11;
    const SLOT_LEN: usize = 128;
    const DEV_ADDR: u64 = 0x7f40_0000_0000;
    const DEV_LKEY: u32 = 22;

    /// What the fake NIC was asked to send: per packet, its gather entries (address, length,
    /// lkey), and the frame they gather to.
    type Sent = Arc<Mutex<Vec<(Vec<(u64, u32, u32)>, Vec<u8>)>>>;

    /// A NIC in memory: frames each batch with `fill_chain` and links it with `chain_send`, as
    /// `IbvSender::send_batch` does, then reads every request's entries from a ring (at
    /// `RING_ADDR`) and a stand-in for GPU memory (at `DEV_ADDR`), by lkey, as the hardware
    /// would.
    struct FakeNic {
        headers: Vec<FrameHeaders>,
        device: Vec<u8>,
        ring: Vec<u8>,
        sent: Sent,
    }

    impl PacketSender for FakeNic {
        fn destinations(&self) -> usize {
            self.headers.len()
        }

        fn send_batch(&mut self, batch: &SendBatch<'_>) -> io::Result<()> {
            let regions = [(
                DeviceBytes {
                    addr: DEV_ADDR,
                    len: self.device.len(),
                },
                DEV_LKEY,
            )];
            let n = batch.len();
            self.ring = vec![0xa5; n * SLOT_LEN];
            let ring = Ring {
                addr: RING_ADDR,
                slot_len: SLOT_LEN,
                first: 0,
            };
            let mut gathers = Vec::new();
            let wire = (self.headers.as_slice(), &regions[..]);
            fill_chain(
                &mut self.ring,
                ring,
                (batch, 0..n),
                wire,
                &mut 0,
                &mut gathers,
            )?;
            let mut wrs = vec![ffi::ibv_send_wr::default(); n];
            let mut sges = vec![ffi::ibv_sge::default(); n * SEND_SGES];
            chain_send(&mut wrs, &mut sges, &gathers, RING_LKEY);
            for (i, w) in wrs.iter().enumerate() {
                assert!(std::ptr::eq(w.sg_list, &sges[SEND_SGES * i]));
                let entries: Vec<(u64, u32, u32)> = sges
                    [SEND_SGES * i..SEND_SGES * i + w.num_sge as usize]
                    .iter()
                    .map(|e| (e.addr, e.length, e.lkey))
                    .collect();
                let mut frame = Vec::new();
                for &(addr, len, lkey) in &entries {
                    let (mem, base) = match lkey {
                        RING_LKEY => (&self.ring, RING_ADDR),
                        DEV_LKEY => (&self.device, DEV_ADDR),
                        k => panic!("unknown lkey {k}"),
                    };
                    let at = (addr - base) as usize;
                    frame.extend_from_slice(&mem[at..at + len as usize]);
                }
                self.sent.lock().unwrap().push((entries, frame));
            }
            Ok(())
        }
    }

    /// F heaps (timestamp, feng_id and frequency immediates; feng_raw in device memory) to two
    /// destinations, through the stream, the packetiser and the gather list: each packet is
    /// two entries, its 42 + 72 header bytes from its ring slot and its share of feng_raw from
    /// the device region, at the place the SPEAD format puts it — computed here from the format
    /// (8192-byte payloads, round-robin over the heaps), not by the code under test — and the
    /// frames they gather to parse (by `net::frame` and `spead::wire`) to those packets.
    #[test]
    fn device_payload_is_gathered_where_the_heap_format_puts_it() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40000);
        let dsts = [
            SocketAddrV4::new(Ipv4Addr::new(239, 10, 11, 0), 7148),
            SocketAddrV4::new(Ipv4Addr::new(239, 10, 11, 1), 7148),
        ];
        let headers: Vec<FrameHeaders> = dsts
            .iter()
            .map(|d| {
                FrameHeaders::new(
                    [2, 0, 0, 0, 0, 1],
                    src,
                    frame::dest_mac(*d.ip(), None).unwrap(),
                    *d,
                    4,
                )
            })
            .collect();
        // Two destinations' feng_raw of 20000 bytes each: packets of 8192, 8192 and 3616.
        const L: usize = 20_000;
        const P: usize = 8192;
        let device: Vec<u8> = (0..2 * L).map(|i| (i * 31 % 251) as u8).collect();
        let sent = Sent::default();
        let nic = FakeNic {
            headers,
            device: device.clone(),
            ring: Vec::new(),
            sent: Arc::clone(&sent),
        };
        let config = SendStreamConfig {
            max_packet_size: P + 72,
            cnt_first: 3,
            cnt_step: 64,
            ..Default::default()
        };
        let mut stream = SendStream::new(config, vec![nic]).unwrap();
        let heaps: Vec<Heap<'static>> = (0..2)
            .map(|dest| {
                let mut h = Heap::new();
                h.repeat_pointers = true;
                h.add_immediate(TIMESTAMP_ID, 1 << 30)
                    .add_immediate(FENG_ID_ID, 3)
                    .add_immediate(FREQUENCY_ID, 16 * dest as u64)
                    .add_device(
                        FENG_RAW_ID,
                        DeviceBytes {
                            addr: DEV_ADDR + (dest * L) as u64,
                            len: L,
                        },
                    );
                h
            })
            .collect();
        let refs: Vec<HeapRef> = heaps
            .iter()
            .enumerate()
            .map(|(d, h)| HeapRef::new(h, d))
            .collect();
        stream.send_heaps(&refs, SendMode::RoundRobin).unwrap();
        stream.wait_sent().unwrap();

        let sent = sent.lock().unwrap();
        let packets = L.div_ceil(P);
        assert_eq!(sent.len(), 2 * packets);
        for (n, (entries, frame)) in sent.iter().enumerate() {
            // Round robin: packet k of heap 0, then of heap 1.
            let (k, dest) = (n / 2, n % 2);
            let len = P.min(L - k * P);
            let header = HEADERS_LEN + 8 + 8 * 8;
            assert_eq!(
                entries,
                &[
                    (RING_ADDR + (n * SLOT_LEN) as u64, header as u32, RING_LKEY),
                    (DEV_ADDR + (dest * L + k * P) as u64, len as u32, DEV_LKEY),
                ],
                "packet {n}"
            );
            let d = frame::parse(frame, UdpChecksum::Verify).unwrap();
            assert_eq!(d.dst, dsts[dest]);
            let p = ParsedPacket::parse(d.payload).unwrap();
            assert_eq!(p.repr.heap_cnt, 3 + 64 * dest as u64);
            assert_eq!(p.repr.heap_length, Some(L as u64));
            assert_eq!(p.repr.payload_offset, (k * P) as u64);
            assert_eq!(p.repr.payload_length, len);
            assert_eq!(p.immediate(FREQUENCY_ID), Some(16 * dest as u64));
            assert_eq!(p.immediate(TIMESTAMP_ID), Some(1 << 30));
            assert_eq!(
                p.payload(),
                &device[dest * L + k * P..dest * L + k * P + len]
            );
        }
    }

    /// The lkey is that of the region holding the payload whole; payload straddling a region's
    /// end, or outside every region, is refused rather than read from memory the NIC was never
    /// given.
    #[test]
    fn device_payload_takes_its_regions_key() {
        let r = |addr, len| DeviceBytes { addr, len };
        let regions = [(r(0x1000, 0x100), 5), (r(0x9000, 0x1000), 6)];
        assert_eq!(
            device_entry(&regions, r(0x9100, 0x200)).unwrap(),
            (0x9100, 0x200, 6)
        );
        assert_eq!(
            device_entry(&regions, r(0x1000, 0x100)).unwrap(),
            (0x1000, 0x100, 5)
        );
        assert!(device_entry(&regions, r(0x10f0, 0x20)).is_err());
        assert!(device_entry(&regions, r(0x5000, 1)).is_err());
        assert!(device_entry(&[], r(0x1000, 1)).is_err());
    }

    /// Packets written as frames read back through `net::frame::parse` (an independent
    /// parser) with the destination, source and payload they were sent with; a packet too big
    /// for its slot and a destination out of range are refused.
    #[test]
    fn frames_carry_each_packet_to_its_destination() {
        let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40000);
        let dsts = [
            SocketAddrV4::new(Ipv4Addr::new(239, 10, 10, 10), 7148),
            SocketAddrV4::new(Ipv4Addr::new(239, 10, 10, 11), 7149),
        ];
        let mac = [2, 0, 0, 0, 0, 1];
        let headers: Vec<FrameHeaders> = dsts
            .iter()
            .map(|d| FrameHeaders::new(mac, src, frame::dest_mac(*d.ip(), None).unwrap(), *d, 4))
            .collect();
        let header = [0x53u8, 0x04, 2, 6, 0, 0, 0, 1];
        let payload: Vec<u8> = (0..200u8).collect();
        let mut batch = SendBatch::default();
        for dest in [1, 0] {
            let (h, p) = (batch.header_buf().len(), batch.parts_buf().len());
            batch.header_buf().extend_from_slice(&header);
            batch.parts_buf().push(&payload[..]);
            batch.finish_packet(h, p, dest);
        }
        let mut slot = vec![0xa5u8; 512];
        for (i, dest) in [1usize, 0].into_iter().enumerate() {
            let len = write_frame(&mut slot, &headers, &batch, i, 9).unwrap();
            assert_eq!(len, 42 + 8 + 200);
            let d = frame::parse(&slot[..len], UdpChecksum::Verify).unwrap();
            assert_eq!((d.src, d.dst, d.src_mac), (src, dsts[dest], mac));
            assert_eq!(d.dst_mac, [0x01, 0x00, 0x5e, 10, 10, 10 + dest as u8]);
            assert_eq!(&d.payload[..8], &header);
            assert_eq!(&d.payload[8..], &payload[..]);
        }
        let mut small = vec![0u8; 100];
        assert!(write_frame(&mut small, &headers, &batch, 0, 0).is_err());
        assert!(write_frame(&mut slot, &headers[..1], &batch, 0, 0).is_err());
    }
}
