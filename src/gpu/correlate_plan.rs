//! What one correlator plan is built for ([`CorrConfig`]) and which of its stagings the
//! `wgmma` kernel takes (`gpu::correlate` compiles and runs it): the path ([`CorrPath`]), the
//! padding of antenna-pols and times to whole tiles, the merging of short heaps into groups,
//! whether the corner turn is fused into the kernel or rides in its launch, and the shapes it
//! refuses ([`CorrError`]).

use cudarc::driver::DriverError;

use super::{Gpu, GpuError};
use crate::dsp::correlate::CorrShape;

/// Which correlator kernel a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorrPath {
    /// Warp-level `mma.sync` (`kernels/correlate_mma.cu`): any sm_80 and later device.
    Mma,
    /// Warpgroup `wgmma` (`kernels/correlate_wgmma.cu`): sm_90 devices only (sm_90a code).
    Wgmma,
}

impl CorrPath {
    /// The fastest path `gpu` runs: `wgmma` exists only on sm_90 (the `a` features are not
    /// carried forward to later architectures).
    pub fn best_for(gpu: &Gpu) -> CorrPath {
        if gpu.arch == "sm_90" {
            CorrPath::Wgmma
        } else {
            CorrPath::Mma
        }
    }

    /// Times per step of the kernel's main loop: rows are padded to a multiple of it.
    pub(super) fn kstep(self) -> usize {
        match self {
            CorrPath::Mma => 64,
            CorrPath::Wgmma => 128,
        }
    }

    /// Antenna-pols per (column) tile: the antenna-pol axis is padded to a multiple of it.
    pub(super) fn tile(self) -> usize {
        match self {
            CorrPath::Mma => 64,
            CorrPath::Wgmma => 128,
        }
    }
}

/// The largest padded antenna-pol count the `wgmma` path fuses its corner turn at (two column
/// tiles: up to 128 antennas; see [`CorrConfig::can_fuse`]). Measured fused at every N
/// (bench/correlator-notes.md v14): faster than turn + correlator up to 128 antennas (1.77× at
/// 64, 1.41× at 128), mixed at 256 (1.07× at 3072 times, 0.89–0.95× at longer rows), slower at
/// 576 (0.70–0.80×), where the splitters' de-interleave, not the copies, sets the pace.
const FUSE_MAX_NP: usize = 256;
/// The largest planar rows of one (batch group, channel) at which the turn rides in the
/// `wgmma` launch ([`CorrConfig::can_ride`]) below 512 antennas ([`RIDE_MAX_ROWS_LARGE`] from
/// 512 on). Measured against
/// the separate pass (bench/correlator-notes.md v15, lent H100): faster at 256 antennas × 3072
/// times (3 MiB: 1.12×), 576 × 3072 (7 MiB: 1.09×), 1024 × 3072 (12 MiB: 1.07×) and 576 ×
/// 12288 (27 MiB: 1.22×); slower at 256 × 12288 (12 MiB: 0.89×), 256 × 49152 (48 MiB: 0.86×)
/// and 576 × 49152 (108 MiB: 0.86×), where the correlator's own DRAM traffic (the channel's
/// rows no longer held in L2, at 256 antennas the accumulators) leaves the turn no room.
const RIDE_MAX_ROWS: usize = 8 << 20;
/// The shortest rows (times per batch group) at which the turn rides: the XB-engine's chunks
/// of four 256-spectrum heaps (rows of 1024 times, eight steps) correlated 4–18 % slower with
/// it (256, 576 and 1024 antennas; bench/correlator-notes.md v15), rows of 3072 times and more
/// faster.
const RIDE_MIN_TIMES: usize = 3072;
/// [`RIDE_MAX_ROWS`] from 512 antennas on (576 × 12288 times, 27 MiB, rode 1.22× faster).
const RIDE_MAX_ROWS_LARGE: usize = 32 << 20;
/// Times summed in int32 before they are added to int64 (|product| ≤ 128², so each real
/// product sum stays below 2³¹ for up to 131072 times; half of that keeps a margin): inside the
/// mma kernel, and per launch of the wgmma kernel.
pub(super) const WINDOW: usize = 65536;
/// The longest planar row (times) a call's batches are merged into (a million: 128 heaps of
/// 8192 spectra; katgpucbf's chunks are 32 heaps of 256).
const MAX_ROW_TIMES: usize = 1 << 20;
/// CUDA's grid limit on y and z.
const GRID_YZ: usize = 65535;

#[derive(Debug, thiserror::Error)]
pub enum CorrError {
    #[error("correlator shape: {what} = {value} is out of range ({why})")]
    Shape {
        what: &'static str,
        value: usize,
        why: &'static str,
    },
    #[error("correlator buffer {buffer}: {len} elements, expected {expected}")]
    Buffer {
        buffer: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("the wgmma correlator needs an sm_90 device (H100, H200); this one is {arch}")]
    Unsupported { arch: String },
    #[error("this correlator plan turns the chunk inside the wgmma kernel (fused or riding): no separate turn pass (build it with_turn)")]
    NoTurn,
    #[error("the wgmma correlator reads its input itself (a TMA tensor map, or the riding turn's 16-byte loads), which needs a 16-byte aligned address: input at device address {address:#x} is not")]
    Misaligned { address: u64 },
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl From<DriverError> for CorrError {
    fn from(e: DriverError) -> CorrError {
        CorrError::Gpu(GpuError::Driver(e))
    }
}

impl From<CorrError> for GpuError {
    fn from(e: CorrError) -> GpuError {
        match e {
            CorrError::Gpu(g) => g,
            other => GpuError::Backend(other.to_string()),
        }
    }
}

/// What one correlator plan is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorrConfig {
    pub shape: CorrShape,
    /// Batches per call (heaps of one timestamp from every antenna each).
    pub batches: usize,
    /// 8 (int8 re, im) or 4 (one byte per complex value).
    pub in_bits: u32,
    pub path: CorrPath,
}

impl CorrConfig {
    /// Input bytes of one call.
    pub fn input_bytes(&self) -> usize {
        self.shape.input_len() * self.batches * self.in_bits as usize / 8
    }

    /// int64 accumulators of one call (all batches).
    pub fn acc_len(&self) -> usize {
        self.shape.vis_len() * self.batches
    }

    /// Antenna-pols after padding to whole tiles.
    pub(super) fn np(&self) -> usize {
        (2 * self.shape.n_ants).div_ceil(self.path.tile()) * self.path.tile()
    }

    /// Batches merged in time into one planar row set and one accumulator (see
    /// `kernels/correlate_turn.cu`): all of the call's, so that a block sums the whole call's
    /// times of its tile before it adds them into int64 once. The accumulators' read-modify-
    /// write is then paid once per call instead of once per batch (at katgpucbf's 32 heaps per
    /// chunk it was 32 times the traffic, and it bounded the call: bench/correlator-notes.md
    /// v8). Rows longer than [`MAX_ROW_TIMES`] fall back to the count up to one time step's
    /// worth that wastes the least padding.
    pub fn group(&self) -> usize {
        let (s, k) = (self.shape.spectra, self.path.kstep());
        if self.batches * s <= MAX_ROW_TIMES {
            return self.batches;
        }
        let waste = |g: usize| (g * s).div_ceil(k) * k * 1000 / (g * s);
        (1..=self.batches.min(k.div_ceil(s)))
            .min_by_key(|&g| (waste(g), g))
            .unwrap_or(1)
    }

    /// Whether the `wgmma` kernel stages the chunk itself (`FUSED` in
    /// `kernels/correlate_wgmma.cu`): 8-bit input whose heaps are whole steps of 128 spectra
    /// (a step's tensor copies never straddle two batches), and at most [`FUSE_MAX_NP`]
    /// antenna-pols, where the corner turn's own pass costs more than the fused producer's
    /// de-interleave (at N = 64 the fused call took 0.27 ms against 0.47 for turn +
    /// correlator, bench/correlator-notes.md v14). Elsewhere the corner turn runs first.
    pub fn can_fuse(&self) -> bool {
        self.path == CorrPath::Wgmma
            && self.in_bits == 8
            && self.shape.spectra % CorrPath::Wgmma.kstep() == 0
            && self.np() <= FUSE_MAX_NP
    }

    /// Whether the `wgmma` kernel turns the chunk itself as it runs (`RIDE` in
    /// `kernels/correlate_wgmma_ride.cuh`: turner warps write the planar rows through global
    /// memory ahead of the items, so the turn's DRAM traffic shares the correlator's launch
    /// instead of following it): 8-bit input in heaps of a multiple of 16 spectra (a turner
    /// lane's 16 times lie in one batch), beyond [`FUSE_MAX_NP`], rows of at least
    /// [`RIDE_MIN_TIMES`] and a channel's planar rows within [`RIDE_MAX_ROWS`] (or
    /// [`RIDE_MAX_ROWS_LARGE`] from 512 antennas), where it measured faster than the separate
    /// pass. Elsewhere the separate pass runs.
    pub fn can_ride(&self) -> bool {
        let rows = 2 * self.np() * self.tpad();
        self.ride_allowed()
            && self.tpad() >= RIDE_MIN_TIMES
            && (rows <= RIDE_MAX_ROWS || (self.shape.n_ants >= 512 && rows <= RIDE_MAX_ROWS_LARGE))
    }

    /// Whether the riding turn's kernel takes this plan at all (what [`Self::can_ride`] asks
    /// before the sizes).
    pub fn ride_allowed(&self) -> bool {
        self.path == CorrPath::Wgmma
            && self.in_bits == 8
            && self.shape.spectra % 16 == 0
            && self.np() > FUSE_MAX_NP
    }

    /// How far the riding turn may run ahead, in work items (column tile pairs of a channel)
    /// beyond the items taken: four channels' (bench/correlator-notes.md v15).
    pub(super) fn turn_ahead(&self) -> i32 {
        (4 * self.tile_pairs()).min(i32::MAX as usize) as i32
    }

    /// (Column tile, row tile) pairs of the triangle per channel and batch group: the mma
    /// kernel's blocks, the wgmma kernel's work items.
    pub(super) fn tile_pairs(&self) -> usize {
        let tiles = self.np() / self.path.tile();
        tiles * (tiles + 1) / 2
    }

    /// Groups of batches in `n` batches.
    pub(super) fn groups(&self, n: usize) -> usize {
        n.div_ceil(self.group())
    }

    /// Times per planar row (a group's) after padding to whole steps.
    pub(super) fn tpad(&self) -> usize {
        (self.group() * self.shape.spectra).div_ceil(self.path.kstep()) * self.path.kstep()
    }

    /// Bytes of the planar scratch buffer: Re and Im rows of every padded antenna-pol.
    pub fn planar_bytes(&self) -> usize {
        self.groups(self.batches) * self.shape.channels * 2 * self.np() * self.tpad()
    }

    pub(super) fn validate(&self) -> Result<(), CorrError> {
        let bad = |what, value, why| Err(CorrError::Shape { what, value, why });
        let s = self.shape;
        if !(1..=4096).contains(&s.n_ants) {
            return bad("n_ants", s.n_ants, "1 to 4096");
        }
        if !(1..=GRID_YZ).contains(&s.channels) {
            return bad("channels", s.channels, "1 to 65535");
        }
        if !(1..=GRID_YZ).contains(&self.batches) {
            return bad("batches", self.batches, "1 to 65535");
        }
        if s.spectra == 0 || self.tpad() > i32::MAX as usize / 2 {
            return bad("spectra", s.spectra, "1 to 2^30");
        }
        if self.in_bits != 8 && self.in_bits != 4 {
            return bad("in_bits", self.in_bits as usize, "8 or 4");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n_ants: usize, spectra: usize, in_bits: u32) -> CorrConfig {
        CorrConfig {
            shape: CorrShape {
                n_ants,
                channels: 120,
                spectra,
            },
            batches: 1,
            in_bits,
            path: CorrPath::Wgmma,
        }
    }

    /// The stagings at the sizes measured in bench/correlator-notes.md v14–v15: each where it
    /// was the fastest, the separate pass elsewhere.
    #[test]
    fn each_size_gets_the_staging_that_measured_fastest() {
        let fused = [(64, 3072), (128, 12288)];
        let ride = [(256, 3072), (576, 3072), (1024, 3072), (576, 12288)];
        let apart = [
            (256, 12288),
            (256, 49152),
            (576, 49152),
            (576, 256),
            (1024, 256),
            (576, 33),
            (80, 32),
        ];
        for (n, t) in fused {
            assert!(
                plan(n, t, 8).can_fuse() && !plan(n, t, 8).can_ride(),
                "{n} × {t}"
            );
        }
        for (n, t) in ride {
            assert!(
                !plan(n, t, 8).can_fuse() && plan(n, t, 8).can_ride(),
                "{n} × {t}"
            );
        }
        for (n, t) in apart {
            assert!(
                !plan(n, t, 8).can_fuse() && !plan(n, t, 8).can_ride(),
                "{n} × {t}"
            );
        }
        // 4-bit input is always expanded by the separate pass.
        assert!(!plan(64, 3072, 4).can_fuse() && !plan(576, 3072, 4).can_ride());
        // The mma path has no staging of its own.
        let mma = CorrConfig {
            path: CorrPath::Mma,
            ..plan(576, 3072, 8)
        };
        assert!(!mma.can_fuse() && !mma.can_ride());
    }
}
