#!/usr/bin/env python3
"""Independent Ethernet II / IPv4 / UDP frames for cbf's `net::frame` (Python struct + socket).

frames SEED N   -> N lines "HEX CAUSE SRC DST PAYLOAD_LEN": a frame built with struct.pack,
                   its IPv4 header checksum (and, for some, the UDP checksum over the RFC 768
                   pseudo-header) summed here 16 bits at a time (RFC 1071), then perhaps one
                   defect; CAUSE is what the parser must say ("ok" or a FrameDrop name) and
                   SRC/DST/PAYLOAD_LEN what it must return when ok ("-" otherwise).
check HEX...    -> for each frame cbf emitted: "ok LEN" when its IPv4 checksum, lengths,
                   flags and multicast MAC are right as computed here, else the first fault.
"""
import random
import socket
import struct
import sys


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = 0
    for (w,) in struct.iter_unpack("!H", data):
        s += w
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip_header(total, ident, flags_frag, ttl, proto, src, dst, ver_ihl=0x45, options=b""):
    h = struct.pack("!BBHHHBBH4s4s", ver_ihl, 0, total, ident, flags_frag, ttl, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst)) + options
    c = csum(h)
    return h[:10] + struct.pack("!H", c) + h[12:]


def build(rng):
    src = socket.inet_ntoa(struct.pack("!I", rng.getrandbits(32)))
    dst = socket.inet_ntoa(struct.pack("!I", rng.getrandbits(32)))
    sport, dport = rng.randrange(65536), rng.randrange(65536)
    payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
    udp_len = 8 + len(payload)
    with_sum = rng.random() < 0.5
    cause = "ok"
    udp = struct.pack("!HHHH", sport, dport, udp_len, 0) + payload
    if with_sum:
        pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 17, udp_len)
        c = csum(pseudo + udp) or 0xFFFF
        udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    total = 20 + udp_len
    ident, ttl = rng.randrange(65536), rng.randrange(256)
    flags = 0x4000
    proto, ver_ihl, options = 17, 0x45, b""
    ethertype = 0x0800
    defect = rng.choice(["none"] * 6 + ["mf", "offset", "proto", "options", "version",
                         "ethertype", "ipsum", "udpsum", "udplen", "short", "total"])
    if defect == "mf":
        flags |= 0x2000
        cause = "fragment"
    elif defect == "offset":
        flags = rng.randrange(1, 0x2000)
        cause = "fragment"
    elif defect == "proto":
        proto = rng.choice([1, 6, 58])
        cause = "not_udp"
    elif defect == "options":
        ver_ihl, options = 0x46, b"\x01\x01\x01\x00"
        total += 4
        cause = "ip_options"
    elif defect == "version":
        ver_ihl = 0x65
        cause = "not_ipv4"
    elif defect == "ethertype":
        ethertype = rng.choice([0x86DD, 0x0806, 0x8100])
        cause = "not_ipv4"
    elif defect == "udplen":
        udp = udp[:4] + struct.pack("!H", rng.choice([0, 7, udp_len + 1 + rng.randrange(100)])) + udp[6:]
        cause = "udp_length"
    elif defect == "udpsum" and with_sum:
        bad = udp[6:8] if udp[6:8] != b"\xff\xff" else b"\x00\x01"
        udp = udp[:6] + bytes([bad[0] ^ 0x10, bad[1]]) + udp[8:]
        cause = "udp_checksum"
    ip = ip_header(total, ident, flags, ttl, proto, src, dst, ver_ihl, options)
    if defect == "ipsum":
        ip = ip[:10] + bytes([ip[10] ^ 0x01, ip[11]]) + ip[12:]
        cause = "ip_checksum"
    eth = bytes(rng.getrandbits(8) for _ in range(12)) + struct.pack("!H", ethertype)
    frame = eth + ip + udp
    if defect == "short":
        frame = frame[:rng.randrange(0, 14 + 20)]
        cause = "truncated" if len(frame) < 14 or ethertype == 0x0800 else "not_ipv4"
    elif defect == "total":
        frame = frame[:-1] if len(payload) else frame[:14 + 20 + 7]
        cause = "ip_length" if len(frame) >= 34 else "truncated"
    elif rng.random() < 0.3:
        frame += bytes(rng.randrange(30))  # Ethernet padding after the datagram
    if cause == "ok":
        return frame, cause, f"{src}:{sport}", f"{dst}:{dport}", str(len(payload))
    return frame, cause, "-", "-", "-"


def check(frame):
    if struct.unpack("!H", frame[12:14])[0] != 0x0800:
        return "ethertype"
    ip = frame[14:34]
    if csum(ip) != 0:
        return "ip_checksum"
    ver_ihl, _, total, _, flags, _, proto = struct.unpack("!BBHHHBB", ip[:10])
    if ver_ihl != 0x45 or proto != 17 or flags != 0x4000 or total != len(frame) - 14:
        return "ip_fields"
    dst = ip[16:20]
    if dst[0] >> 4 == 14 and frame[:6] != bytes([1, 0, 0x5E, dst[1] & 0x7F, dst[2], dst[3]]):
        return "multicast_mac"
    sport, dport, udp_len, _ = struct.unpack("!HHHH", frame[34:42])
    if udp_len != total - 20:
        return "udp_length"
    return f"ok {udp_len - 8}"


def main():
    a = sys.argv[1:]
    if a[0] == "frames":
        rng = random.Random(int(a[1]))
        for _ in range(int(a[2])):
            frame, *rest = build(rng)
            print(frame.hex() or "-", *rest)
    elif a[0] == "check":
        for h in sys.stdin.read().split():
            print(check(bytes.fromhex(h)))


if __name__ == "__main__":
    main()
