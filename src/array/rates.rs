//! Data rates of each engine's streams, from the stream formats (facts §1.2–§1.5, §1.9): what
//! the plan checks against NIC speeds and PCIe links.
//!
//! Payload rates are exact for the formats; wire rates add per-packet headers: the SPEAD
//! preamble (header and item pointers; `repeat_pointers` puts every immediate in every
//! packet) and [`WIRE_OVERHEAD`] bytes of UDP, IPv4 and Ethernet framing. Descriptors (a few
//! hundred bytes every 5 s) are left out.
//!
//! - Digitiser: `adc × bits` per polarisation, one packet per heap of 4096 samples (5120 B at
//!   10 bits) with a 72 B preamble (8 item pointers).
//! - F-engine output: a real input of `adc` samples/s gives `adc / (2·channels)` spectra/s of
//!   `channels` complex values per polarisation, 8+8 bits each: `adc × 16` bits/s per
//!   antenna whatever the channel count, in 8192 B packets with a 72 B preamble.
//! - XB-engine input: every antenna's share `cps / channels` of that.
//! - Correlation products: per dump, `n(n+1)/2` baselines × 4 products × 8 B (int32 re, im) ×
//!   `cps` channels (facts §1.9: 80 antennas, 128 channels → 12.66 MiB), 64 B preamble.
//! - Beam: `cps` channels × `adc / (2·channels)` spectra/s × 2 B (int8 re, im), 72 B preamble.
#![deny(unsafe_code)]

use serde::Serialize;

/// UDP (8), IPv4 (20), Ethernet header (14) and FCS (4), preamble (8) and gap (12), bytes.
pub const WIRE_OVERHEAD: f64 = 66.0;
/// Payload bytes of an F, X or beam packet (katgpucbf's `--send-packet-payload` 8192).
pub const PACKET_PAYLOAD: f64 = 8192.0;
/// Samples per digitiser heap (one packet).
pub const DIGITISER_HEAP_SAMPLES: f64 = 4096.0;
/// SPEAD preambles: digitiser, F and beam packets carry 8 item pointers, X packets 7.
pub const PREAMBLE_72: f64 = 72.0;
pub const PREAMBLE_64: f64 = 64.0;

/// A stream's rates: payload (what crosses PCIe) and on the wire, bits per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rate {
    pub payload_bps: f64,
    pub wire_bps: f64,
}

impl Rate {
    fn packets(payload_bps: f64, packet_payload: f64, preamble: f64) -> Rate {
        Rate {
            payload_bps,
            wire_bps: payload_bps * (packet_payload + preamble + WIRE_OVERHEAD) / packet_payload,
        }
    }

    pub fn plus(self, other: Rate) -> Rate {
        Rate {
            payload_bps: self.payload_bps + other.payload_bps,
            wire_bps: self.wire_bps + other.wire_bps,
        }
    }
}

/// One antenna's digitiser stream, both polarisations.
pub fn digitiser(adc_sample_rate: f64, bits: u32) -> Rate {
    let packet = DIGITISER_HEAP_SAMPLES * f64::from(bits) / 8.0;
    Rate::packets(adc_sample_rate * f64::from(bits) * 2.0, packet, PREAMBLE_72)
}

/// One F-engine's wideband output (8-bit), over all its destinations.
pub fn fengine_output(adc_sample_rate: f64) -> Rate {
    Rate::packets(adc_sample_rate * 16.0, PACKET_PAYLOAD, PREAMBLE_72)
}

/// One XB-engine's input: `n_ants` F-engines' share `cps / channels` each.
pub fn xengine_input(adc_sample_rate: f64, n_ants: usize, cps: usize, channels: usize) -> Rate {
    let share = cps as f64 / channels as f64;
    Rate::packets(
        fengine_output(adc_sample_rate).payload_bps * n_ants as f64 * share,
        PACKET_PAYLOAD,
        PREAMBLE_72,
    )
}

/// Bytes of one correlation-product heap (one dump of one XB-engine).
pub fn corrprod_heap_bytes(n_ants: usize, cps: usize) -> f64 {
    let baselines = (n_ants * (n_ants + 1) / 2) as f64;
    baselines * 4.0 * 8.0 * cps as f64
}

/// One XB-engine's correlation products, one heap per dump of `dump_seconds`.
pub fn corrprod(n_ants: usize, cps: usize, dump_seconds: f64) -> Rate {
    Rate::packets(
        corrprod_heap_bytes(n_ants, cps) * 8.0 / dump_seconds,
        PACKET_PAYLOAD,
        PREAMBLE_64,
    )
}

/// One single-polarisation beam from one XB-engine.
pub fn beam(adc_sample_rate: f64, cps: usize, channels: usize) -> Rate {
    let spectra_per_s = adc_sample_rate / (2.0 * channels as f64);
    Rate::packets(
        cps as f64 * spectra_per_s * 16.0,
        PACKET_PAYLOAD,
        PREAMBLE_72,
    )
}

/// PCIe bandwidth per direction in bytes per second: the lanes' signalling rate less the line
/// code (8b/10b up to gen 2, 128b/130b from gen 3; gen 6's FLIT overhead is taken as gen 5's
/// code). `None` for a generation this does not know.
pub fn pcie_bytes_per_s(generation: u32, width: u32) -> Option<f64> {
    let (gt_per_s, code) = match generation {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 128.0 / 130.0),
        _ => return None,
    };
    Some(gt_per_s * 1e9 * code / 8.0 * f64::from(width))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    /// The facts file's figures, computed there from katgpucbf's formats: fsim's rate per
    /// destination `adc·2·8·ants·cps/channels` = 34.24 Gb/s at 80 antennas, 32768 channels,
    /// 512 per substream; an X heap of 80 antennas, 8192 channels, 64 engines = 12.66 MiB.
    #[test]
    fn rates_match_the_facts_figures() {
        let x = xengine_input(1712e6, 80, 512, 32768);
        assert!(close(x.payload_bps, 34.24e9, 1e-9), "{x:?}");
        let mib = corrprod_heap_bytes(80, 8192 / 64) / (1 << 20) as f64;
        assert!(close(mib, 12.66, 1e-3), "{mib}");
        // A 10-bit L-band antenna: 1712e6 × 10 × 2 = 34.24 Gb/s of samples (the dsim CLI's
        // "34 Gb/s"), 5120 B packets.
        let d = digitiser(1712e6, 10);
        assert!(close(d.payload_bps, 34.24e9, 1e-12));
        assert!(close(
            d.wire_bps / d.payload_bps,
            (5120.0 + 72.0 + 66.0) / 5120.0,
            1e-12
        ));
    }

    /// An F-engine's output does not depend on the channel count: the X-engines' inputs of one
    /// band add up to the F-engines' outputs.
    #[test]
    fn fx_rates_balance() {
        let (ants, ch, x) = (64, 4096, 16);
        let all_x: f64 = (0..x)
            .map(|_| xengine_input(856e6, ants, ch / x, ch).payload_bps)
            .sum();
        assert!(close(
            all_x,
            ants as f64 * fengine_output(856e6).payload_bps,
            1e-12
        ));
    }

    #[test]
    fn pcie() {
        // Gen 3 × 16 ≈ 15.75 GB/s, gen 4 × 16 ≈ 31.5 GB/s per direction.
        assert!(close(pcie_bytes_per_s(3, 16).unwrap(), 15.754e9, 1e-3));
        assert!(close(pcie_bytes_per_s(4, 16).unwrap(), 31.508e9, 1e-3));
        assert_eq!(pcie_bytes_per_s(9, 16), None);
    }
}
