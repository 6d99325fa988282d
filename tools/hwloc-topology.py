#!/usr/bin/env python3
"""Write hwloc XML topologies of correlator-class hosts for `cbf affinity`'s tests.

Usage: tools/hwloc-topology.py [DIR]   (default: tests/data/hwloc)

The files take the shape of a real `lstopo --of xml` export (hwloc 2.x): a Machine holding
Packages, each with its NUMANode (a memory child) and an L3 over Cores over PUs (SMT siblings
numbered as Linux numbers them on two-socket Intel hosts: socket s core c is PU s*C+c, its
sibling PU 2*C+s*C+c); PCIe host bridges (`bridge_type="0-1"`, one per root complex) under each
Package, with a root port and a PCIe switch (`1-1` bridges) above the devices; NVIDIA GPUs
(class 0302) with their CUDA and NVML OS devices (`cuda0`, `nvml0`), Mellanox ConnectX-6 Dx
ports (class 0200) with their network and OpenFabrics OS devices (`ens1f0`, `mlx5_0`), a BMC's
VGA device and an on-board management NIC, as lstopo shows them. `lstopo --input FILE` and
cbf's loader (tests/affinity_hosts.rs) both read them.

Hosts written:
  dual-socket-2gpu-2nic.xml   2 sockets, a GPU and a 100 GbE NIC behind one switch per socket
  dual-socket-gpu-nic-apart.xml   the GPU on socket 0, the NIC on socket 1
  dual-socket-2gpu-1nic.xml   a GPU per socket, one NIC (on socket 0)
  single-socket-2root.xml     one socket, GPU and NIC on different root complexes (as on AMD
                              EPYC, every x16 slot its own), GPU known to NVML only
"""

import os
import sys

CORES = 24  # per socket


class Ids:
    """hwloc's gp_index: unique per object."""

    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return self.n


def mask(bits):
    """An hwloc bitmap string: 32-bit words, most significant first, comma-separated."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if value == 0:
            break
    return ",".join(f"0x{w:08x}" for w in reversed(words))


def sets(cpus, nodes, complete=True):
    c, n = mask(cpus), mask(nodes)
    return f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"'


def info(ind, pairs):
    return "".join(f'{ind}<info name="{k}" value="{v}"/>\n' for k, v in pairs)


class Host:
    def __init__(self, hostname, sockets, smt=True):
        self.ids = Ids()
        self.hostname = hostname
        self.sockets = sockets
        self.smt = smt
        self.io = {s: [] for s in range(sockets)}  # XML of each socket's host bridges

    def pus(self, s):
        first = [s * CORES + c for c in range(CORES)]
        if not self.smt:
            return first
        return first + [self.sockets * CORES + p for p in first]

    def host_bridge(self, socket, lo, hi, children):
        """A root complex on `socket` covering buses lo..hi, holding `children` (XML)."""
        body = "".join(children)
        self.io[socket].append(
            f'      <object type="Bridge" gp_index="{self.ids()}" bridge_type="0-1" depth="0" '
            f'bridge_pci="0000:[{lo:02x}-{hi:02x}]">\n{body}      </object>\n'
        )

    def bridge(self, busid, lo, hi, depth, vendor_device, children, speed="31.507692"):
        body = "".join(children)
        return (
            f'        <object type="Bridge" gp_index="{self.ids()}" bridge_type="1-1" '
            f'depth="{depth}" bridge_pci="0000:[{lo:02x}-{hi:02x}]" pci_busid="{busid}" '
            f'pci_type="0604 [{vendor_device}] [0000:0000] 00" pci_link_speed="{speed}">\n'
            f"{body}        </object>\n"
        )

    def gpu(self, busid, cuda, nvml):
        osdevs = ""
        if cuda is not None:
            osdevs += (
                f'          <object type="OSDev" gp_index="{self.ids()}" name="cuda{cuda}" '
                'subtype="CUDA" osdev_type="5">\n'
                + info(
                    "            ",
                    [
                        ("Backend", "CUDA"),
                        ("GPUVendor", "NVIDIA Corporation"),
                        ("GPUModel", "NVIDIA H100 PCIe"),
                        ("CUDAGlobalMemorySize", "83530752"),
                        ("CUDAL2CacheSize", "51200"),
                        ("CUDAMultiProcessors", "114"),
                        ("CUDACoresPerMP", "128"),
                        ("CUDASharedMemorySizePerMP", "228"),
                    ],
                )
                + "          </object>\n"
            )
        if nvml is not None:
            osdevs += (
                f'          <object type="OSDev" gp_index="{self.ids()}" name="nvml{nvml}" '
                'subtype="NVML" osdev_type="1">\n'
                + info(
                    "            ",
                    [
                        ("Backend", "NVML"),
                        ("GPUVendor", "NVIDIA Corporation"),
                        ("GPUModel", "NVIDIA H100 PCIe"),
                        ("NVIDIASerial", f"132302300{nvml}"),
                        ("NVIDIAUUID", f"GPU-5c1a33e0-1b1c-4d2e-9f3a-0000000000{nvml}0"),
                    ],
                )
                + "          </object>\n"
            )
        return (
            f'          <object type="PCIDev" gp_index="{self.ids()}" pci_busid="{busid}" '
            'pci_type="0302 [10de:2331] [10de:1626] a1" pci_link_speed="63.015385">\n'
            + info(
                "            ",
                [("PCIVendor", "NVIDIA Corporation"), ("PCIDevice", "GH100 [H100 PCIe]")],
            )
            + osdevs
            + "          </object>\n"
        )

    def cx6(self, bus, slot, mlx):
        """Both ports of a ConnectX-6 Dx on `bus`: ens{slot}f0/f1, mlx5_{mlx}/{mlx+1}."""
        out = ""
        for port in range(2):
            busid = f"0000:{bus:02x}:00.{port}"
            mac = f"b8:ce:f6:{bus:02x}:{slot:02x}:{port:02x}"
            out += (
                f'          <object type="PCIDev" gp_index="{self.ids()}" pci_busid="{busid}" '
                'pci_type="0200 [15b3:101d] [15b3:0016] 00" pci_link_speed="31.507692">\n'
                + info(
                    "            ",
                    [
                        ("PCIVendor", "Mellanox Technologies"),
                        ("PCIDevice", "MT2892 Family [ConnectX-6 Dx]"),
                    ],
                )
                + f'            <object type="OSDev" gp_index="{self.ids()}" '
                f'name="ens{slot}f{port}" osdev_type="2">\n'
                + info("              ", [("Address", mac)])
                + "            </object>\n"
                + f'            <object type="OSDev" gp_index="{self.ids()}" '
                f'name="mlx5_{mlx + port}" osdev_type="3">\n'
                + info(
                    "              ",
                    [
                        ("NodeGUID", f"b8ce:f603:00{bus:02x}:{slot:02x}{port:02x}"),
                        ("SysImageGUID", f"b8ce:f603:00{bus:02x}:{slot:02x}00"),
                        ("Port1State", "4"),
                        ("Port1LID", "0"),
                        ("Port1LMC", "0"),
                        ("Port1GID0", f"fe80:0000:0000:0000:bace:f6ff:fe{bus:02x}:{slot:02x}{port:02x}"),
                    ],
                )
                + "            </object>\n"
                + "          </object>\n"
            )
        return out

    def chipset(self):
        """Socket 0's chipset root complex: the BMC's VGA and an on-board 1 GbE port."""
        vga = (
            f'          <object type="PCIDev" gp_index="{self.ids()}" pci_busid="0000:02:00.0" '
            'pci_type="0300 [1a03:2000] [15d9:1c48] 52" pci_link_speed="0.492308">\n'
            + info("            ", [("PCIVendor", "ASPEED Technology, Inc."), ("PCIDevice", "ASPEED Graphics Family")])
            + "          </object>\n"
        )
        eno = (
            f'          <object type="PCIDev" gp_index="{self.ids()}" pci_busid="0000:03:00.0" '
            'pci_type="0200 [8086:1533] [15d9:1533] 03" pci_link_speed="0.615385">\n'
            + info("            ", [("PCIVendor", "Intel Corporation"), ("PCIDevice", "I210 Gigabit Network Connection")])
            + f'            <object type="OSDev" gp_index="{self.ids()}" name="eno1" osdev_type="2">\n'
            + info("              ", [("Address", "3c:ec:ef:00:00:01")])
            + "            </object>\n"
            + "          </object>\n"
        )
        self.host_bridge(
            0,
            0x00,
            0x03,
            [
                self.bridge("0000:00:1c.0", 0x02, 0x02, 1, "8086:a190", [vga], "0.492308"),
                self.bridge("0000:00:1c.4", 0x03, 0x03, 1, "8086:a194", [eno], "0.615385"),
            ],
        )

    def switch(self, socket, root_bus, devices):
        """A root complex on `socket` at `root_bus`: root port, then a PCIe switch whose
        downstream ports each hold one of `devices` (XML of PCI devices)."""
        n = len(devices)
        hi = root_bus + 2 + n
        ports = [
            self.bridge(
                f"0000:{root_bus + 2:02x}:{k:02x}.0",
                root_bus + 3 + k,
                root_bus + 3 + k,
                3,
                "10b5:c010",
                [devices[k]],
                "63.015385",
            )
            for k in range(n)
        ]
        upstream = self.bridge(
            f"0000:{root_bus + 1:02x}:00.0", root_bus + 2, hi, 2, "10b5:c010", ports, "63.015385"
        )
        root_port = self.bridge(
            f"0000:{root_bus:02x}:01.0", root_bus + 1, hi, 1, "8086:352a", [upstream], "63.015385"
        )
        self.host_bridge(socket, root_bus, hi, [root_port])

    def xml(self):
        ids = self.ids
        all_pus = [p for s in range(self.sockets) for p in self.pus(s)]
        nodes = list(range(self.sockets))
        a = mask(all_pus)
        n = mask(nodes)
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>\n',
            '<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n',
            '<topology version="2.0">\n',
            f'  <object type="Machine" os_index="0" cpuset="{a}" complete_cpuset="{a}" '
            f'allowed_cpuset="{a}" nodeset="{n}" complete_nodeset="{n}" allowed_nodeset="{n}" '
            f'gp_index="{ids()}">\n',
            info(
                "    ",
                [
                    ("DMIProductName", "SYS-420GP-TNR"),
                    ("DMIBoardVendor", "Supermicro"),
                    ("Backend", "Linux"),
                    ("OSName", "Linux"),
                    ("OSRelease", "6.1.0-18-amd64"),
                    ("HostName", self.hostname),
                    ("Architecture", "x86_64"),
                    ("hwlocVersion", "2.9.0"),
                    ("ProcessName", "lstopo-no-graphics"),
                ],
            ),
        ]
        for s in range(self.sockets):
            pus = self.pus(s)
            out.append(
                f'    <object type="Package" os_index="{s}" {sets(pus, [s])} gp_index="{ids()}">\n'
            )
            out.append(
                info(
                    "      ",
                    [
                        ("CPUVendor", "GenuineIntel"),
                        ("CPUFamilyNumber", "6"),
                        ("CPUModelNumber", "106"),
                        ("CPUModel", "Intel(R) Xeon(R) Gold 6342 CPU @ 2.80GHz"),
                        ("CPUStepping", "6"),
                    ],
                )
            )
            out.append(
                f'      <object type="NUMANode" os_index="{s}" {sets(pus, [s])} gp_index="{ids()}" '
                'local_memory="270081982464">\n'
                '        <page_type size="4096" count="65938960"/>\n'
                '        <page_type size="2097152" count="0"/>\n'
                '        <page_type size="1073741824" count="0"/>\n'
                "      </object>\n"
            )
            out.append(
                f'      <object type="L3Cache" os_index="{s}" {sets(pus, [s])} gp_index="{ids()}" '
                'cache_size="37748736" depth="3" cache_linesize="64" cache_associativity="12" '
                'cache_type="0">\n'
            )
            for c in range(CORES):
                first = s * CORES + c
                threads = [first] + ([self.sockets * CORES + first] if self.smt else [])
                out.append(
                    f'        <object type="Core" os_index="{c}" {sets(threads, [s])} '
                    f'gp_index="{ids()}">\n'
                )
                for t in threads:
                    out.append(
                        f'          <object type="PU" os_index="{t}" {sets([t], [s])} '
                        f'gp_index="{ids()}"/>\n'
                    )
                out.append("        </object>\n")
            out.append("      </object>\n")
            out.extend(self.io[s])
            out.append("    </object>\n")
        out.append("  </object>\n</topology>\n")
        return "".join(out)


def dual_socket_2gpu_2nic():
    h = Host("cbf-node01", 2)
    h.chipset()
    h.switch(0, 0x16, [h.gpu("0000:19:00.0", 0, 0), h.cx6(0x1A, 1, 0)])
    h.switch(1, 0x97, [h.gpu("0000:9a:00.0", 1, 1), h.cx6(0x9B, 2, 2)])
    return h


def dual_socket_gpu_nic_apart():
    h = Host("cbf-node02", 2)
    h.chipset()
    h.switch(0, 0x16, [h.gpu("0000:19:00.0", 0, 0)])
    h.switch(1, 0x97, [h.cx6(0x9A, 2, 0)])
    return h


def dual_socket_2gpu_1nic():
    h = Host("cbf-node03", 2)
    h.chipset()
    h.switch(0, 0x16, [h.gpu("0000:19:00.0", 0, 0), h.cx6(0x1A, 1, 0)])
    h.switch(1, 0x97, [h.gpu("0000:9a:00.0", 1, 1)])
    return h


def single_socket_2root():
    h = Host("cbf-node04", 1)
    h.switch(0, 0x40, [h.gpu("0000:43:00.0", None, 0)])
    h.switch(0, 0xC0, [h.cx6(0xC3, 1, 0)])
    return h


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/hwloc"
    os.makedirs(out, exist_ok=True)
    for name, make in [
        ("dual-socket-2gpu-2nic.xml", dual_socket_2gpu_2nic),
        ("dual-socket-gpu-nic-apart.xml", dual_socket_gpu_nic_apart),
        ("dual-socket-2gpu-1nic.xml", dual_socket_2gpu_1nic),
        ("single-socket-2root.xml", single_socket_2root),
    ]:
        with open(os.path.join(out, name), "w") as f:
            f.write(make().xml())


if __name__ == "__main__":
    main()
