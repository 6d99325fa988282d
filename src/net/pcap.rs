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

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

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

/// Replays the UDP payloads of a pcap file (or of any byte source: the fuzz target reads
/// from memory).
pub struct PcapReceiver<R: Read = BufReader<File>> {
    reader: PcapReader<R>,
    link: DataLink,
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

impl<R: Read> PcapReceiver<R> {
    /// Read a pcap stream from `source`; `filter` as for [`PcapReceiver::open`].
    pub fn from_reader(source: R, filter: &[SocketAddrV4]) -> io::Result<Self> {
        let reader = PcapReader::new(source).map_err(pcap_err)?;
        let link = reader.header().datalink;
        Ok(PcapReceiver {
            reader,
            link,
            filter: filter.to_vec(),
            skipped: 0,
        })
    }
}

impl<R: Read + Send> PacketReceiver for PcapReceiver<R> {
    fn recv_batch(&mut self, batch: &mut RecvBatch) -> io::Result<Received> {
        batch.clear();
        while batch.len() < batch.capacity() {
            match self.reader.next_packet() {
                None => break,
                Some(Err(e)) => return Err(pcap_err(e)),
                Some(Ok(pkt)) => match udp_payload(self.link, &pkt.data) {
                    Some((dst, payload))
                        if self.filter.is_empty() || self.filter.contains(&dst) =>
                    {
                        batch.push(payload);
                    }
                    _ => self.skipped += 1,
                },
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

    #[test]
    fn garbage_frames_are_skipped() {
        for frame in [&[][..], &[0u8; 13], &[0xffu8; 60]] {
            assert!(udp_payload(DataLink::ETHERNET, frame).is_none());
            assert!(udp_payload(DataLink::RAW, frame).is_none());
        }
    }
}
