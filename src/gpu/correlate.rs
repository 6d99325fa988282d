//! The X-engine correlator on the GPU (issue 12; seed 001 §Implementation details of
//! tensor-core correlator, §Accumulation): the CUDA body of `dsp::correlate`.
//!
//! **Input** (`correlate`): `batches` consecutive batches, each in `dsp::correlate`'s layout,
//! **(antenna, channel, spectrum, pol, re/im)**: int8 (one byte per real part; −128 is legal and
//! exact, since the planar scheme negates nothing) or, with `in_bits = 4`, one byte per complex
//! value with the real part in the high nibble (sign-extended to int8 by the corner turn).
//! **Accumulators**: int64, `batches × dsp CorrShape::vis_len()`, layout (batch, channel,
//! baseline, product, re/im) with katgpucbf's baseline order; the call's batches are taken in
//! groups of [`CorrConfig::group`] consecutive ones (all of them unless the rows would be
//! very long), and group *j* **adds** into accumulator *j* (never overwrites): seed
//! 001 keeps the batches of a chunk race-free with one accumulator per batch, and a group is
//! summed by one block. Only the reduce's sum over every accumulator is the contract's result.
//! **Reduce** ([`Correlator::reduce`]): the sum of the `batches` accumulators saturated to
//! ±(2³¹ − 1) as int32 (**overwrites** `out`, same layout without the batch axis), the clipped
//! re and im parts counted into `clips` (**overwritten**), and (−2³¹, 1) in every baseline
//! touching an antenna whose presence flag is 0; optionally clears the accumulators as it reads.
//!
//! Each call runs on the compute stream. Where the turn is neither fused nor riding (see
//! below), the corner turn (`kernels/correlate_turn.cu`) first writes a planar, time-major copy
//! of the chunk into a scratch buffer the plan owns (as large as the 8-bit input, padded to
//! whole tiles; read and written, 2 bytes moved per input byte). Then
//! the correlator adds its tiles into the accumulators: on an
//! sm_90 device (H100, H200) the warpgroup-MMA kernel (`kernels/correlate_wgmma.cu`, compiled
//! for sm_90a: a persistent grid of two-block clusters taking items from a counter, the
//! diagonal's lower triangle not computed, the planar rows in a tiled,
//! pre-swizzled order staged by bulk asynchronous copies, the column tile multicast to both
//! blocks), elsewhere the portable warp-level `mma.sync` one (`kernels/correlate_mma.cu`, any
//! sm_80 and later device; compiled for sm_90 it adds its tiles by bulk asynchronous
//! reduce-adds and fits three blocks per SM, bench/correlator-notes.md v12).
//! [`CorrPath::best_for`] picks it from the device. On the `wgmma` path with up to 128
//! antennas (8-bit input, heaps of a multiple of 128 spectra) no corner turn runs: the kernel's
//! producer warpgroup copies the chunk's runs into its stages by TMA tensor copies (through a
//! [`TensorMap`] of the chunk) and de-interleaves them there ([`CorrConfig::can_fuse`]; at
//! N = 64 the call takes 0.27 ms instead of 0.47). Beyond 128 antennas, in rows of 3072 times
//! or more, the turn rides in the `wgmma` kernel's launch where that measured faster
//! ([`CorrConfig::can_ride`]; not the XB-engine's chunks of 1024-time rows): turner warps
//! write the planar rows through global memory a few channels ahead of the items, so the
//! turn's DRAM traffic overlaps the multiplications (576 antennas × 12288 times: 6.4 ms
//! instead of 7.8).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::compile::{Defines, Kernel};
use super::correlate_plan::WINDOW;
pub use super::correlate_plan::{CorrConfig, CorrError, CorrPath};
use super::Gpu;
use crate::dsp::correlate::n_baselines;

mod launch;

/// Shared-memory stages of the `wgmma` kernel (48 KiB each; 3 measured 10–15 % slower at
/// N = 576, bench/correlator-notes.md v7), its epilogue's staging (4 KiB per consumer warp) and
/// the alignment slack: 225 KiB of the 227 KiB a block may have.
const WGMMA_STAGES: usize = 4;
const WGMMA_SMEM: usize = WGMMA_STAGES * 384 * 128 + 32 * 1024 + 1024;
/// Threads of a `wgmma` block: two consumer warpgroups and a producer warp (bulk copies of
/// the corner turn's rows) or a producer warpgroup (fused: a copier warp, three splitters;
/// riding: the producer warp and three turners).
fn wgmma_threads(warpgroup: bool) -> u32 {
    if warpgroup {
        384
    } else {
        288
    }
}
/// The planar scratch buffer the correlator reads and what writes it.
struct CornerTurn {
    planar: CudaSlice<i8>,
    by: TurnBy,
}

/// Who turns the chunk into the planar rows.
enum TurnBy {
    /// A separate pass before the correlator (`kernels/correlate_turn.cu`).
    Pass(CudaFunction),
    /// The correlator's own turner warps (`CorrConfig::can_ride`), counting in `progress`,
    /// zeroed before each launch: the next unit, then units done per batch group and channel.
    /// A unit is turned at most `ahead` work items beyond the items taken.
    Ride {
        progress: CudaSlice<u32>,
        ahead: i32,
    },
}

/// The compiled correlator for one [`CorrConfig`], with its corner turn where that is not
/// fused.
pub struct Correlator {
    gpu: Arc<Gpu>,
    cfg: CorrConfig,
    /// None where the turn is fused.
    turn: Option<CornerTurn>,
    corr: CudaFunction,
    reduce: CudaFunction,
    /// Clusters of the persistent `wgmma` grid (0 for the mma path).
    clusters: u32,
    /// The `wgmma` grid's item counter: zeroed before each launch, the clusters take their
    /// next item from it.
    next_item: CudaSlice<u32>,
    /// Times of a row one `wgmma` launch covers (at most [`WINDOW`], the int32 sums' bound).
    launch_times: usize,
}

impl Correlator {
    /// The plan for `cfg`, with the corner turn fused into the `wgmma` kernel where
    /// [`CorrConfig::can_fuse`] says it can be, or riding in its launch where
    /// [`CorrConfig::can_ride`] does.
    pub fn new(gpu: Arc<Gpu>, cfg: CorrConfig) -> Result<Correlator, CorrError> {
        Self::build(gpu, cfg, true, cfg.can_ride())
    }

    /// The plan for `cfg` with a separate corner turn on every path (the benchmark compares
    /// it with the kernel's own stagings).
    pub fn with_turn(gpu: Arc<Gpu>, cfg: CorrConfig) -> Result<Correlator, CorrError> {
        Self::build(gpu, cfg, false, false)
    }

    /// The plan for `cfg` with the turn riding in the `wgmma` launch wherever the kernel allows
    /// it ([`CorrConfig::ride_allowed`]), also at the sizes where it measured slower than the
    /// separate pass (the benchmark's comparison); as [`Correlator::new`] elsewhere.
    pub fn riding(gpu: Arc<Gpu>, cfg: CorrConfig) -> Result<Correlator, CorrError> {
        Self::build(gpu, cfg, true, cfg.ride_allowed())
    }

    /// `fuse`: let the `wgmma` kernel stage the chunk itself where it can; `ride`: turn it in
    /// the kernel's launch (where the caller has checked the kernel allows it).
    fn build(
        gpu: Arc<Gpu>,
        cfg: CorrConfig,
        fuse: bool,
        ride: bool,
    ) -> Result<Correlator, CorrError> {
        cfg.validate()?;
        if cfg.path == CorrPath::Wgmma && CorrPath::best_for(&gpu) != CorrPath::Wgmma {
            return Err(CorrError::Unsupported {
                arch: gpu.arch.clone(),
            });
        }
        let s = cfg.shape;
        let (np, tpad) = (cfg.np() as i64, cfg.tpad() as i64);
        let fused = fuse && cfg.can_fuse();
        let ride = ride && !fused;
        let threads = wgmma_threads(fused || ride);
        let turn_defs: Defines = vec![
            ("N_ANTS", s.n_ants as i64),
            ("CHANNELS", s.channels as i64),
            ("SPECTRA", s.spectra as i64),
            ("GROUP", cfg.group() as i64),
            ("TPAD", tpad),
            ("NP", np),
            ("IN_BITS", i64::from(cfg.in_bits)),
            ("TILED", i64::from(cfg.path == CorrPath::Wgmma)),
        ];
        let mut corr_defs: Defines = vec![
            ("N_ANTS", s.n_ants as i64),
            ("CHANNELS", s.channels as i64),
            ("TPAD", tpad),
            ("NP", np),
        ];
        let (corr, clusters) = match cfg.path {
            CorrPath::Mma => {
                corr_defs.push(("WINDOW", WINDOW as i64));
                (gpu.function(Kernel::CorrMma, &corr_defs)?, 0)
            }
            CorrPath::Wgmma => {
                corr_defs.extend([
                    ("STAGES", WGMMA_STAGES as i64),
                    ("FUSED", i64::from(fused)),
                    ("RIDE", i64::from(ride)),
                ]);
                if fused || ride {
                    // The chunk's own layout, read by the kernel's own producers only (so that
                    // plans turned apart of one shape share one build).
                    corr_defs
                        .extend([("SPECTRA", s.spectra as i64), ("GROUP", cfg.group() as i64)]);
                }
                let f = gpu.function(Kernel::CorrWgmma, &corr_defs)?;
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    WGMMA_SMEM as i32,
                )?;
                // The grid is persistent: exactly the clusters (of two blocks, the kernel's
                // __cluster_dims__) that are resident at once, each taking items from the
                // launch's counter until none are left; more would only wait for a place.
                let probe = LaunchConfig {
                    grid_dim: (2, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: WGMMA_SMEM as u32,
                };
                let clusters = f.occupancy_max_active_clusters(probe, &gpu.compute)?;
                if clusters == 0 {
                    return Err(CorrError::Shape {
                        what: "resident wgmma clusters",
                        value: 0,
                        why: "the device cannot hold one cluster of two 225 KiB blocks",
                    });
                }
                (f, clusters)
            }
        };
        let reduce_defs: Defines = vec![
            ("N_ANTS", s.n_ants as i64),
            ("CHANNELS", s.channels as i64),
            ("N_ACC", cfg.batches as i64),
        ];
        let turn = if fused {
            None
        } else {
            let by = if ride {
                let cbs = cfg.groups(cfg.batches) * s.channels;
                TurnBy::Ride {
                    progress: gpu.compute.alloc_zeros(1 + cbs)?,
                    ahead: cfg.turn_ahead(),
                }
            } else {
                TurnBy::Pass(gpu.function(Kernel::CorrTurn, &turn_defs)?)
            };
            Some(CornerTurn {
                planar: gpu.compute.alloc_zeros(cfg.planar_bytes())?,
                by,
            })
        };
        Ok(Correlator {
            turn,
            corr,
            reduce: gpu.function(Kernel::CorrReduce, &reduce_defs)?,
            clusters,
            next_item: gpu.compute.alloc_zeros(1)?,
            launch_times: WINDOW,
            gpu,
            cfg,
        })
    }

    pub fn config(&self) -> CorrConfig {
        self.cfg
    }

    /// Clusters (of two blocks) in the `wgmma` kernel's persistent grid; 0 on the mma path.
    pub fn resident_clusters(&self) -> u32 {
        self.clusters
    }

    /// Correlate one call's `batches` batches of `input` (layout in the module doc), **adding**
    /// batch i into accumulator i of `acc`. Runs on the compute stream.
    pub fn correlate(
        &mut self,
        input: &CudaView<u8>,
        acc: &mut CudaSlice<i64>,
    ) -> Result<(), CorrError> {
        self.correlate_range(input, acc, 0..self.cfg.batches)
    }

    /// Whether the corner turn is fused into the correlator (no separate pass, no scratch).
    pub fn fused(&self) -> bool {
        self.turn.is_none()
    }

    /// Whether the corner turn rides in the correlator's launch (`CorrConfig::can_ride`).
    pub fn rides(&self) -> bool {
        matches!(&self.turn, Some(t) if matches!(t.by, TurnBy::Ride { .. }))
    }

    /// Where the turn rides: let it run at most `items` work items beyond the items taken (the
    /// benchmark's sweep; `CorrConfig::turn_ahead` is the default). False where it does not
    /// ride.
    pub fn set_turn_ahead(&mut self, items: i32) -> bool {
        match &mut self.turn {
            Some(CornerTurn {
                by: TurnBy::Ride { ahead, .. },
                ..
            }) => {
                *ahead = items.max(0);
                true
            }
            _ => false,
        }
    }

    /// Split each row into `wgmma` launches of `times` (a multiple of the 128-time step, at most
    /// 65,536; the default is 65,536): each launch's clusters then share fewer bytes of rows in
    /// L2, and each adds its sums into the int64 accumulators once more (the benchmark's
    /// sweep). False on the mma path or for another `times`.
    pub fn set_launch_times(&mut self, times: usize) -> bool {
        let k = CorrPath::Wgmma.kstep();
        let ok =
            self.cfg.path == CorrPath::Wgmma && times % k == 0 && (k..=WINDOW).contains(&times);
        if ok {
            self.launch_times = times;
        }
        ok
    }

    /// How the chunk becomes the tensor cores' planar rows, in words for an operator's log.
    pub fn staging(&self) -> &'static str {
        if self.fused() {
            "fused into the correlator"
        } else if self.rides() {
            "riding in the correlator's launch"
        } else {
            "a separate pass"
        }
    }

    /// Whether a separate corner-turn pass runs before the correlator.
    fn turns_apart(&self) -> bool {
        !self.fused() && !self.rides()
    }

    /// Correlate only batches `batches` of one call's `input` (the whole call's, layout in the
    /// module doc), **adding** batch i into accumulator i of `acc`: an engine's dump can fall
    /// mid-chunk (seed 001 §Accumulations), so the batches before it go to one dump and the
    /// rest to the next. Runs on the compute stream.
    pub fn correlate_range(
        &mut self,
        input: &CudaView<u8>,
        acc: &mut CudaSlice<i64>,
        batches: Range<usize>,
    ) -> Result<(), CorrError> {
        check_len("input", input.len(), self.cfg.input_bytes())?;
        check_len("acc", acc.len(), self.cfg.acc_len())?;
        if batches.is_empty() || batches.end > self.cfg.batches {
            return Err(CorrError::Shape {
                what: "batch range end",
                value: batches.end,
                why: "a non-empty range within the call's batches",
            });
        }
        let in_batch = self.cfg.input_bytes() / self.cfg.batches;
        let vis = self.cfg.shape.vis_len();
        let n = batches.len();
        let input = input.slice(batches.start * in_batch..batches.end * in_batch);
        let mut acc = acc.slice_mut(batches.start * vis..batches.end * vis);
        if self.turns_apart() {
            self.turn(&input, n)?;
        }
        self.launch(Some(&input), &mut acc, n)
    }

    /// The corner turn alone (the benchmark times it apart); an error where the kernel turns
    /// the chunk itself (fused or riding).
    pub fn corner_turn(&mut self, input: &CudaView<u8>) -> Result<(), CorrError> {
        check_len("input", input.len(), self.cfg.input_bytes())?;
        self.turn(input, self.cfg.batches)
    }

    /// The correlator over the planar buffer the last corner turn wrote; an error where the
    /// kernel turns the chunk itself.
    pub fn correlate_planar(&mut self, acc: &mut CudaSlice<i64>) -> Result<(), CorrError> {
        check_len("acc", acc.len(), self.cfg.acc_len())?;
        if !self.turns_apart() {
            return Err(CorrError::NoTurn);
        }
        self.launch(None, &mut acc.slice_mut(..), self.cfg.batches)
    }

    /// Reduce the `batches` accumulators to int32 (see the module doc): `present` holds one
    /// flag per antenna (non-zero = present), `out` is overwritten with `shape.vis_len()` int32,
    /// `clips` (one u64) with the number of clipped parts. With `clear`, `acc` is zeroed.
    pub fn reduce(
        &self,
        acc: &mut CudaSlice<i64>,
        present: &CudaSlice<u8>,
        out: &mut CudaSlice<i32>,
        clips: &mut CudaSlice<u64>,
        clear: bool,
    ) -> Result<(), CorrError> {
        let s = self.cfg.shape;
        check_len("acc", acc.len(), self.cfg.acc_len())?;
        check_len("present", present.len(), s.n_ants)?;
        check_len("out", out.len(), s.vis_len())?;
        check_len("clips", clips.len(), 1)?;
        let st = &self.gpu.compute;
        st.memset_zeros(clips)?;
        let threads = s.channels * n_baselines(s.n_ants);
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let clear = i32::from(clear);
        let mut b = st.launch_builder(&self.reduce);
        b.arg(acc).arg(present).arg(out).arg(clips).arg(&clear);
        // SAFETY: every buffer's length was checked against the kernel's constants above; one
        // thread per (channel, baseline) touches only its own 8 values in each buffer.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

fn check_len(buffer: &'static str, len: usize, expected: usize) -> Result<(), CorrError> {
    if len == expected {
        Ok(())
    } else {
        Err(CorrError::Buffer {
            buffer,
            len,
            expected,
        })
    }
}
