//! Ethernet II + IPv4 + UDP frames, for the transports that see whole frames (DPDK, ibverbs
//! raw-packet queues) rather than datagrams from the kernel (seed 000 §Network receive and
//! §Network transmit: SPEAD travels as one UDP datagram per packet, mostly to IPv4 multicast).
//!
//! Contract: [`parse`] is the only door for outside frames. It returns the datagram's endpoints
//! and payload, or a [`FrameDrop`] saying why the frame is not one cbf takes; after it succeeds
//! the payload slice lies inside the frame and inside the lengths the headers claim. What the
//! kernel's stack would refuse on the UDP path is refused here too, by cause: runt frames, IPv4
//! headers with a bad checksum, options or a length past the frame, fragments (spead2 does not
//! reassemble either), UDP lengths past the IP payload. A UDP length shorter than the IP
//! payload trims the datagram, as Linux does (`udp_rcv`). The UDP checksum is optional in IPv4
//! (RFC 768); [`parse`] checks a non-zero one only when asked, since summing every payload byte
//! costs as much as the copy into chunk memory, and NICs check it in hardware.
//!
//! [`FrameHeaders`] writes the 42 bytes in front of a payload for one destination: the IPv4
//! multicast MAC mapping (RFC 1112 §6.4: `01:00:5e` and the group's low 23 bits), or a given MAC
//! for unicast, which has no ARP behind it here and so must be configured; the IPv4 header
//! checksum (RFC 1071); UDP checksum 0 ("none", RFC 768).
//!
//! Layout (all big-endian, no VLAN tag, no IP options):
//!
//! ```text
//!  0..6  dst MAC | 6..12 src MAC | 12..14 ethertype 0x0800
//! 14     version 4, IHL 5 | 15 DSCP/ECN | 16..18 total length | 18..20 identification
//! 20..22 flags (DF 0x4000, MF 0x2000), fragment offset | 22 TTL | 23 protocol 17
//! 24..26 header checksum | 26..30 src IPv4 | 30..34 dst IPv4
//! 34..36 src port | 36..38 dst port | 38..40 UDP length | 40..42 UDP checksum | 42.. payload
//! ```
#![deny(unsafe_code)]

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// A MAC address.
pub type Mac = [u8; 6];

/// Ethernet II header bytes (no VLAN tag).
pub const ETH_LEN: usize = 14;
/// IPv4 header bytes without options.
pub const IPV4_LEN: usize = 20;
/// UDP header bytes.
pub const UDP_LEN: usize = 8;
/// Every header in front of the payload.
pub const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
/// Largest UDP payload one IPv4 datagram may carry (65535 − 20 − 8).
pub const MAX_PAYLOAD: usize = 65_507;

const ETHERTYPE_IPV4: u16 = 0x0800;
const PROTO_UDP: u8 = 17;
const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1fff;

mod field {
    use core::ops::Range;
    pub const DST_MAC: Range<usize> = 0..6;
    pub const SRC_MAC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const VER_IHL: usize = 14;
    pub const TOTAL_LEN: Range<usize> = 16..18;
    pub const IDENT: Range<usize> = 18..20;
    pub const FLAGS_FRAG: Range<usize> = 20..22;
    pub const TTL: usize = 22;
    pub const PROTOCOL: usize = 23;
    pub const IP_CHECKSUM: Range<usize> = 24..26;
    pub const SRC_IP: Range<usize> = 26..30;
    pub const DST_IP: Range<usize> = 30..34;
    pub const IP_HEADER: Range<usize> = 14..34;
    pub const SRC_PORT: Range<usize> = 34..36;
    pub const DST_PORT: Range<usize> = 36..38;
    pub const UDP_LEN: Range<usize> = 38..40;
    pub const UDP_CHECKSUM: Range<usize> = 40..42;
}

#[inline]
fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
}

#[inline]
fn ipv4(b: &[u8], r: core::ops::Range<usize>) -> Ipv4Addr {
    Ipv4Addr::new(b[r.start], b[r.start + 1], b[r.start + 2], b[r.start + 3])
}

/// Why a frame is not a datagram cbf takes. Small and `Copy`, so receivers count per cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameDrop {
    /// Shorter than the headers it needs.
    Truncated,
    /// Not IPv4 (ARP, IPv6, a VLAN tag, LLDP, ...), or an IP version other than 4.
    NotIpv4,
    /// An IPv4 header with options (IHL > 5), or an impossible one (IHL < 5).
    IpOptions,
    /// The IPv4 total length is shorter than its headers or runs past the frame.
    IpLength,
    IpChecksum,
    /// A fragment (more-fragments flag or a non-zero offset): not reassembled.
    Fragment,
    /// An IPv4 protocol other than UDP.
    NotUdp,
    /// A UDP length under 8 or past the IPv4 payload.
    UdpLength,
    /// A non-zero UDP checksum that does not verify (when checked).
    UdpChecksum,
    /// A well-formed datagram to an endpoint this receiver does not listen on.
    NotOurs,
}

impl FrameDrop {
    pub const ALL: [FrameDrop; 10] = [
        FrameDrop::Truncated,
        FrameDrop::NotIpv4,
        FrameDrop::IpOptions,
        FrameDrop::IpLength,
        FrameDrop::IpChecksum,
        FrameDrop::Fragment,
        FrameDrop::NotUdp,
        FrameDrop::UdpLength,
        FrameDrop::UdpChecksum,
        FrameDrop::NotOurs,
    ];

    /// A stable snake-case name for counters and logs.
    pub fn name(self) -> &'static str {
        match self {
            FrameDrop::Truncated => "truncated",
            FrameDrop::NotIpv4 => "not_ipv4",
            FrameDrop::IpOptions => "ip_options",
            FrameDrop::IpLength => "ip_length",
            FrameDrop::IpChecksum => "ip_checksum",
            FrameDrop::Fragment => "fragment",
            FrameDrop::NotUdp => "not_udp",
            FrameDrop::UdpLength => "udp_length",
            FrameDrop::UdpChecksum => "udp_checksum",
            FrameDrop::NotOurs => "not_ours",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for FrameDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Frames refused, by [`FrameDrop`] cause.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrameDrops([u64; FrameDrop::ALL.len()]);

impl FrameDrops {
    #[inline]
    pub fn add(&mut self, cause: FrameDrop) {
        self.0[cause.index()] += 1;
    }

    pub fn get(&self, cause: FrameDrop) -> u64 {
        self.0[cause.index()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Element-wise sum.
    pub fn merge(&mut self, o: &FrameDrops) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
    }
}

/// A parsed frame: the datagram's endpoints and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: &'a [u8],
}

/// Whether [`parse`] sums the payload to check a non-zero UDP checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    Verify,
    /// Trust it (the NIC checked it, or the test harness wrote 0).
    Skip,
}

/// The datagram in an Ethernet II frame (trailing Ethernet padding allowed), or why not.
pub fn parse(frame: &[u8], udp_checksum: UdpChecksum) -> Result<Datagram<'_>, FrameDrop> {
    if frame.len() < ETH_LEN {
        return Err(FrameDrop::Truncated);
    }
    if be16(frame, field::ETHERTYPE) != ETHERTYPE_IPV4 {
        return Err(FrameDrop::NotIpv4);
    }
    if frame.len() < ETH_LEN + IPV4_LEN {
        return Err(FrameDrop::Truncated);
    }
    let ver_ihl = frame[field::VER_IHL];
    if ver_ihl >> 4 != 4 {
        return Err(FrameDrop::NotIpv4);
    }
    if ver_ihl & 0x0f != 5 {
        return Err(FrameDrop::IpOptions);
    }
    let total = usize::from(be16(frame, field::TOTAL_LEN));
    if total < IPV4_LEN + UDP_LEN || ETH_LEN + total > frame.len() {
        return Err(FrameDrop::IpLength);
    }
    if internet_checksum(&frame[field::IP_HEADER], 0) != 0 {
        return Err(FrameDrop::IpChecksum);
    }
    if be16(frame, field::FLAGS_FRAG) & (FLAG_MF | FRAG_OFFSET) != 0 {
        return Err(FrameDrop::Fragment);
    }
    if frame[field::PROTOCOL] != PROTO_UDP {
        return Err(FrameDrop::NotUdp);
    }
    let udp_len = usize::from(be16(frame, field::UDP_LEN));
    if udp_len < UDP_LEN || udp_len > total - IPV4_LEN {
        return Err(FrameDrop::UdpLength);
    }
    let src = SocketAddrV4::new(ipv4(frame, field::SRC_IP), be16(frame, field::SRC_PORT));
    let dst = SocketAddrV4::new(ipv4(frame, field::DST_IP), be16(frame, field::DST_PORT));
    let udp = &frame[ETH_LEN + IPV4_LEN..ETH_LEN + IPV4_LEN + udp_len];
    if udp_checksum == UdpChecksum::Verify
        && be16(frame, field::UDP_CHECKSUM) != 0
        && internet_checksum(udp, pseudo_header_sum(*src.ip(), *dst.ip(), udp_len)) != 0
    {
        return Err(FrameDrop::UdpChecksum);
    }
    let mut src_mac = [0; 6];
    let mut dst_mac = [0; 6];
    src_mac.copy_from_slice(&frame[field::SRC_MAC]);
    dst_mac.copy_from_slice(&frame[field::DST_MAC]);
    Ok(Datagram {
        src_mac,
        dst_mac,
        src,
        dst,
        payload: &udp[UDP_LEN..],
    })
}

/// The ones' complement of the ones' complement sum of `data` as big-endian 16-bit words (an
/// odd last byte padded with zero), starting from `initial` (RFC 1071). Over a header that
/// holds its own correct checksum it is 0.
pub fn internet_checksum(data: &[u8], initial: u32) -> u16 {
    // 32-bit words into a u64: no carry can be lost for any datagram (< 2^16 bytes).
    let mut sum = u64::from(initial);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    sum += u64::from(u32::from_be_bytes(tail));
    // Fold to 16 bits; the end-around carries make the sum of 32-bit words equal the sum of
    // the 16-bit ones (RFC 1071 §2(B)).
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP pseudo-header's contribution to the checksum sum (RFC 768): addresses, protocol and
/// the UDP length.
fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: usize) -> u32 {
    let word = |a: Ipv4Addr| {
        let o = a.octets();
        u32::from(u16::from_be_bytes([o[0], o[1]])) + u32::from(u16::from_be_bytes([o[2], o[3]]))
    };
    word(src) + word(dst) + u32::from(PROTO_UDP) + udp_len as u32
}

/// The UDP checksum of a datagram (header with a zero checksum field, then payload) between
/// `src` and `dst`, as a sender writes it (0 becomes 0xffff: RFC 768 reserves 0 for "none").
pub fn udp_checksum(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> u16 {
    match internet_checksum(udp, pseudo_header_sum(src, dst, udp.len())) {
        0 => 0xffff,
        c => c,
    }
}

/// The Ethernet address an IPv4 multicast group maps to (RFC 1112 §6.4); `None` for others.
pub fn multicast_mac(group: Ipv4Addr) -> Option<Mac> {
    let o = group.octets();
    group
        .is_multicast()
        .then_some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
}

/// Why headers cannot be built for a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Unicast needs the next hop's MAC, which nothing here resolves (no ARP).
    #[error("unicast destination {0} needs a destination MAC address")]
    UnicastNeedsMac(Ipv4Addr),
    #[error("MAC address {0:?}: expected six hex bytes separated by ':'")]
    BadMac(String),
    #[error("payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte UDP limit")]
    PayloadTooLong(usize),
}

/// Parse `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(text: &str) -> Result<Mac, FrameError> {
    let bad = || FrameError::BadMac(text.to_string());
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split([':', '-']);
    for b in &mut mac {
        let p = parts.next().ok_or_else(bad)?;
        if p.len() != 2 {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    match parts.next() {
        Some(_) => Err(bad()),
        None => Ok(mac),
    }
}

/// The destination MAC for `dst`: the multicast mapping, else `unicast` (refused when absent).
pub fn dest_mac(dst: Ipv4Addr, unicast: Option<Mac>) -> Result<Mac, FrameError> {
    multicast_mac(dst)
        .or(unicast)
        .ok_or(FrameError::UnicastNeedsMac(dst))
}

/// The fixed headers of every frame from one source to one destination; [`FrameHeaders::emit`]
/// fills in the lengths, identification and checksum for each payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeaders {
    bytes: [u8; HEADERS_LEN],
}

impl FrameHeaders {
    /// Headers from `src` (at `src_mac`) to `dst` (at `dst_mac`, see [`dest_mac`]) with `ttl`.
    pub fn new(src_mac: Mac, src: SocketAddrV4, dst_mac: Mac, dst: SocketAddrV4, ttl: u8) -> Self {
        let mut b = [0u8; HEADERS_LEN];
        b[field::DST_MAC].copy_from_slice(&dst_mac);
        b[field::SRC_MAC].copy_from_slice(&src_mac);
        b[field::ETHERTYPE].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        b[field::VER_IHL] = 0x45;
        b[field::FLAGS_FRAG].copy_from_slice(&FLAG_DF.to_be_bytes());
        b[field::TTL] = ttl;
        b[field::PROTOCOL] = PROTO_UDP;
        b[field::SRC_IP].copy_from_slice(&src.ip().octets());
        b[field::DST_IP].copy_from_slice(&dst.ip().octets());
        b[field::SRC_PORT].copy_from_slice(&src.port().to_be_bytes());
        b[field::DST_PORT].copy_from_slice(&dst.port().to_be_bytes());
        FrameHeaders { bytes: b }
    }

    /// Write the headers for a `payload_len`-byte payload into `out[..HEADERS_LEN]`, with IPv4
    /// identification `ident` (any value: DF is set, so it identifies no fragments).
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADERS_LEN`] (a caller's buffer, not outside input).
    pub fn emit(&self, out: &mut [u8], payload_len: usize, ident: u16) -> Result<(), FrameError> {
        if payload_len > MAX_PAYLOAD {
            return Err(FrameError::PayloadTooLong(payload_len));
        }
        let out = &mut out[..HEADERS_LEN];
        out.copy_from_slice(&self.bytes);
        let total = (IPV4_LEN + UDP_LEN + payload_len) as u16;
        out[field::TOTAL_LEN].copy_from_slice(&total.to_be_bytes());
        out[field::IDENT].copy_from_slice(&ident.to_be_bytes());
        let sum = internet_checksum(&out[field::IP_HEADER], 0);
        out[field::IP_CHECKSUM].copy_from_slice(&sum.to_be_bytes());
        let udp_len = (UDP_LEN + payload_len) as u16;
        out[field::UDP_LEN].copy_from_slice(&udp_len.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 1071 the slow way: 16-bit words, the end-around carry folded after every add.
    fn reference_checksum(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for i in (0..data.len()).step_by(2) {
            let hi = u32::from(data[i]) << 8;
            let lo = data.get(i + 1).map_or(0, |&b| u32::from(b));
            sum += hi | lo;
            if sum > 0xffff {
                sum -= 0xffff;
            }
        }
        !(sum as u16)
    }

    fn ep(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    /// A frame from the headers and payload, written into a dirty buffer.
    fn frame(h: &FrameHeaders, payload: &[u8], ident: u16) -> Vec<u8> {
        let mut f = vec![0xa5; HEADERS_LEN + payload.len()];
        h.emit(&mut f, payload.len(), ident).unwrap();
        f[HEADERS_LEN..].copy_from_slice(payload);
        f
    }

    #[test]
    fn known_checksums() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to 0xddf2.
        let rfc = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&rfc, 0), !0xddf2);
        // A captured IPv4 header (192.168.0.1 → 192.168.0.199, UDP, TTL 64) whose checksum
        // field holds 0xb861; zeroed, the sum gives that value back.
        let mut ip = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(internet_checksum(&ip, 0), 0);
        ip[10] = 0;
        ip[11] = 0;
        assert_eq!(internet_checksum(&ip, 0), 0xb861);
    }

    #[test]
    fn multicast_maps_low_23_bits_and_unicast_needs_a_mac() {
        let g: Ipv4Addr = "239.138.10.11".parse().unwrap();
        assert_eq!(multicast_mac(g), Some([0x01, 0x00, 0x5e, 0x0a, 0x0a, 0x0b]));
        let u: Ipv4Addr = "10.0.0.2".parse().unwrap();
        assert_eq!(multicast_mac(u), None);
        assert_eq!(dest_mac(u, None), Err(FrameError::UnicastNeedsMac(u)));
        let mac = parse_mac("02:00:0a:00:00:02").unwrap();
        assert_eq!(dest_mac(u, Some(mac)), Ok(mac));
        assert_eq!(dest_mac(g, Some(mac)), Ok(multicast_mac(g).unwrap()));
        for bad in [
            "",
            "02:00:0a:00:00",
            "02:00:0a:00:00:02:03",
            "2:00:0a:00:00:02",
            "zz:00:0a:00:00:02",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_mac("AA-bb-CC-dd-EE-ff"),
            Ok([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff])
        );
    }

    #[test]
    fn each_defect_has_its_cause() {
        let h = FrameHeaders::new([2; 6], ep("10.0.0.1:5000"), [1; 6], ep("239.1.2.3:7148"), 4);
        let good = frame(&h, &[7; 100], 1);
        assert!(parse(&good, UdpChecksum::Verify).is_ok());
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut v = good.clone();
            f(&mut v);
            parse(&v, UdpChecksum::Verify).map(|d| d.payload.len())
        };
        // Re-seal the IPv4 checksum after editing the header, so that only the edit is wrong.
        let reseal = |v: &mut Vec<u8>| {
            v[24] = 0;
            v[25] = 0;
            let c = internet_checksum(&v[14..34], 0);
            v[24..26].copy_from_slice(&c.to_be_bytes());
        };
        assert_eq!(with(&|v| v.truncate(13)), Err(FrameDrop::Truncated));
        assert_eq!(with(&|v| v.truncate(30)), Err(FrameDrop::Truncated));
        assert_eq!(with(&|v| v[12] = 0x86), Err(FrameDrop::NotIpv4));
        assert_eq!(
            with(&|v| {
                v[14] = 0x65;
                reseal(v)
            }),
            Err(FrameDrop::NotIpv4)
        );
        assert_eq!(
            with(&|v| {
                v[14] = 0x46;
                reseal(v)
            }),
            Err(FrameDrop::IpOptions)
        );
        assert_eq!(with(&|v| v.truncate(120)), Err(FrameDrop::IpLength));
        assert_eq!(
            with(&|v| {
                v[17] = 27;
                reseal(v)
            }),
            Err(FrameDrop::IpLength)
        );
        assert_eq!(with(&|v| v[30] ^= 1), Err(FrameDrop::IpChecksum));
        assert_eq!(
            with(&|v| {
                v[20] |= 0x20;
                reseal(v)
            }),
            Err(FrameDrop::Fragment)
        );
        assert_eq!(
            with(&|v| {
                v[21] = 1;
                reseal(v)
            }),
            Err(FrameDrop::Fragment)
        );
        assert_eq!(
            with(&|v| {
                v[23] = 6;
                reseal(v)
            }),
            Err(FrameDrop::NotUdp)
        );
        assert_eq!(with(&|v| v[39] = 7), Err(FrameDrop::UdpLength));
        assert_eq!(with(&|v| v[39] = 109), Err(FrameDrop::UdpLength));
        // A shorter UDP length trims the datagram; Ethernet padding after it is ignored.
        assert_eq!(with(&|v| v[39] = 58), Ok(50));
        assert_eq!(with(&|v| v.extend_from_slice(&[0; 20])), Ok(100));
        // A non-zero UDP checksum is checked when asked: a wrong one, then the right one.
        let mut v = good.clone();
        v[41] = 1;
        assert_eq!(parse(&v, UdpChecksum::Verify), Err(FrameDrop::UdpChecksum));
        assert!(parse(&v, UdpChecksum::Skip).is_ok());
        let c = udp_checksum(
            "10.0.0.1".parse().unwrap(),
            "239.1.2.3".parse().unwrap(),
            &{
                let mut u = v[34..].to_vec();
                u[6] = 0;
                u[7] = 0;
                u
            },
        );
        v[40..42].copy_from_slice(&c.to_be_bytes());
        assert!(parse(&v, UdpChecksum::Verify).is_ok());
        assert_eq!(
            h.emit(&mut [0; HEADERS_LEN], MAX_PAYLOAD + 1, 0),
            Err(FrameError::PayloadTooLong(MAX_PAYLOAD + 1))
        );
    }

    fn endpoint() -> impl Strategy<Value = SocketAddrV4> {
        (any::<u32>(), any::<u16>()).prop_map(|(a, p)| SocketAddrV4::new(a.into(), p))
    }

    proptest! {
        #[test]
        fn checksum_matches_the_slow_sum(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(internet_checksum(&data, 0), reference_checksum(&data));
        }

        #[test]
        fn emitted_frames_parse_back(
            src in endpoint(), dst in endpoint(), src_mac in any::<Mac>(), dst_mac in any::<Mac>(),
            ttl in any::<u8>(), ident in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
        ) {
            let h = FrameHeaders::new(src_mac, src, dst_mac, dst, ttl);
            let f = frame(&h, &payload, ident);
            let d = parse(&f, UdpChecksum::Verify).unwrap();
            prop_assert_eq!(d, Datagram { src_mac, dst_mac, src, dst, payload: &payload });
            // The header checksum as the slow sum computes it over the emitted header.
            let mut ip = f[14..34].to_vec();
            let sent = u16::from_be_bytes([ip[10], ip[11]]);
            ip[10] = 0;
            ip[11] = 0;
            prop_assert_eq!(sent, reference_checksum(&ip));
            prop_assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, 28 + payload.len());
        }

        #[test]
        fn udp_checksum_matches_the_slow_sum(
            src in any::<u32>(), dst in any::<u32>(),
            udp in proptest::collection::vec(any::<u8>(), 8..600),
        ) {
            let (s, d) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, 17]);
            pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
            pseudo.extend_from_slice(&udp);
            let want = match reference_checksum(&pseudo) { 0 => 0xffff, c => c };
            prop_assert_eq!(udp_checksum(s, d, &udp), want);
        }

        #[test]
        fn parse_never_panics_and_stays_inside(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(d) = parse(&frame, UdpChecksum::Verify) {
                prop_assert!(d.payload.len() + HEADERS_LEN <= frame.len());
            }
        }
    }
}
