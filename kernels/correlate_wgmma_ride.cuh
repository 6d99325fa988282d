// The wgmma correlator's riding corner turn (RIDE = 1, with FUSED = 0; `gpu::compile` puts this
// file after kernels/correlate_wgmma_fused.cuh and before kernels/correlate_wgmma.cu): the corner
// turn done inside the correlator's own launch, through global memory, by three "turner" warps
// of every block's producer warpgroup, while the consumers multiply channels already turned.
//
// Why: beyond 128 antennas the separate turn pass (kernels/correlate_turn.cu) costs 45 % of the
// correlator's time (576 antennas: 2.56 ms of DRAM-bound copying against the kernel's 5.7),
// and fusing it through shared memory (FUSED) loses to it: with no de-interleave at all the
// fused kernel took 6.9 ms at 576 antennas, with it 10.7, since the kernel's shared memory is
// already busy with the wgmma operand reads and the stages' copies and the de-interleave adds
// a read and a write of every staged byte (bench/correlator-notes.md v15). The correlator
// itself leaves much of the DRAM bandwidth unused at those sizes, so the turn's global reads
// and writes can share the launch instead of following it. The turners must not run far
// ahead (`ahead`): unthrottled, they took the DRAM at the start while the consumers waited,
// and the launch took as long as the two passes apart.
//
// Work: a unit is one step (KSTEP times) of one (batch group, channel) cb: every antenna's
// rows of it, antennas at or beyond N_ANTS as zeros (the turn kernel's tiled, pre-swizzled
// layout, kernels/correlate_turn.cu `word`). Units are taken in order from progress word 0,
// cb-major as the items are, and a turner counts each finished unit in progress word 1 + cb
// (release, after its stores); the staging lane waits for its item's channel to be whole
// (nsteps units) before its first copy of it (wait_turned). Turners wait only for the items
// taken to come within `ahead` of a unit's channel, and a channel whose item a staging lane
// waits for has had an item taken, so its units always pass: the items always make progress.
// A warp takes a group of four antennas at a time: lane
// (a, j) reads antenna 4g + a's times 16j … 16j + 15 (64 bytes, four 16-byte loads) and
// writes the 16 bytes of chunk j of its four planar rows, so a warp's stores fill whole
// 128-byte rows. TURN_ILP groups' loads are in flight before any of them is written.
// Needs 8-bit input and SPECTRA % 16 == 0 (a lane's 16 times lie in one batch).

#if RIDE
#if FUSED
#error "RIDE is the turned path's: FUSED must be 0"
#endif
#if SPECTRA % 16 != 0
#error "RIDE needs SPECTRA % 16 == 0"
#endif
#define TURN_ILP 4 // antenna groups whose loads a turner warp has in flight at once

// The turner warps' work (warps 1 … 3 of the producer warpgroup): units of the launch's
// steps [step0, step0 + nsteps) for batch groups·channels [0, cbs), from the chunk `in`
// ((batch, antenna, channel, spectrum) 4-byte words, n batches) into the tiled planar rows.
__device__ __forceinline__ void turn_units(const uint4 *__restrict__ in, uint4 *__restrict__ planar, int n, int step0,
                                           int nsteps, int cbs, unsigned *__restrict__ progress,
                                           const unsigned *next_item, int ahead)
{
    const int lane = threadIdx.x % 32, a = lane >> 3, j = lane & 7;
    const int units = cbs * nsteps;
    for (;;)
    {
        int u = 0;
        if (lane == 0)
            u = (int)atomicAdd(progress, 1u);
        u = __shfl_sync(0xffffffffu, u, 0);
        if (u >= units)
            break;
        const int cb = u / nsteps, step = step0 + u % nsteps;
        // The unit's channel's first item not more than `ahead` items beyond those taken so far
        // (see the top of this file). Units are taken in order, so the channel the items wait
        // for is never held up by this.
        if (lane == 0)
            for (;;)
            {
                u32 taken;
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(taken) : "l"(next_item) : "memory");
                if ((i64)cb * PAIRS <= (i64)taken + ahead)
                    break;
                __nanosleep(256);
            }
        __syncwarp();
        const int grp = cb / CHANNELS, c = cb % CHANNELS;
        const int t = step * KSTEP + 16 * j, sub = t / SPECTRA, batch = grp * GROUP + sub;
        const bool in_time = sub < GROUP && batch < n;
        // The lane's first 16 bytes for antenna 0, in 16-byte words.
        const i64 t_word = ((i64)batch * N_ANTS * CHANNELS * SPECTRA + (i64)c * SPECTRA + (t - sub * SPECTRA)) / 4;
        uint4 *rows = planar + ((i64)cb * (TPAD / KSTEP) + step) * (2 * NP) * (KSTEP / 16);
        for (int g0 = 0; g0 < NP / 8; g0 += TURN_ILP)
        {
            uint4 x[TURN_ILP][4];
#pragma unroll
            for (int i = 0; i < TURN_ILP; ++i)
            {
                const int ant = 4 * (g0 + i) + a;
                const bool valid = in_time && g0 + i < NP / 8 && ant < N_ANTS;
#pragma unroll
                for (int h = 0; h < 4; ++h)
                    x[i][h] = valid ? in[t_word + (i64)ant * CHANNELS * SPECTRA / 4 + h] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < TURN_ILP; ++i)
            {
                const int g = g0 + i;
                if (g >= NP / 8)
                    break;
                u32 w[4][4]; // [row][word h]: times 16j + 4h … of the row
#pragma unroll
                for (int h = 0; h < 4; ++h)
                {
                    u32 r4[4];
                    split4(x[i][h].x, x[i][h].y, x[i][h].z, x[i][h].w, r4);
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        w[q][h] = r4[q];
                }
#pragma unroll
                for (int q = 0; q < 4; ++q)
                {
                    // Antenna 4g + a's row; chunk j at (j ^ row & 7).
                    const int row = planar_row(4 * g + a, q);
                    rows[row * (KSTEP / 16) + (j ^ (row & 7))] = make_uint4(w[q][0], w[q][1], w[q][2], w[q][3]);
                }
            }
        }
        // Every lane's rows visible device-wide before the unit is counted, and ordered for
        // the async proxy that the staging lanes' bulk copies read them through (the writer's
        // half of the generic-to-async hand-over; wait_turned fences the reader's).
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        __threadfence();
        __syncwarp();
        if (lane == 0)
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(progress + 1 + cb) : "memory");
    }
}

// The staging lane's wait for channel cb's rows of this launch's steps (nsteps units), before
// its first bulk copy of them: the rows were written by other warps' generic stores, and the
// copies read through the async proxy.
__device__ __forceinline__ void wait_turned(const unsigned *progress, int cb, int nsteps)
{
    u32 done;
    do
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(done) : "l"(progress + 1 + cb) : "memory");
    while (done < (u32)nsteps);
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
#endif
