//! Digitiser samples: big-endian bit-packed signed integers (seed 000 §Decode), `bits` bits
//! each, two's complement, concatenated most significant bit first with no padding. [`unpack`]
//! is the decode step of the F-engine (the oracle for the GPU's fused decode); [`pack`] is
//! what dsim sends.
#![deny(unsafe_code)]

/// Sample widths a digitiser heap may carry (katgpucbf `--sample-bits`).
pub fn valid_sample_bits(bits: u32) -> bool {
    (2..=10).contains(&bits) || bits == 12 || bits == 16
}

/// Bytes for `n` samples of `bits` bits (`n·bits` must be a multiple of 8).
pub fn packed_len(n: usize, bits: u32) -> usize {
    n * bits as usize / 8
}

/// Pack `samples` (each within the signed range of `bits`) into `out`
/// (`packed_len(samples.len(), bits)` bytes). Values are masked to `bits`, never checked:
/// the caller quantised them.
pub fn pack(samples: &[i32], bits: u32, out: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut o = 0;
    for &s in samples {
        acc = (acc << bits) | (s as u64 & mask);
        have += bits;
        while have >= 8 {
            have -= 8;
            out[o] = (acc >> have) as u8;
            o += 1;
        }
    }
    if have > 0 {
        out[o] = (acc << (8 - have)) as u8;
    }
}

/// Inverse of [`pack`], sign-extending: the oracle's decode step.
pub fn unpack(packed: &[u8], bits: u32, out: &mut [i32]) {
    let mut acc: u64 = 0;
    let mut have = 0u32;
    let mut bytes = packed.iter();
    let shift = 64 - bits;
    for o in out.iter_mut() {
        while have < bits {
            acc = (acc << 8) | u64::from(*bytes.next().unwrap_or(&0));
            have += 8;
        }
        have -= bits;
        let raw = (acc >> have) << shift;
        *o = ((raw as i64) >> shift) as i32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: build the bit string explicitly, one bit at a time.
    fn pack_bitwise(samples: &[i32], bits: u32) -> Vec<u8> {
        let mut bitstring = Vec::new();
        for &s in samples {
            for b in (0..bits).rev() {
                bitstring.push(((s >> b) & 1) as u8);
            }
        }
        bitstring
            .chunks(8)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u8, |a, (i, &b)| a | (b << (7 - i)))
            })
            .collect()
    }

    #[test]
    fn ten_bit_example() {
        // -1 (0x3ff), 1, -512 (0x200), 511 (0x1ff): 1111111111 0000000001 1000000000 0111111111
        let mut out = [0u8; 5];
        pack(&[-1, 1, -512, 511], 10, &mut out);
        assert_eq!(out, [0xff, 0xc0, 0x18, 0x01, 0xff]);
    }

    proptest! {
        #[test]
        fn matches_bitwise_and_round_trips(bits in prop::sample::select(vec![2u32,3,4,5,6,7,8,9,10,12,16]), raw in prop::collection::vec(any::<i32>(), 8..64)) {
            let n = raw.len() / 8 * 8;
            let lo = -(1i32 << (bits - 1));
            let hi = (1i32 << (bits - 1)) - 1;
            let samples: Vec<i32> = raw[..n].iter().map(|&v| lo + (v.rem_euclid(hi - lo + 1))).collect();
            let mut out = vec![0xa5u8; packed_len(n, bits)];
            pack(&samples, bits, &mut out);
            prop_assert_eq!(&out, &pack_bitwise(&samples, bits));
            let mut back = vec![0i32; n];
            unpack(&out, bits, &mut back);
            prop_assert_eq!(back, samples);
        }
    }
}
