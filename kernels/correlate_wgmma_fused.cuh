// The wgmma correlator's fused producer (FUSED = 1; `gpu::compile` puts this file after
// kernels/correlate_wgmma_tiles.cuh and before kernels/correlate_wgmma.cu): each stage built
// from the chunk's own words instead of the corner turn's rows. Empty without FUSED.

#if FUSED
// FUSED: the producer warpgroup stages each step straight from the chunk, which is (batch,
// antenna, channel, spectrum, pol, re/im) int8 as the F heaps arrive, so no corner-turn pass
// reads and writes the chunk first. An antenna's samples of one channel are a contiguous run
// of 4-byte words in time, so its four planar rows are a byte de-interleave of the run, not a
// transpose (split4). A step's antennas ("slots") are the column tile's 64 (slots 0 … 63)
// and, off the diagonal, the block's row tile's 32 (slots 64 … 95); each slot's run of the
// step is KSTEP times, 512 bytes.
//
// Two roles, so that the chunk's bytes are in flight by asynchronous copies, not registers:
// - the copier (lane 0 of the producers' warp 0) takes each stage once its consumers have
//   released it and fills it with the step's runs by tensor copies (TensorMap), counted on the
//   stage's "raw" mbarrier. A register-staged producer
//   held at most a step (48 KB per SM) in flight and waited an L2 round trip per step:
//   1.7 µs per step against the tensor cores' 0.74 (bench/correlator-notes.md v13); the
//   copier keeps up to STAGES steps in flight.
// - the splitters (warps 1 … SPLITTERS) de-interleave each stage in place once its runs have
//   landed, and arrive on its "full" mbarrier for the consumers. In place without a barrier
//   between warps: slot s's run is copied to where its planar rows go (slot_offset), so a
//   group of four slots' runs (2 KB) is exactly the 16 planar rows those slots become, and one
//   warp reads the group, syncs its lanes and writes the rows over it. Lane (sq, ch) takes
//   times 16·ch … 16·ch + 15 of slot 4m + sq: 64 bytes, four 16-byte reads (the copies'
//   128-byte swizzle puts a phase's 8 lanes in distinct banks), and four 16-byte stores, one
//   per row, at their places (chunk ch of row r at (ch ^ r & 7)·16), distinct banks in a phase.
// Antennas at or beyond N_ANTS, times beyond GROUP·SPECTRA and batches at or beyond `n` are
// not copied; the splitters write zeros for them. Needs SPECTRA % KSTEP == 0 (a step never
// straddles two batches) and 8-bit input.
#define SPLITTERS (PRODUCERS / 32 - 1)
#ifndef SPLIT_ILP
#define SPLIT_ILP 2 // slot groups a splitter warp reads before writing any (split_item)
#endif

// Where slot `slot`'s run lands in a stage, and where its planar rows' group of four slots
// goes: the column tile's rows (slots 0 … 63) from A_BYTES on, the row tile's (64 … 95) from 0.
__device__ __forceinline__ u32 slot_offset(int slot)
{
    return slot < 64 ? A_BYTES + 512 * slot : 512 * (slot - 64);
}

__device__ __forceinline__ int slot_antenna(int slot, int ct, int rt)
{
    return slot < 64 ? ct * 64 + slot : rt * 32 + (slot - 64);
}

// Byte offset in the chunk of time t of batch group `grp` (batch grp·GROUP + t / SPECTRA,
// spectrum t % SPECTRA) for antenna 0 of channel 0; −1 past the data.
__device__ __forceinline__ i64 time_offset(int grp, int n, int t)
{
    const int sub = t / SPECTRA, batch = grp * GROUP + sub;
    if (sub >= GROUP || batch >= n)
        return -1;
    return ((i64)batch * N_ANTS * CHANNELS * SPECTRA + (t - sub * SPECTRA)) * 4;
}

// The chunk as the copier's tensor map describes it (`gpu::correlate::chunk_map`): 4-byte
// words (one time's (re₀, im₀, re₁, im₁)), dimensions (32 times, quarter of a step's 128,
// antenna, channel, batch), boxes of 32 × 4 × 32 antennas (16 KB) landing antenna-major, 512
// bytes per antenna — the slots' layout — in the 128-byte swizzle: 16-byte chunk k of each
// 128-byte row (a quarter of an antenna's step) at (k ^ row & 7)·16, so that the splitters'
// reads of 16-byte chunks in order fall in distinct banks. Antennas at or beyond N_ANTS
// arrive as zeros.
struct __align__(64) TensorMap
{
    unsigned long long opaque[16];
};

__device__ __forceinline__ void tensor_load(u32 dst, const TensorMap *map, int quarter, int a, int c, int batch,
                                            u32 bar)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                 "%5, %6}], [%7];\n" ::"r"(dst),
                 "l"(reinterpret_cast<u64>(map)), "r"(0), "r"(quarter), "r"(a), "r"(c), "r"(batch), "r"(bar)
                 : "memory");
}

// The copier's steps of one item (its lane 0): each stage's runs as three tensor copies (two on
// the diagonal), 32 antennas each. Copies of 512-byte runs one by one took ~50 ns each per SM
// (64–96 per step: 3.6–4.3 µs a step, bench/correlator-notes.md v14).
__device__ __forceinline__ void copy_item(int it, int rank, const TensorMap *map, int n, u32 sbase, u32 raw, u32 empty,
                                          int step0, int nsteps, u32 &g)
{
    int cb, ct, pp;
    item_parts(it, cb, ct, pp);
    const int grp = cb / CHANNELS, c = cb % CHANNELS;
    const int rt = 2 * pp + rank;
    // Boxes of 32 antennas: the column tile's two, and off the diagonal the row tile; none
    // wholly beyond the array.
    bool box[3];
    u32 boxes = 0;
#pragma unroll
    for (int j = 0; j < 3; ++j)
    {
        box[j] = (j < 2 || pp != ct) && slot_antenna(32 * j, ct, rt) < N_ANTS;
        boxes += box[j];
    }
    for (int k = 0; k < nsteps; ++k, ++g)
    {
        const u32 s = g % STAGES;
        if (g >= STAGES)
            mbar_wait(empty + 8 * s, ((g / STAGES) & 1) ^ 1);
        const u32 st = sbase + s * STAGE_BYTES;
        // SPECTRA % KSTEP == 0: a step lies in one batch.
        const int t = (step0 + k) * KSTEP, sub = t / SPECTRA, batch = grp * GROUP + sub;
        const bool data = sub < GROUP && batch < n;
        // The phase completes when every byte has landed (at once if none are copied).
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(raw + 8 * s),
                     "r"(data ? boxes * 32 * KSTEP * 4 : 0)
                     : "memory");
#pragma unroll
        for (int j = 0; j < 3; ++j)
            if (data && box[j])
                tensor_load(st + slot_offset(32 * j), map, (t - sub * SPECTRA) / 32, slot_antenna(32 * j, ct, rt), c,
                            batch, raw + 8 * s);
    }
}

// A splitter warp's steps of one item: warp w (0 … SPLITTERS − 1) de-interleaves slot groups
// w, w + SPLITTERS, … of each stage in place.
__device__ __forceinline__ void split_item(int it, int rank, int n, u32 sbase, u32 raw, u32 full, int step0,
                                           int nsteps, u32 &g)
{
    int cb, ct, pp;
    item_parts(it, cb, ct, pp);
    const int grp = cb / CHANNELS;
    const int rt = 2 * pp + rank, groups = pp == ct ? 16 : 24;
    const int w = threadIdx.x / 32 - CONSUMERS / 32 - 1;
    const int lane = threadIdx.x % 32, sq = lane >> 3, ch = lane & 7;
    // The lane's 16 times are 16-byte chunks 4·(ch % 2) … + 3 of its slot's 128-byte row
    // ch / 2, which the swizzle placed at chunk k ^ row & 7, row & 7 = 4·(slot % 2) + ch / 2
    // (a slot is 512 bytes, four rows, from a 1024-byte aligned box).
    const int quarter = ch >> 1, swz = 4 * (sq & 1) + quarter;
    for (int k = 0; k < nsteps; ++k, ++g)
    {
        const u32 s = g % STAGES;
        mbar_wait(raw + 8 * s, (g / STAGES) & 1);
        const u32 st = sbase + s * STAGE_BYTES;
        const bool in_time = time_offset(grp, n, (step0 + k) * KSTEP + 16 * ch) >= 0;
        // SPLIT_ILP groups at a time: all their reads, one sync, then all their rows, so that
        // a warp's reads of the next group are in flight while the last group's land.
        for (int m0 = w; m0 < groups; m0 += SPLIT_ILP * SPLITTERS)
        {
            u32 x[SPLIT_ILP][4][4];
#pragma unroll
            for (int i = 0; i < SPLIT_ILP; ++i)
            {
                const int m = m0 + i * SPLITTERS, slot = 4 * m + sq;
                const bool valid = m < groups && in_time && slot_antenna(slot, ct, rt) < N_ANTS;
                const u32 row_base = st + slot_offset(slot) + quarter * 128;
#pragma unroll
                for (int h = 0; h < 4; ++h)
                {
                    x[i][h][0] = x[i][h][1] = x[i][h][2] = x[i][h][3] = 0;
                    if (valid)
                        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                                     : "=r"(x[i][h][0]), "=r"(x[i][h][1]), "=r"(x[i][h][2]), "=r"(x[i][h][3])
                                     : "r"(row_base + ((((ch & 1) * 4 + h) ^ swz) << 4))
                                     : "memory");
                }
            }
            // Every lane's reads of the groups' runs before any lane's rows overwrite them.
            __syncwarp();
#pragma unroll
            for (int i = 0; i < SPLIT_ILP; ++i)
            {
                const int m = m0 + i * SPLITTERS, slot = 4 * m + sq, sl = slot < 64 ? slot : slot - 64;
                if (m >= groups)
                    break;
                u32 rows[4][4]; // [row][word]: x[h] is times 16·ch + 4h …, word h of each row's 16 bytes
#pragma unroll
                for (int h = 0; h < 4; ++h)
                {
                    u32 w4[4];
                    split4(x[i][h][0], x[i][h][1], x[i][h][2], x[i][h][3], w4);
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        rows[q][h] = w4[q];
                }
                const u32 tile = st + (slot < 64 ? A_BYTES : 0);
#pragma unroll
                for (int q = 0; q < 4; ++q)
                {
                    // Chunk ch of the row lies at (ch ^ row & 7)·16.
                    const int row = planar_row(sl, q);
                    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + row * KSTEP +
                                                                                     ((ch ^ (row & 7)) << 4)),
                                 "r"(rows[q][0]), "r"(rows[q][1]), "r"(rows[q][2]), "r"(rows[q][3])
                                 : "memory");
                }
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
