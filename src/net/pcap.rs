//! pcap replay and capture. Replay extracts the UDP payloads of IPv4 packets (Ethernet,
//! Linux cooked or raw IP link types), optionally only those to given endpoints, so that a
//! recording can be channelised offline. Capture writes received datagrams as Ethernet/IPv4/UDP
//! frames that Wireshark and spead2's pcap reader accept.
#![deny(unsafe_code)]

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read};
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness};

use super::{PacketReceiver, Received, RecvBatch};

fn pcap_err(e: pcap_file::PcapError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// The UDP payload of a frame, and its destination, if it is IPv4/UDP.
pub fn udp_payload(link: DataLink, frame: &[u8]) -> Option<(SocketAddrV4, &[u8])> {
    let ip = match link {
        DataLink::ETHERNET => {
            let mut off = 12;
            let mut ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
            // Skip 802.1Q tags.
            while ethertype == 0x8100 {
                off += 4;
                ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
            }
            (ethertype == 0x0800).then_some(())?;
            frame.get(off + 2..)?
        }
        DataLink::LINUX_SLL => {
            (u16::from_be_bytes([*frame.get(14)?, *frame.get(15)?]) == 0x0800).then_some(())?;
            frame.get(16..)?
        }
        DataLink::RAW | DataLink::IPV4 => frame,
        _ => return None,
    };
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    if ip.first()? >> 4 != 4 || ihl < 20 || *ip.get(9)? != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
    if frag & 0x3fff != 0 {
        return None; // fragments are not reassembled (spead2 does not either)
    }
    let dst_ip = std::net::Ipv4Addr::new(*ip.get(16)?, *ip.get(17)?, *ip.get(18)?, *ip.get(19)?);
    let udp = ip.get(ihl..total.min(ip.len()))?;
    let dst_port = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    let udp_len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    let payload = udp.get(8..udp_len.max(8).min(udp.len()))?;
    Some((SocketAddrV4::new(dst_ip, dst_port), payload))
}

/// Largest frame one record may hold (pcap's customary snaplen ceiling): a record claiming
/// more is corrupt, and would otherwise size a buffer from the file.
pub const MAX_FRAME: usize = 262_144;

/// Replays the UDP payloads of a pcap file (or of any byte source: the fuzz target reads
/// from memory). Records are read one at a time into one frame buffer, so memory is bounded
/// by [`MAX_FRAME`] (pcap-file's own reader buffers 8 MB per file, which also dominated the
/// fuzz target's time).
pub struct PcapReceiver<R: Read = BufReader<File>> {
    source: R,
    endianness: Endianness,
    link: DataLink,
    frame: Vec<u8>,
    filter: Vec<SocketAddrV4>,
    /// Frames skipped as not IPv4/UDP or not to a wanted endpoint.
    pub skipped: u64,
}

impl PcapReceiver {
    /// Open `path`; with a non-empty `filter`, keep only datagrams to those endpoints.
    pub fn open(path: &Path, filter: &[SocketAddrV4]) -> io::Result<Self> {
        PcapReceiver::from_reader(BufReader::new(File::open(path)?), filter)
    }
}

/// Fill `buf` from `r`; the bytes read (fewer only at the end of the stream).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl<R: Read> PcapReceiver<R> {
    /// Read a pcap stream from `source`; `filter` as for [`PcapReceiver::open`].
    pub fn from_reader(mut source: R, filter: &[SocketAddrV4]) -> io::Result<Self> {
        let mut head = [0u8; 24];
        if read_full(&mut source, &mut head)? < head.len() {
            return Err(invalid("not a pcap file: shorter than its header".into()));
        }
        let (_, header) = PcapHeader::from_slice(&head).map_err(pcap_err)?;
        Ok(PcapReceiver {
            source,
            endianness: header.endianness,
            link: header.datalink,
            frame: Vec::new(),
            filter: filter.to_vec(),
            skipped: 0,
        })
    }

    /// Read the next record's frame into `self.frame`; false at the end of the file.
    fn next_frame(&mut self) -> io::Result<bool> {
        let mut rec = [0u8; 16];
        match read_full(&mut self.source, &mut rec)? {
            0 => return Ok(false),
            16 => {}
            n => {
                return Err(invalid(format!(
                    "truncated pcap record header ({n} of 16 bytes)"
                )))
            }
        }
        let len = [rec[8], rec[9], rec[10], rec[11]];
        let len = match self.endianness {
            Endianness::Big => u32::from_be_bytes(len),
            Endianness::Little => u32::from_le_bytes(len),
        } as usize;
        if len > MAX_FRAME {
            return Err(invalid(format!(
                "pcap record of {len} bytes (at most {MAX_FRAME})"
            )));
        }
        self.frame.resize(len, 0);
        if read_full(&mut self.source, &mut self.frame)? < len {
            return Err(invalid("truncated pcap record".into()));
        }
        Ok(true)
    }
}

impl<R: Read + Send> PacketReceiver for PcapReceiver<R> {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        while batch.len() < batch.capacity() && self.next_frame()? {
            match udp_payload(self.link, &self.frame) {
                Some((dst, payload)) if self.filter.is_empty() || self.filter.contains(&dst) => {
                    batch.push(payload);
                }
                _ => self.skipped += 1,
            }
        }
        Ok(if batch.is_empty() {
            Received::End
        } else {
            Received::Packets(batch.len())
        })
    }
}

/// Writes datagrams into a pcap file as Ethernet/IPv4/UDP frames.
pub struct PcapDump {
    writer: PcapWriter<BufWriter<File>>,
    frame: Vec<u8>,
}

impl PcapDump {
    pub fn create(path: &Path) -> io::Result<Self> {
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            snaplen: 65535,
            ..Default::default()
        };
        let writer = PcapWriter::with_header(BufWriter::new(File::create(path)?), header)
            .map_err(pcap_err)?;
        Ok(PcapDump {
            writer,
            frame: Vec::with_capacity(9200),
        })
    }

    /// Append one datagram sent from `src` to `dst` (`payload` ≤ 65507 bytes).
    pub fn write(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> io::Result<()> {
        let f = &mut self.frame;
        f.clear();
        let mac = |ip: std::net::Ipv4Addr| -> [u8; 6] {
            let o = ip.octets();
            if ip.is_multicast() {
                [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
            } else {
                [0x02, 0x00, o[0], o[1], o[2], o[3]]
            }
        };
        f.extend_from_slice(&mac(*dst.ip()));
        f.extend_from_slice(&mac(*src.ip()));
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 8 + payload.len()) as u16;
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[6] = 0x40; // don't fragment
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst.ip().octets());
        let sum = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&src.port().to_be_bytes());
        f.extend_from_slice(&dst.port().to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]); // no UDP checksum (allowed over IPv4)
        f.extend_from_slice(payload);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.writer
            .write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .map_err(pcap_err)?;
        Ok(())
    }

    /// Flush and close the file, reporting any write error.
    pub fn finish(self) -> io::Result<()> {
        use std::io::Write;
        self.writer.into_writer().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_then_replay() {
        let dir = std::env::temp_dir().join(format!("cbf-pcap-{}", std::process::id()));
        let dst: SocketAddrV4 = "239.1.2.3:7148".parse().unwrap();
        let other: SocketAddrV4 = "239.1.2.4:7148".parse().unwrap();
        let src: SocketAddrV4 = "10.0.0.1:5000".parse().unwrap();
        {
            let mut d = PcapDump::create(&dir).unwrap();
            d.write(src, dst, b"hello").unwrap();
            d.write(src, other, b"skip").unwrap();
            d.write(src, dst, &[7u8; 9000]).unwrap();
            d.finish().unwrap();
        }
        let mut r = PcapReceiver::open(&dir, &[dst]).unwrap();
        let mut b = RecvBatch::new(8, 9200);
        assert_eq!(r.recv_batch(&mut b).unwrap(), Received::Packets(2));
        assert_eq!(b.packet(0), b"hello");
        assert_eq!(b.packet(1), &[7u8; 9000][..]);
        assert_eq!(r.skipped, 1);
        assert_eq!(r.recv_batch(&mut b).unwrap(), Received::End);
        std::fs::remove_file(&dir).unwrap();
    }

    /// A big-endian file written by hand (pcap's own layout), then the same file cut short
    /// and with a record claiming 1 GiB: the first replays, the others are errors, not
    /// panics or allocations.
    #[test]
    fn big_endian_truncated_and_oversized_records() {
        let mut ip = vec![
            0x45, 0, 0, 33, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 239, 1, 2, 3,
        ];
        ip.extend_from_slice(&[0x13, 0x88, 0x1b, 0xec, 0, 13, 0, 0]); // 5000 → 7148, 13 bytes
        ip.extend_from_slice(b"hello");
        let mut file = vec![0xa1, 0xb2, 0xc3, 0xd4, 0, 2, 0, 4];
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&65535u32.to_be_bytes());
        file.extend_from_slice(&101u32.to_be_bytes()); // LINKTYPE_RAW
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&(ip.len() as u32).to_be_bytes());
        file.extend_from_slice(&(ip.len() as u32).to_be_bytes());
        file.extend_from_slice(&ip);
        let mut b = RecvBatch::new(8, 9200);
        let mut r = PcapReceiver::from_reader(io::Cursor::new(file.clone()), &[]).unwrap();
        assert_eq!(r.recv_batch(&mut b).unwrap(), Received::Packets(1));
        assert_eq!(b.packet(0), b"hello");
        assert_eq!(r.recv_batch(&mut b).unwrap(), Received::End);
        let cut = &file[..file.len() - 3];
        let mut r = PcapReceiver::from_reader(cut, &[]).unwrap();
        assert!(r.recv_batch(&mut b).is_err());
        let mut huge = file.clone();
        huge[32..36].copy_from_slice(&(1u32 << 30).to_be_bytes());
        let mut r = PcapReceiver::from_reader(&huge[..], &[]).unwrap();
        assert!(r.recv_batch(&mut b).is_err());
        assert!(PcapReceiver::from_reader(&file[..20], &[]).is_err());
    }

    #[test]
    fn garbage_frames_are_skipped() {
        for frame in [&[][..], &[0u8; 13], &[0xffu8; 60]] {
            assert!(udp_payload(DataLink::ETHERNET, frame).is_none());
            assert!(udp_payload(DataLink::RAW, frame).is_none());
        }
    }
}
