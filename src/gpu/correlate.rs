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
//! Each call runs on the compute stream. Where the turn is not fused (see below), the corner
//! turn (`kernels/correlate_turn.cu`) first writes a planar, time-major copy of the chunk into
//! a scratch buffer the plan owns (as large as the 8-bit input, padded to whole tiles; read and
//! written, 2 bytes moved per input byte). Then
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
//! N = 64 the call takes 0.27 ms instead of 0.47).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};

use super::compile::{Defines, Kernel};
use super::tensor_map::TensorMap;
use super::{Gpu, GpuError};
use crate::dsp::correlate::{n_baselines, CorrShape};

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
    fn kstep(self) -> usize {
        match self {
            CorrPath::Mma => 64,
            CorrPath::Wgmma => 128,
        }
    }

    /// Antenna-pols per (column) tile: the antenna-pol axis is padded to a multiple of it.
    fn tile(self) -> usize {
        match self {
            CorrPath::Mma => 64,
            CorrPath::Wgmma => 128,
        }
    }
}

/// Shared-memory stages of the `wgmma` kernel (48 KiB each; 3 measured 10–15 % slower at
/// N = 576, bench/correlator-notes.md v7), its epilogue's staging (4 KiB per consumer warp) and
/// the alignment slack: 225 KiB of the 227 KiB a block may have.
const WGMMA_STAGES: usize = 4;
const WGMMA_SMEM: usize = WGMMA_STAGES * 384 * 128 + 32 * 1024 + 1024;
/// The largest padded antenna-pol count the `wgmma` path fuses its corner turn at (two column
/// tiles: up to 128 antennas; see [`CorrConfig::can_fuse`]). Measured fused at every N
/// (bench/correlator-notes.md v14): faster than turn + correlator up to 128 antennas (1.77× at
/// 64, 1.41× at 128), mixed at 256 (1.07× at 3072 times, 0.89–0.95× at longer rows), slower at
/// 576 (0.70–0.80×), where the splitters' de-interleave, not the copies, sets the pace.
const FUSE_MAX_NP: usize = 256;
/// Threads of a `wgmma` block: two consumer warpgroups and a producer warp (bulk copies of
/// the corner turn's rows) or a producer warpgroup (fused: a copier warp, three splitters).
fn wgmma_threads(fused: bool) -> u32 {
    if fused {
        384
    } else {
        288
    }
}
/// Times summed in int32 before they are added to int64 (|product| ≤ 128², so each real
/// product sum stays below 2³¹ for up to 131072 times; half of that keeps a margin): inside the
/// mma kernel, and per launch of the wgmma kernel.
const WINDOW: usize = 65536;
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
    #[error("this correlator plan fuses its corner turn into the wgmma kernel: no separate turn or planar rows (build it with_turn)")]
    NoTurn,
    #[error("the fused correlator reads its input through a TMA tensor map, which needs a 16-byte aligned address: input at device address {address:#x} is not")]
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
    fn np(&self) -> usize {
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

    /// Groups of batches in `n` batches.
    fn groups(&self, n: usize) -> usize {
        n.div_ceil(self.group())
    }

    /// Times per planar row (a group's) after padding to whole steps.
    fn tpad(&self) -> usize {
        (self.group() * self.shape.spectra).div_ceil(self.path.kstep()) * self.path.kstep()
    }

    /// Bytes of the planar scratch buffer: Re and Im rows of every padded antenna-pol.
    pub fn planar_bytes(&self) -> usize {
        self.groups(self.batches) * self.shape.channels * 2 * self.np() * self.tpad()
    }

    fn validate(&self) -> Result<(), CorrError> {
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

/// The corner turn's kernel and the planar scratch buffer it writes for the correlator.
struct CornerTurn {
    kernel: CudaFunction,
    planar: CudaSlice<i8>,
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
}

impl Correlator {
    /// The plan for `cfg`, with the corner turn fused into the `wgmma` kernel where
    /// [`CorrConfig::can_fuse`] says it can be.
    pub fn new(gpu: Arc<Gpu>, cfg: CorrConfig) -> Result<Correlator, CorrError> {
        Self::build(gpu, cfg, true)
    }

    /// The plan for `cfg` with a separate corner turn on every path (the benchmark compares
    /// it with the fused one).
    pub fn with_turn(gpu: Arc<Gpu>, cfg: CorrConfig) -> Result<Correlator, CorrError> {
        Self::build(gpu, cfg, false)
    }

    fn build(gpu: Arc<Gpu>, cfg: CorrConfig, fuse: bool) -> Result<Correlator, CorrError> {
        cfg.validate()?;
        if cfg.path == CorrPath::Wgmma && CorrPath::best_for(&gpu) != CorrPath::Wgmma {
            return Err(CorrError::Unsupported {
                arch: gpu.arch.clone(),
            });
        }
        let s = cfg.shape;
        let (np, tpad) = (cfg.np() as i64, cfg.tpad() as i64);
        let fused = fuse && cfg.can_fuse();
        let threads = wgmma_threads(fused);
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
                corr_defs.extend([("STAGES", WGMMA_STAGES as i64), ("FUSED", i64::from(fused))]);
                if fused {
                    // The chunk's own layout, read by the fused producer only (so that turned
                    // plans of one shape share one build).
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
            Some(CornerTurn {
                kernel: gpu.function(Kernel::CorrTurn, &turn_defs)?,
                planar: gpu.compute.alloc_zeros(cfg.planar_bytes())?,
            })
        };
        Ok(Correlator {
            turn,
            corr,
            reduce: gpu.function(Kernel::CorrReduce, &reduce_defs)?,
            clusters,
            next_item: gpu.compute.alloc_zeros(1)?,
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
        check_len("input", input.len(), self.cfg.input_bytes())?;
        check_len("acc", acc.len(), self.cfg.acc_len())?;
        let n = self.cfg.batches;
        if self.fused() {
            return self.launch(Some(input), &mut acc.slice_mut(..), n);
        }
        self.turn(input, n)?;
        self.launch(None, &mut acc.slice_mut(..), n)
    }

    /// Whether the corner turn is fused into the correlator (no separate pass, no scratch).
    pub fn fused(&self) -> bool {
        self.turn.is_none()
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
        if self.fused() {
            return self.launch(Some(&input), &mut acc, n);
        }
        self.turn(&input, n)?;
        self.launch(None, &mut acc, n)
    }

    /// The corner turn alone (the benchmark times it apart); an error where it is fused.
    pub fn corner_turn(&mut self, input: &CudaView<u8>) -> Result<(), CorrError> {
        check_len("input", input.len(), self.cfg.input_bytes())?;
        self.turn(input, self.cfg.batches)
    }

    /// The correlator over the planar buffer the last corner turn wrote; an error where the
    /// turn is fused.
    pub fn correlate_planar(&mut self, acc: &mut CudaSlice<i64>) -> Result<(), CorrError> {
        check_len("acc", acc.len(), self.cfg.acc_len())?;
        if self.fused() {
            return Err(CorrError::NoTurn);
        }
        self.launch(None, &mut acc.slice_mut(..), self.cfg.batches)
    }

    /// The corner turn of the first `n` batches of `input` (`n` batches' bytes) into the
    /// first `n` batches of the planar buffer.
    fn turn(&mut self, input: &CudaView<u8>, n: usize) -> Result<(), CorrError> {
        let s = self.cfg.shape;
        let t_tiles = self.cfg.tpad().div_ceil(256);
        let cfg = LaunchConfig {
            grid_dim: (
                (t_tiles * self.cfg.np() / 8) as u32,
                s.channels as u32,
                self.cfg.groups(n) as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let Some(turn) = &mut self.turn else {
            return Err(CorrError::NoTurn);
        };
        let st = &self.gpu.compute;
        let n_arg = n as i32;
        let mut b = st.launch_builder(&turn.kernel);
        b.arg(input).arg(&mut turn.planar).arg(&n_arg);
        // SAFETY: `input` holds n of the input_bytes()/batches bytes per batch (the callers
        // check the lengths) and `planar` planar_bytes() ≥ the rows of n batches' groups; the
        // grid covers (time tile, antenna group) × channel × batch group exactly as the
        // kernel's constants say, and the kernel reads no batch at or beyond n.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The correlator over the first `n` batches into `acc` (`n` accumulators; group j of
    /// batches adds into accumulator j, the reduce sums them all): from `input` (those `n`
    /// batches) where the turn is fused, else from the planar rows the corner turn wrote.
    fn launch(
        &mut self,
        input: Option<&CudaView<u8>>,
        acc: &mut CudaViewMut<i64>,
        n: usize,
    ) -> Result<(), CorrError> {
        let tiles = self.cfg.np() / self.cfg.path.tile();
        let channels = self.cfg.shape.channels;
        let groups = self.cfg.groups(n);
        let fused = self.fused();
        let st = &self.gpu.compute;
        match self.cfg.path {
            CorrPath::Mma => {
                // A block per square tile of the triangle, channel and batch group.
                let cfg = LaunchConfig {
                    grid_dim: (
                        (tiles * (tiles + 1) / 2) as u32,
                        channels as u32,
                        groups as u32,
                    ),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                let Some(turn) = &self.turn else {
                    return Err(CorrError::NoTurn);
                };
                let mut b = st.launch_builder(&self.corr);
                b.arg(&turn.planar).arg(acc);
                // SAFETY: `planar` holds the corner turn's output for n batches; `acc` holds n
                // accumulators (the callers check); each (tile, channel, batch) block adds into
                // its own baselines only.
                unsafe { b.launch(cfg) }?;
            }
            CorrPath::Wgmma => {
                // Items: (batch group, channel, column tile, pair of its row tiles); column
                // tile ct holds ct + 1 pairs.
                let items = tiles * (tiles + 1) / 2 * channels * groups;
                let items = i32::try_from(items).map_err(|_| CorrError::Shape {
                    what: "wgmma work items",
                    value: items,
                    why: "below 2^31 (fewer channels or batches per call)",
                })?;
                let cfg = LaunchConfig {
                    grid_dim: (2 * self.clusters.min(items as u32), 1, 1),
                    block_dim: (wgmma_threads(fused), 1, 1),
                    shared_mem_bytes: WGMMA_SMEM as u32,
                };
                let n_arg = n as i32;
                // The fused producer's tensor copies read the chunk through a map, which needs
                // a 16-byte aligned address; the turn kernel read bytes and pairs only.
                let map = match input.filter(|_| fused) {
                    Some(input) => {
                        let (address, _read) = input.device_ptr(st);
                        if address % 16 != 0 {
                            return Err(CorrError::Misaligned { address });
                        }
                        Some(self.chunk_map(address, n)?)
                    }
                    None => None,
                };
                // One launch per WINDOW of times: the kernel sums a launch in int32.
                let steps = (self.cfg.tpad() / CorrPath::Wgmma.kstep()) as i32;
                let per = (WINDOW / CorrPath::Wgmma.kstep()) as i32;
                for step0 in (0..steps).step_by(per as usize) {
                    let k = per.min(steps - step0);
                    st.memset_zeros(&mut self.next_item)?;
                    let mut b = st.launch_builder(&self.corr);
                    match (&self.turn, input) {
                        (Some(turn), _) => b.arg(&turn.planar),
                        (None, Some(input)) => b.arg(input),
                        (None, None) => return Err(CorrError::NoTurn),
                    };
                    b.arg(&mut *acc)
                        .arg(&step0)
                        .arg(&k)
                        .arg(&items)
                        .arg(&mut self.next_item)
                        .arg(&n_arg);
                    if let Some(map) = &map {
                        b.arg(map);
                    }
                    // SAFETY: the source is the chunk's n batches (fused: the kernel reads no
                    // batch at or beyond n, nor a time beyond SPECTRA·GROUP of a group) or
                    // the corner turn's (tiled) output for them, and `acc` holds n
                    // accumulators (the callers check); the kernel takes items below
                    // `items` only, each adding into its own baselines; steps [step0, step0 +
                    // k) lie inside the planar rows' TPAD times, and launches on one stream run
                    // in order, so their read-modify-writes of `acc` never overlap (nor their
                    // uses of the item counter, zeroed on the same stream before each).
                    unsafe { b.launch(cfg) }?;
                }
            }
        }
        Ok(())
    }

    /// The fused kernel's view of `n` batches of the chunk at device `address`
    /// (`TensorMap` in kernels/correlate_wgmma_fused.cuh): 4-byte words (one time of both
    /// pols), dimensions (32 times, quarter of a 128-time step, antenna, channel, batch), boxes
    /// of one step's times × 32 antennas in the 128-byte swizzle (a row is 32 times).
    fn chunk_map(&self, address: u64, n: usize) -> Result<TensorMap, CorrError> {
        let s = self.cfg.shape;
        let word = 4u64;
        let (spectra, ants, channels) = (s.spectra as u64, s.n_ants as u64, s.channels as u64);
        let quarters = CorrPath::Wgmma.kstep() as u32 / 32;
        Ok(TensorMap::words(
            address,
            [32, spectra / 32, ants, channels, n as u64],
            &[
                32 * word,
                channels * spectra * word,
                spectra * word,
                ants * channels * spectra * word,
            ],
            [32, quarters, 32, 1, 1],
            true,
        )?)
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
