// The wgmma correlator's fused producer (FUSED = 1; `gpu::compile` puts this file after
// kernels/correlate_wgmma_tiles.cuh and before kernels/correlate_wgmma.cu): each stage built
// from the chunk's own words instead of the corner turn's rows. Empty without FUSED.

#if FUSED
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel)
{
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// The four planar rows' words of 4 consecutive times from their samples w0 … w3 (each word
// (re₀, im₀, re₁, im₁) of one time): rows (pol 0, Re), (0, Im), (1, Re), (1, Im).
__device__ __forceinline__ void split4(u32 w0, u32 w1, u32 w2, u32 w3, u32 (&r)[4])
{
    const u32 lo01 = prmt(w0, w1, 0x5140), hi01 = prmt(w0, w1, 0x7362);
    const u32 lo23 = prmt(w2, w3, 0x5140), hi23 = prmt(w2, w3, 0x7362);
    r[0] = prmt(lo01, lo23, 0x5410);
    r[1] = prmt(lo01, lo23, 0x7632);
    r[2] = prmt(hi01, hi23, 0x5410);
    r[3] = prmt(hi01, hi23, 0x7632);
}

// FUSED (small arrays): the producer warpgroup stages each step straight from the chunk,
// which is (batch, antenna, channel, spectrum, pol, re/im) int8 as the F heaps arrive, so no
// corner-turn pass reads and writes the chunk first. An antenna's samples of one channel are a
// contiguous run of 4-byte words in time, so its four planar rows are a byte de-interleave of
// the run, not a transpose: a unit of 16 times of one antenna (64 bytes, four 16-byte loads)
// becomes 16 bytes of each of its four rows (`split4`), stored at their swizzled places (the
// order correlate_turn.cu's TILED layout writes to global memory). A step's antennas are the
// column tile's 64 (slots 0 … 63) and, off the diagonal, the block's row tile's 32 (slots
// 64 … 95), each in 8 units; thread p of the warpgroup takes unit p % 8 of slots p / 8 + 16·j,
// issues every load of a step before it waits for the stage, and prefetches the rows of step
// k + PF into L2. Registers hold at most a step in flight (48 KB per SM), so this feeds the
// tensor cores only where the turn's own pass costs more than the wait: at N ≤ 64 the fused
// call took 0.29 ms against 0.47 for turn + correlator, at N = 576 13.6 against 9.2
// (bench/correlator-notes.md v13; the host fuses only where NP ≤ FUSE_MAX_NP). Antennas at or
// beyond N_ANTS, times beyond GROUP·SPECTRA and batches at or beyond `n` are zeros. Needs
// SPECTRA % 16 == 0 (a unit never straddles two batches) and 8-bit input.
#define UNITS_MAX 6
#define PF 2

__device__ __forceinline__ void stage_item_fused(int it, int rank, const unsigned char *__restrict__ in, int n,
                                                 u32 sbase, u32 full, u32 empty, int step0, int nsteps, u32 &g)
{
    int cb, ct, pp;
    item_parts(it, cb, ct, pp);
    const int grp = cb / CHANNELS, c = cb % CHANNELS;
    const bool diag = pp == ct;
    const int rt = 2 * pp + rank;
    const int p = threadIdx.x - CONSUMERS, lane = threadIdx.x % 32, ch = p % 8;
    const int units = diag ? 4 : UNITS_MAX;
    // Byte offset of each unit's antenna run in this channel (batch 0, time 0); −1: zeros.
    i64 run[UNITS_MAX];
#pragma unroll
    for (int j = 0; j < UNITS_MAX; ++j)
    {
        const int slot = p / 8 + 16 * j;
        const int a = slot < 64 ? ct * 64 + slot : rt * 32 + (slot - 64);
        run[j] = j < units && a < N_ANTS ? ((i64)a * CHANNELS + c) * SPECTRA * 4 : -1;
    }
    // Byte offset of (batch, spectrum) of the group's row time t, −1 past the data.
    auto at = [&](int t) -> i64 {
        const int sub = t / SPECTRA, batch = grp * GROUP + sub;
        if (sub >= GROUP || batch >= n)
            return -1;
        return ((i64)batch * N_ANTS * CHANNELS * SPECTRA + (t - sub * SPECTRA)) * 4;
    };
    for (int k = 0; k < nsteps; ++k, ++g)
    {
        const int t = (step0 + k) * KSTEP + ch * 16;
        const i64 off = at(t);
        if (k + PF < nsteps && (ch & 1) == 0)
        {
            const i64 pf = at(t + PF * KSTEP);
            if (pf >= 0)
#pragma unroll
                for (int j = 0; j < UNITS_MAX; ++j)
                    if (run[j] >= 0)
                        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(in + run[j] + pf));
        }
        uint4 x[UNITS_MAX][4];
#pragma unroll
        for (int j = 0; j < UNITS_MAX; ++j)
#pragma unroll
            for (int h = 0; h < 4; ++h)
                x[j][h] = make_uint4(0, 0, 0, 0);
        if (off >= 0)
#pragma unroll
            for (int j = 0; j < UNITS_MAX; ++j)
                if (run[j] >= 0)
                {
                    const uint4 *src = reinterpret_cast<const uint4 *>(in + run[j] + off);
#pragma unroll
                    for (int h = 0; h < 4; ++h)
                        x[j][h] = __ldg(src + h);
                }
        const u32 s = g % STAGES;
        if (g >= STAGES)
            mbar_wait(empty + 8 * s, ((g / STAGES) & 1) ^ 1);
        const u32 st = sbase + s * STAGE_BYTES;
#pragma unroll
        for (int j = 0; j < UNITS_MAX; ++j)
        {
            if (j >= units)
                break;
            const int slot = p / 8 + 16 * j;
            const int sl = slot < 64 ? slot : slot - 64;
            const u32 tile = st + (slot < 64 ? A_BYTES : 0);
            u32 r[4][4]; // [row][word]
#pragma unroll
            for (int h = 0; h < 4; ++h)
            {
                u32 w[4];
                split4(x[j][h].x, x[j][h].y, x[j][h].z, x[j][h].w, w);
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    r[q][h] = w[q];
            }
            // Row (pol, plane) of antenna-pol i = 2·sl + pol is (i / 8)·16 + plane·8 + i % 8,
            // and its 16-byte chunk ch lies at (ch ^ row & 7)·16.
#pragma unroll
            for (int q = 0; q < 4; ++q)
            {
                const int row = (sl >> 2) * 16 + (q & 1) * 8 + 2 * (sl & 3) + (q >> 1);
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + row * KSTEP + ((ch ^ (row & 7)) << 4)),
                             "r"(r[q][0]), "r"(r[q][1]), "r"(r[q][2]), "r"(r[q][3])
                             : "memory");
            }
        }
        // The stores are the generic proxy's; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(full + 8 * s) : "memory");
    }
}
#endif
