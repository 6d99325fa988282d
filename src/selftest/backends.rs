//! The harness both F-engine backend comparisons (wideband in `fengine`, narrowband in
//! `narrowband`) share: the heaps' back-end inputs, one chunk driven through a backend as the
//! pipeline drives it, and the heaps' bytes as values.

use num_complex::Complex32;

use crate::dsp::postproc::{OutputBits, SpectrumDelay};
use crate::fengine::backend::{BackEndInput, Backend, ChunkInput};
use crate::gpu::GpuError;

/// A heap as a backend hands it back: bytes, clip counts, digitiser power.
pub type Heap = (Vec<u8>, [u64; 2], [i64; 2]);

/// One chunk through backend `b`: heap h's spectra (window starts `st[p][h·hs + k]`) through
/// the front end, then its back end, taking finished heaps whenever the backend is not ready;
/// every heap, in order.
pub fn drive(
    b: &mut dyn Backend,
    chunk: ChunkInput<'_>,
    inputs: &[BackEndInput<'_>],
    st: &[Vec<usize>; 2],
    hs: usize,
) -> Result<Vec<Heap>, GpuError> {
    let take = |b: &mut dyn Backend, got: &mut Vec<Heap>| -> Result<bool, GpuError> {
        Ok(match b.finished(true)? {
            Some(f) => {
                let data = f.data.host().ok_or_else(|| {
                    GpuError::Backend("the heap was left in device memory".into())
                })?;
                got.push((data.to_vec(), f.clips, f.power));
                true
            }
            None => false,
        })
    };
    let mut got = Vec::new();
    b.load(chunk)?;
    for (h, input) in inputs.iter().enumerate() {
        for k in 0..hs {
            b.front_end(0, st[0][h * hs + k], k)?;
            b.front_end(1, st[1][h * hs + k], k)?;
        }
        while !b.ready() {
            if !take(&mut *b, &mut got)? {
                return Err(GpuError::Backend("not ready, nothing in flight".into()));
            }
        }
        b.back_end(input)?;
    }
    b.release()?;
    while take(&mut *b, &mut got)? {}
    Ok(got)
}

/// Every heap's back-end input: gains `gains[0]`, except heap 2, which has `gains[1]` (a change
/// for one heap and back: each heap of a batch has its own), the heap's delays and timestamps.
pub fn heap_inputs<'a>(
    gains: [&'a [Vec<Complex32>; 2]; 2],
    delays: &'a [Vec<SpectrumDelay>; 2],
    ts: &'a [Vec<i64>],
    hs: usize,
    dither: Option<u64>,
) -> Vec<BackEndInput<'a>> {
    (0..ts.len())
        .map(|h| {
            let g = gains[usize::from(h == 2)];
            BackEndInput {
                gains: [&g[0], &g[1]],
                gains_version: h.min(3).saturating_sub(1) as u64,
                delays: [
                    &delays[0][h * hs..(h + 1) * hs],
                    &delays[1][h * hs..(h + 1) * hs],
                ],
                timestamps: &ts[h],
                dither,
            }
        })
        .collect()
}

/// The same chunk and heaps through the GPU and the CPU backend ([`drive`]); every heap must
/// come back from both.
pub fn drive_both(
    gpu_b: &mut dyn Backend,
    cpu_b: &mut dyn Backend,
    chunk: ChunkInput<'_>,
    inputs: &[BackEndInput<'_>],
    st: &[Vec<usize>; 2],
    hs: usize,
) -> Result<[Vec<Heap>; 2], GpuError> {
    let got = [
        drive(gpu_b, chunk, inputs, st, hs)?,
        drive(cpu_b, chunk, inputs, st, hs)?,
    ];
    if got.iter().any(|g| g.len() != inputs.len()) {
        return Err(GpuError::Backend(format!(
            "heaps back: GPU {}, CPU {}, of {}",
            got[0].len(),
            got[1].len(),
            inputs.len()
        )));
    }
    Ok(got)
}

/// A heap's bytes as signed values (4-bit: two per byte, real first).
pub fn values(bits: OutputBits, d: &[u8]) -> Vec<i32> {
    match bits {
        OutputBits::Eight => d.iter().map(|&b| i32::from(b as i8)).collect(),
        OutputBits::Four => d
            .iter()
            .flat_map(|&b| [i32::from((b as i8) >> 4), i32::from(((b << 4) as i8) >> 4)])
            .collect(),
    }
}
