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

/// Inverse of [`pack`], sign-extending: the oracle's decode step. Samples past the end of
/// `packed` read as zero.
pub fn unpack(packed: &[u8], bits: u32, out: &mut [i32]) {
    // Eight samples fill `bits` whole bytes: whole groups by width-specialised code, the rest
    // (and any other width) bit by bit.
    let groups = match bits {
        2 => unpack_groups::<2>(packed, out),
        3 => unpack_groups::<3>(packed, out),
        4 => unpack_groups::<4>(packed, out),
        5 => unpack_groups::<5>(packed, out),
        6 => unpack_groups::<6>(packed, out),
        7 => unpack_groups::<7>(packed, out),
        8 => unpack_groups::<8>(packed, out),
        9 => unpack_groups::<9>(packed, out),
        10 => unpack_groups::<10>(packed, out),
        12 => unpack_groups::<12>(packed, out),
        16 => unpack_groups::<16>(packed, out),
        _ => 0,
    };
    unpack_bits(
        &packed[groups * bits as usize..],
        bits,
        &mut out[groups * 8..],
    );
}

/// Unpack whole groups of eight `B`-bit samples (B bytes each) while both `packed` and `out`
/// hold one; returns the number of groups. A group is read as one big-endian integer, so each
/// sample is a shift of it by a constant: the compiler unrolls the eight.
#[inline(always)]
fn unpack_groups<const B: usize>(packed: &[u8], out: &mut [i32]) -> usize {
    let groups = (packed.len() / B).min(out.len() / 8);
    for (src, dst) in packed
        .chunks_exact(B)
        .zip(out.chunks_exact_mut(8))
        .take(groups)
    {
        let mut be = [0u8; 16];
        be[..B].copy_from_slice(src);
        let group = u128::from_be_bytes(be);
        for (i, o) in dst.iter_mut().enumerate() {
            *o = (((group << (i * B)) as i128) >> (128 - B)) as i32;
        }
    }
    groups
}

/// [`unpack`] one sample at a time, for any width up to 32 bits.
fn unpack_bits(packed: &[u8], bits: u32, out: &mut [i32]) {
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

        /// Any count (whole groups of eight and a ragged rest, a partial last byte), and more
        /// samples asked for than were packed: those read as zero.
        #[test]
        fn any_count_unpacks_with_zeros_past_the_end(bits in prop::sample::select(vec![2u32,3,4,5,6,7,8,9,10,12,16]), raw in prop::collection::vec(any::<i32>(), 0..80), extra in 0usize..20) {
            let lo = -(1i32 << (bits - 1));
            let hi = (1i32 << (bits - 1)) - 1;
            let samples: Vec<i32> = raw.iter().map(|&v| lo + (v.rem_euclid(hi - lo + 1))).collect();
            let packed = pack_bitwise(&samples, bits);
            let mut back = vec![0x5a5a_5a5a; samples.len() + extra];
            unpack(&packed, bits, &mut back);
            prop_assert_eq!(&back[..samples.len()], &samples[..]);
            prop_assert!(back[samples.len()..].iter().all(|&v| v == 0));
        }
    }
}
