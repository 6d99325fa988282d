//! The correlator's kernel launches for one call (`Correlator::correlate` and friends): the
//! separate corner turn, the correlator's launches over a row's windows with their arguments,
//! and the fused kernel's tensor map of the chunk.

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};

use super::{wgmma_threads, CornerTurn, CorrError, CorrPath, Correlator, TurnBy, WGMMA_SMEM};
use crate::gpu::tensor_map::TensorMap;

impl Correlator {
    /// The corner turn of the first `n` batches of `input` (`n` batches' bytes) into the
    /// first `n` batches of the planar buffer.
    pub(super) fn turn(&mut self, input: &CudaView<u8>, n: usize) -> Result<(), CorrError> {
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
        let Some(CornerTurn {
            planar,
            by: TurnBy::Pass(kernel),
        }) = &mut self.turn
        else {
            return Err(CorrError::NoTurn);
        };
        let st = &self.gpu.compute;
        let n_arg = n as i32;
        let mut b = st.launch_builder(kernel);
        b.arg(input).arg(planar).arg(&n_arg);
        // SAFETY: `input` holds n of the input_bytes()/batches bytes per batch (the callers
        // check the lengths) and `planar` planar_bytes() ≥ the rows of n batches' groups; the
        // grid covers (time tile, antenna group) × channel × batch group exactly as the
        // kernel's constants say, and the kernel reads no batch at or beyond n.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The correlator over the first `n` batches into `acc` (`n` accumulators; group j of
    /// batches adds into accumulator j, the reduce sums them all): from `input` (those `n`
    /// batches) where the turn is fused, else from the planar rows the corner turn wrote (or,
    /// riding, writes from `input` in the same launch).
    pub(super) fn launch(
        &mut self,
        input: Option<&CudaView<u8>>,
        acc: &mut CudaViewMut<i64>,
        n: usize,
    ) -> Result<(), CorrError> {
        let channels = self.cfg.shape.channels;
        let groups = self.cfg.groups(n);
        let (fused, rides) = (self.fused(), self.rides());
        let st = &self.gpu.compute;
        match self.cfg.path {
            CorrPath::Mma => {
                // A block per square tile of the triangle, channel and batch group.
                let cfg = LaunchConfig {
                    grid_dim: (self.cfg.tile_pairs() as u32, channels as u32, groups as u32),
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
                let items = self.cfg.tile_pairs() * channels * groups;
                let items = i32::try_from(items).map_err(|_| CorrError::Shape {
                    what: "wgmma work items",
                    value: items,
                    why: "below 2^31 (fewer channels or batches per call)",
                })?;
                let cfg = LaunchConfig {
                    grid_dim: (2 * self.clusters.min(items as u32), 1, 1),
                    block_dim: (wgmma_threads(fused || rides), 1, 1),
                    shared_mem_bytes: WGMMA_SMEM as u32,
                };
                let n_arg = n as i32;
                // The fused producer's tensor copies read the chunk through a map, and the
                // riding turners in 16-byte words: both need a 16-byte aligned address (the
                // separate turn pass reads bytes and pairs only).
                let chunk = match input.filter(|_| fused || rides) {
                    Some(input) => {
                        let (address, _read) = input.device_ptr(st);
                        if address % 16 != 0 {
                            return Err(CorrError::Misaligned { address });
                        }
                        Some((input, address))
                    }
                    None if fused || rides => return Err(CorrError::NoTurn),
                    None => None,
                };
                let map = match chunk.filter(|_| fused) {
                    Some((_, address)) => Some(self.chunk_map(address, n)?),
                    None => None,
                };
                // One launch per `launch_times` (at most WINDOW) of times: the kernel sums a
                // launch in int32.
                let steps = (self.cfg.tpad() / CorrPath::Wgmma.kstep()) as i32;
                let per = (self.launch_times / CorrPath::Wgmma.kstep()) as i32;
                for step0 in (0..steps).step_by(per as usize) {
                    let k = per.min(steps - step0);
                    st.memset_zeros(&mut self.next_item)?;
                    if let Some(CornerTurn {
                        by: TurnBy::Ride { progress, .. },
                        ..
                    }) = &mut self.turn
                    {
                        st.memset_zeros(progress)?;
                    }
                    let mut b = st.launch_builder(&self.corr);
                    match (&self.turn, chunk) {
                        (Some(turn), _) => b.arg(&turn.planar),
                        (None, Some((input, _))) => b.arg(input),
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
                    if let (
                        Some(CornerTurn {
                            by: TurnBy::Ride { progress, ahead },
                            ..
                        }),
                        Some((input, _)),
                    ) = (&self.turn, chunk)
                    {
                        b.arg(input).arg(progress).arg(ahead);
                    }
                    // SAFETY: the source is the chunk's n batches (fused: the kernel reads no
                    // batch at or beyond n, nor a time beyond SPECTRA·GROUP of a group) or
                    // the corner turn's (tiled) output for them (riding: the kernel writes
                    // those rows itself from the chunk's n batches, 16-byte aligned, within
                    // planar_bytes(), counting in `progress`, 1 + groups · channels words,
                    // zeroed on the stream before each launch), and `acc` holds n
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
}
