// The coherent beamformer (seed 003; `dsp::beamform` is its oracle): for every batch, channel c,
// spectrum t and single-polarisation beam b,
//
//   y = Σ_{a present} W_abc · x[a][c][t][pol_b],   W_abc = w_ab · e^{jπ·c·d_ab}
//
// then dithered (`dsp::beamform::beam_dither`, the project's counter-based generator, bit for
// bit) and quantised to int8 with ±127 saturation, counting per (batch, beam) the complex values
// with a saturated part.
//
// Layouts: input (batch, antenna, channel, spectrum, pol, re/im), int8 pairs (IN_BITS 8) or one
// byte per complex value with the real part in the high nibble (IN_BITS 4); output (batch, beam,
// channel, spectrum, re/im) int8; clips (batch, beam) u64, added to (the op zeroes them first).
//
// **Why int8 tensor cores.** Seed 003's kernel multiplies on the CUDA cores (four FMAs per
// antenna, beam and sample); on the H100 it reached 22 % of the copy bandwidth at MeerKAT's 8
// beams, issue-bound. An fp16 `mma.sync` version reached 46–49 %, still issue-bound: each input
// word cost byte permutes and subtractions to become fp16, and each block generated its own
// coefficients (bench/xbengine-notes.md). Here a channel's beamforming is an exact integer GEMM
// on int8 `mma.sync` m16n8k32, which takes the input words as they lie in memory, with the input
// staged DEPTH k-steps ahead by `cp.async` (48–58 % of copy at 8 beams on the lent H100, 19 %
// fewer instructions than the fp16 kernel; what limits it now is the issue rate of the
// epilogue's dither and of the staging, not DRAM: bench/xbengine-notes.md, v9–v10):
//
//   D (16 times × 8 columns, s32) += A (16 times × 32 k, s8) · B (32 k × 8 columns, s8)
//
// - k (one "k-step"): 8 antennas × 2 pols × (re, im). Lane (g, q) = (lane / 4, lane % 4) holds,
//   in A, k = 4q … 4q+3 (antenna q's word: re0, im0, re1, im1) and k = 16+4q … 16+4q+3 (antenna
//   q+4's word): input words with no conversion at all, −128 included (exact).
// - Rows: a warp takes 32 consecutive (batch, spectrum) slots as two m16 tiles; lane g's rows
//   g and g+8 of tile j are slots 4g+2j and 4g+2j+1, so a lane's four slots are consecutive and
//   its k-step is two 16-byte loads (4-bit input: 8 bytes each).
// - Columns: 4 beams × (re, im). B holds (Wr, −Wi) in a beam's re column and (Wi, Wr) in its im
//   column, in the rows of the beam's polarisation, zeros in the other's. Lane (g, q)'s D values
//   are beam q's re and im at its four slots: one 8-byte store.
// - **Weights as three int8 digits.** Each beam's weights are scaled by a power of two
//   (`scales`: max |w|·2^s ≤ 126·2¹⁶), rounded to integers v (|v| < 2²³: 22 bits or more at the
//   beam's largest weight) and written in balanced base 256, v = d₀·2¹⁶ + d₁·2⁸ + d₂, every
//   digit an int8. One MMA per digit gives S_d = Σ x·d exactly in int32 (|S_d| ≤ 2·N_ANTS·128²
//   < 2³¹ up to 4096 antennas), so y = (S₀·2¹⁶ + S₁·2⁸ + S₂)·2^−s is the exact sum over the
//   rounded weights, taken to float with about one rounding (`combine`). Against the oracle's
//   double sums the weights' rounding (≤ 2^−s/2 each, ≤ 2⁻²³ of the largest) and the float
//   sine and cosine of the phase remain: a value whose sum lies that close to a quantisation
//   boundary may round the other way, ±1 LSB, rarely and unbiased (the self-test bounds count
//   and bias).
//
// The digits depend only on (channel, antenna, beam) and the steering version, so they are made
// once per version by `beam_coeffs` into a table already in the B-fragment order (a u32 pair per
// lane, channel, beam tile, k-step and digit), not per block: generating W per block took a
// fifth of the fp16 kernel's instructions. A block copies its channel's part of the table into
// shared memory per antenna batch (KS k-steps) and beam batch (BT tiles of 4 beams), and reads
// it conflict-free. Beams beyond a batch are taken in an outer loop (seed 003 §Higher beam
// counts); the input is then read again.
//
// Missing antennas: the presence flag (batch, antenna) zeroes the lane's input words, so absent
// antennas add exact zeros.
//
// Compile-time constants (-D): N_ANTS, CHANNELS, SPECTRA, BATCHES, N_BEAMS, IN_BITS (8 or 4),
// THREADS (a multiple of 32: one warp per 32-slot slab), BT, KS, DEPTH, MIN_BLOCKS (blocks per
// SM, the register budget) (the host picks them, `BeamformConfig::defines`: BT·KS ≤ 40, at most
// 30 KiB of digits per block).
#define WARPS (THREADS / 32)
#define SLOTS (BATCHES * SPECTRA)
// Beam tiles and k-steps of the whole table.
#define NT ((N_BEAMS + 3) / 4)
#define NKS ((N_ANTS + 7) / 8)
// u32 pairs per (channel, tile, k-step): 3 digits × 32 lanes.
#define PAIRS (3 * 32)
// A lane's four slots are one batch's consecutive spectra, loaded and stored as one vector.
#define VEC (SPECTRA % 4 == 0)
// Every lane of a warp in the same batch (clip counts summed across the warp).
#define WARP_BATCH (SPECTRA % 32 == 0)
// Where a lane's four slots are consecutive (VEC), its words are staged in shared memory by
// `cp.async`, DEPTH k-steps in flight per warp (a ring of DEPTH × 1 KiB per warp at 8 bits):
// with the words held in registers instead, two k-steps in flight per warp left the kernel
// waiting on loads (long-scoreboard stalls 7.6 of 12.5 cycles per instruction, DRAM 38 % busy).
// DEPTH comes from the host, which sizes the ring.
// Otherwise the words are loaded into registers, UNROLL k-steps (a group) at a time, registers
// holding two groups. Before sm_90 ptxas spilled two groups of two 8-bit k-steps beside two
// tiles' accumulators at some shapes, and one group of 4-bit ones at another.
#if BT == 1
#define UNROLL 4
#elif __CUDA_ARCH__ >= 900 || IN_BITS == 4
#define UNROLL 2
#else
#define UNROLL 1
#endif
// KS ≤ 32: the staged path keeps a presence bit per (k-step, half) in a u64.
#if BT * KS > 40 || BT < 1 || KS < 1 || KS > 32
#error "BT tiles × KS k-steps of digits must fit 30 KiB, and KS ≤ 32"
#endif

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

// `dsp::random::mix`.
__device__ __forceinline__ u64 mix(u64 seed, u64 stream, u64 index)
{
    u64 z = seed + stream * 0xd1b54a32d192ed03ull + index * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// `dsp::random::dither_f32`: the top 24 bits, exact in float.
__device__ __forceinline__ float dither_f32(u64 bits)
{
    return __fsub_rn(__fmul_rn((float)(unsigned int)(bits >> 40), 1.0f / 16777216.0f), 0.5f);
}

// `dsp::postproc::quantise` with qmax 127: round half to even after clamping.
__device__ __forceinline__ int quantise(float v, float u, bool *clipped)
{
    const float x = __fadd_rn(v, u);
    *clipped = !(x >= -127.0f && x <= 127.0f);
    return (int)rintf(fminf(fmaxf(x, -127.0f), 127.0f));
}

#if IN_BITS == 8
#define WORD_BYTES 4
// One (antenna, spectrum)'s word: (re0, im0, re1, im1) int8.
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return __ldg(reinterpret_cast<const u32 *>(p));
}
#elif IN_BITS == 4
// One byte per complex value, re in the high nibble: widened to the 8-bit word.
__device__ __forceinline__ u32 widen(u32 v)
{
    const int p0 = (signed char)(v & 0xff), p1 = (signed char)(v >> 8);
    const u32 re0 = (p0 >> 4) & 0xff, im0 = ((signed char)(p0 << 4) >> 4) & 0xff;
    const u32 re1 = (p1 >> 4) & 0xff, im1 = ((signed char)(p1 << 4) >> 4) & 0xff;
    return re0 | im0 << 8 | re1 << 16 | im1 << 24;
}
#define WORD_BYTES 2
// Four consecutive spectra's bytes as words.
__device__ __forceinline__ uint4 as_words(uint2 v)
{
    return make_uint4(widen(v.x & 0xffff), widen(v.x >> 16), widen(v.y & 0xffff), widen(v.y >> 16));
}
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return widen(__ldg(reinterpret_cast<const unsigned short *>(p)));
}
#else
#error "IN_BITS must be 8 or 4"
#endif
// Bytes from one antenna's samples to the next's.
#define ANT_STRIDE ((i64)CHANNELS * SPECTRA * WORD_BYTES)

// Where a lane's four slots of one 32-slot slab lie. Slab k holds slots 32k … 32k + 31 of the
// (batch, spectrum) slots laid end to end; lane g's are 32k + 4g … 32k + 4g + 3.
struct Slab
{
    const unsigned char *in;      // antenna 0's word at the first slot
    const unsigned char *present; // the first slot's batch's presence flags
#if VEC
    // The four slots are spectra spec … spec + 3 of one batch, all valid or none.
    int batch, spec;
    bool valid;
    __device__ int batch_of(int) const { return batch; }
    __device__ int spec_of(int i) const { return spec + i; }
    __device__ bool valid_at(int) const { return valid; }
#else
    int batch[4], spec[4];
    bool valid[4];
    i64 offset[4]; // each slot's word from `in`
    const unsigned char *present_at[4];
    __device__ int batch_of(int i) const { return batch[i]; }
    __device__ int spec_of(int i) const { return spec[i]; }
    __device__ bool valid_at(int i) const { return valid[i]; }
#endif
};

__device__ __forceinline__ Slab slab_at(const unsigned char *in, const unsigned char *present, int c, int slab, int g)
{
    Slab s;
    const int f0 = slab * 32 + 4 * g;
#if VEC
    s.valid = f0 < SLOTS;
    s.batch = s.valid ? f0 / SPECTRA : 0;
    s.spec = f0 - s.batch * SPECTRA;
    s.in = in + (((i64)s.batch * N_ANTS * CHANNELS + c) * SPECTRA + s.spec) * WORD_BYTES;
    s.present = present + (i64)s.batch * N_ANTS;
#else
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        const int f = f0 + i;
        s.valid[i] = f < SLOTS;
        s.batch[i] = s.valid[i] ? f / SPECTRA : 0;
        s.spec[i] = f - s.batch[i] * SPECTRA;
    }
    s.in = in + (((i64)s.batch[0] * N_ANTS * CHANNELS + c) * SPECTRA + s.spec[0]) * WORD_BYTES;
    s.present = present + (i64)s.batch[0] * N_ANTS;
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        s.offset[i] = (((i64)(s.batch[i] - s.batch[0]) * N_ANTS * CHANNELS) * SPECTRA + s.spec[i] - s.spec[0]) * WORD_BYTES;
        s.present_at[i] = present + (i64)s.batch[i] * N_ANTS;
    }
#endif
    return s;
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint4 &a, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// 16 bytes from global to shared memory (`cp.async`, L1 bypassed: the table is read once per
// block).
__device__ __forceinline__ void copy16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

#if VEC
// 8 bytes from global to shared memory, or zeros where !keep (`src_bytes` 0: cp.async fills
// the rest).
__device__ __forceinline__ void copy8_or_zero(void *dst, const unsigned char *src, bool keep)
{
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(keep ? 8 : 0) : "memory");
}

// Bit 2·ks + h: antenna a0 + 8·ks + 4·h + q exists, is present in the lane's batch, and its
// slots are valid. Once per antenna batch.
__device__ __forceinline__ u64 presence_bits(const Slab &s, int a0, int nks, int q, int lane)
{
    u64 bits = 0;
#if WARP_BATCH
    // The warp's slots are one batch: its lanes load 32 antennas' flags at a time and share
    // them by ballot (an antenna and the three after it never straddle two masks).
    u32 mask[(8 * KS + 31) / 32];
#pragma unroll
    for (int m = 0; m < (8 * KS + 31) / 32; ++m)
    {
        const int a = a0 + 32 * m + lane;
        mask[m] = __ballot_sync(~0u, a < N_ANTS && 32 * m + lane < 8 * nks && s.valid && __ldg(s.present + a));
    }
#pragma unroll
    for (int k = 0; k < 2 * KS; ++k)
    {
        const int o = 8 * (k >> 1) + 4 * (k & 1);
        bits |= (u64)((mask[o >> 5] >> ((o & 31) + q)) & 1) << k;
    }
#else
#pragma unroll
    for (int k = 0; k < 2 * KS; ++k)
    {
        const int a = a0 + 8 * (k >> 1) + 4 * (k & 1) + q;
        if ((k >> 1) < nks && a < N_ANTS && s.valid && __ldg(s.present + a))
            bits |= 1ull << k;
    }
#endif
    return bits;
}

// A ring slot: a lane's words of one k-step. At 8 bits, already as its two A fragments
// (frag[j] = antenna q at slots 4g+2j, 4g+2j+1, then antenna q+4 at the same), so that one
// 16-byte shared load is an MMA operand: copied in 8-byte pieces, as each antenna's four slots
// are split between the fragments. At 4 bits, each antenna's four slots as they lie (h = 0 for
// antenna q, 1 for q+4), widened after the read.
#if IN_BITS == 8
typedef uint4 Slot[2][32];
#else
typedef uint2 Slot[2][32];
#endif

// Issue k-step ks's words (antennas a0 + 8·ks + q and + 4) into ring slot `slot`.
__device__ __forceinline__ void issue(Slot *ring, int slot, const Slab &s, int a0, int ks, u64 bits, int q,
                                      int lane)
{
#pragma unroll
    for (int h = 0; h < 2; ++h)
    {
        const bool keep = (bits >> (2 * ks + h)) & 1;
        const unsigned char *src = s.in + (keep ? (i64)(a0 + 8 * ks + 4 * h + q) * ANT_STRIDE : 0);
#if IN_BITS == 8
#pragma unroll
        for (int j = 0; j < 2; ++j)
            copy8_or_zero(reinterpret_cast<unsigned char *>(&ring[slot][j][lane]) + 8 * h, src + 8 * j, keep);
#else
        copy8_or_zero(&ring[slot][h][lane], src, keep);
#endif
    }
}

// The two A fragments of ring slot `slot`.
__device__ __forceinline__ void fragments(uint4 (&frag)[2], const Slot *ring, int slot, int lane)
{
#if IN_BITS == 8
    frag[0] = ring[slot][0][lane];
    frag[1] = ring[slot][1][lane];
#else
    const uint4 lo = as_words(ring[slot][0][lane]), hi = as_words(ring[slot][1][lane]);
    frag[0] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    frag[1] = make_uint4(lo.z, lo.w, hi.z, hi.w);
#endif
}
#else
// Antenna a's words at the lane's four slots (each its own batch and spectrum), zero past the
// last antenna, for an absent antenna and for slots past the end. The presence flags are
// applied after the loads, so that no load waits for another.
__device__ __forceinline__ uint4 load_antenna(const Slab &s, int a)
{
    uint4 r = make_uint4(0, 0, 0, 0);
    if (a < N_ANTS)
    {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = s.valid[i] ? word_at(s.in + (i64)a * ANT_STRIDE + s.offset[i]) : 0u;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] &= s.valid[i] && __ldg(s.present_at[i] + a) ? ~0u : 0u;
        r = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return r;
}

// The lane's words of k-steps ks0 … ks0 + UNROLL − 1 of the antenna batch from a0: antennas
// a0 + 8·ks + q (raw[u][0]) and a0 + 8·ks + 4 + q (raw[u][1]), zero past nks.
__device__ __forceinline__ void load_group(uint4 (&raw)[UNROLL][2], const Slab &s, int a0, int ks0, int nks, int q)
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
    {
        const bool in = ks0 + u < nks;
        const int a = a0 + 8 * (ks0 + u) + q;
        raw[u][0] = in ? load_antenna(s, a) : make_uint4(0, 0, 0, 0);
        raw[u][1] = in ? load_antenna(s, a + 4) : make_uint4(0, 0, 0, 0);
    }
}
#endif

// v (|v| ≤ 127·2¹⁶ − 128·2⁸ − 128 after the clamp) in balanced base 256: v = d₀·2¹⁶ + d₁·2⁸ + d₂,
// each an int8 (|d₀| ≤ 127), returned as three ints.
__device__ __forceinline__ void digits(float x, int (&d)[3])
{
    const int v = (int)rintf(fminf(fmaxf(x, -8290176.0f), 8290176.0f));
    d[2] = (signed char)(v & 0xff);
    const int v1 = (v - d[2]) >> 8;
    d[1] = (signed char)(v1 & 0xff);
    d[0] = (v1 - d[1]) >> 8;
}

// The digit table of one steering version: thread (c, t, ks, lane) writes lane (g, q)'s B
// fragments of beam tile t (beams 4t … 4t+3), k-step ks (antennas 8ks … 8ks+7) and channel c,
// for the three digits: table[(((c·NT + t)·NKS + ks)·3 + digit)·32 + lane] = (b0, b1), where b0
// covers antenna 8ks + q and b1 antenna 8ks + 4 + q, column g (beam 4t + g/2, re or im).
// weights: (beam, antenna) complex double; delays: (beam, antenna) double; pols and scales
// (2^s, see the header): per beam. The phase π·c·d is reduced modulo 2π in double (c·d may be
// hundreds of turns), the sine and cosine taken in float.
extern "C" __global__ void __launch_bounds__(256) beam_coeffs(
    const double2 *__restrict__ weights, const double *__restrict__ delays, const int *__restrict__ pols,
    const float *__restrict__ scales, uint2 *__restrict__ table)
{
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)CHANNELS * NT * NKS * 32)
        return;
    const int lane = (int)(i % 32), ks = (int)(i / 32 % NKS), t = (int)(i / (32 * NKS) % NT);
    const int c = (int)(i / (32 * NKS * NT));
    const int g = lane >> 2, q = lane & 3;
    const int b = 4 * t + (g >> 1);
    u32 frag[3][2] = {{0, 0}, {0, 0}, {0, 0}};
#pragma unroll
    for (int h = 0; h < 2; ++h)
    {
        const int a = 8 * ks + 4 * h + q;
        if (a >= N_ANTS || b >= N_BEAMS)
            continue;
        const double2 wab = weights[(i64)b * N_ANTS + a];
        double x = (double)c * delays[(i64)b * N_ANTS + a];
        x -= 2.0 * rint(0.5 * x); // e^{jπx} has period 2 in x
        float s, co;
        sincospif((float)x, &s, &co);
        const float sc = scales[b];
        const float vr = (float)wab.x * sc, vi = (float)wab.y * sc;
        const float wr = vr * co - vi * s, wi = vr * s + vi * co;
        // Column re takes (Wr, −Wi) of (xr, xi), column im (Wi, Wr).
        int dr[3], di[3];
        digits((g & 1) ? wi : wr, dr);
        digits((g & 1) ? wr : -wi, di);
        const int shift = pols[b] ? 16 : 0;
#pragma unroll
        for (int k = 0; k < 3; ++k)
            frag[k][h] = ((u32)(dr[k] & 0xff) | (u32)(di[k] & 0xff) << 8) << shift;
    }
#pragma unroll
    for (int k = 0; k < 3; ++k)
        table[((((i64)c * NT + t) * NKS + ks) * 3 + k) * 32 + lane] = make_uint2(frag[k][0], frag[k][1]);
}

// The digits of k-steps ks0 … ks0 + nks − 1 and beam tiles t0 … t0 + BT − 1 of channel c into
// shared memory, as coeff[ks][t][digit·32 + lane] (tiles past the last beam are left alone:
// `multiply` stops before them): one `cp.async` group, waited for by the caller.
__device__ __forceinline__ void stage(uint2 (&coeff)[KS][BT][PAIRS], const uint2 *__restrict__ table, int c, int t0,
                                      int ks0, int nks)
{
    // 16-byte pieces: PAIRS / 2 per (k-step, tile).
    const int per = PAIRS / 2, nt = min(BT, NT - t0);
    for (int i = threadIdx.x; i < nt * nks * per; i += THREADS)
    {
        const int t = i / (nks * per), ks = i / per % nks, p = i % per;
        const uint4 *src = reinterpret_cast<const uint4 *>(table + (((i64)c * NT + t0 + t) * NKS + ks0 + ks) * PAIRS);
        copy16(reinterpret_cast<uint4 *>(coeff[ks][t]) + p, src + p);
    }
    commit();
}

// One k-step: the lane's words are its A fragments as they are (frag[j] for m16 tile j: antenna
// q at slots 4g+2j and 4g+2j+1, antenna q+4 at the same); three MMAs (one per digit) per beam
// tile and m16 tile.
__device__ __forceinline__ void multiply(int (&acc)[BT][3][2][4], const uint4 (&frag)[2],
                                        const uint2 (&coeff)[KS][BT][PAIRS], int ks, int t0, int lane)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        if (t0 + t >= NT)
            break;
#pragma unroll
        for (int k = 0; k < 3; ++k)
        {
            const uint2 bq = coeff[ks][t][k * 32 + lane];
#pragma unroll
            for (int j = 0; j < 2; ++j)
                mma_s8(acc[t][k][j], frag[j], bq.x, bq.y);
        }
    }
}

// Undo the digits and the scale: y = (S₀·2¹⁶ + S₁·2⁸ + S₂)·2^−s, the low part rounded once in
// float (about 2⁻⁸ of y where the larger weights dominate; all of it where only small weights,
// d₀ = 0, contribute) and S₀ exact below 512 antennas, so y carries one or two float roundings,
// about 2⁻²³ of it, as the oracle's own conversion of its double sum does. All tiles first, so that the int32 accumulators are dead before the dither's
// 64-bit arithmetic needs registers.
__device__ __forceinline__ void combine(float (&v)[BT][2][4], const int (&acc)[BT][3][2][4], int t0, int q,
                                        const float *__restrict__ scales)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        const int b = 4 * (t0 + t) + q;
        // 2^−s, and the digits' weights 2¹⁶ and 2⁸ folded in: powers of two, so exact.
        const float inv = b < N_BEAMS ? 1.0f / scales[b] : 0.0f;
        const float w0 = inv * 65536.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int p = 0; p < 4; ++p)
            {
#if N_ANTS < 256
                // |S₁| ≤ 2¹⁵·N_ANTS, so S₁·2⁸ + S₂ is exact in int32: one conversion fewer.
                const float low = (float)(acc[t][1][j][p] * 256 + acc[t][2][j][p]) * inv;
#else
                const float low = fmaf((float)acc[t][1][j][p], inv * 256.0f, (float)acc[t][2][j][p] * inv);
#endif
                v[t][j][p] = fmaf((float)acc[t][0][j][p], w0, low);
            }
    }
}

// Lane (g, q) holds beam 4(t0 + t) + q at its four slots: slot 4g + 2j + r is (v[t][j][2r],
// v[t][j][2r + 1]). Dither, quantise, store, count clips.
__device__ __forceinline__ void finish(const float (&v)[BT][2][4], const Slab &sl, int t0, int c, int g, int q,
                                       const u64 *__restrict__ seeds, const int *__restrict__ dithered,
                                       signed char *__restrict__ out, u64 *__restrict__ clips, i64 first,
                                       i64 batch_step, i64 spectrum_step)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        if (t0 + t >= NT)
            break;
        const int b = 4 * (t0 + t) + q;
        const bool beam = b < N_BEAMS;
        const bool dither = beam && dithered[b];
        const u64 seed = beam ? seeds[b] : 0;
        u32 packed[2] = {0, 0};
        int clipped[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
        {
            const int j = i >> 1, r = i & 1;
            float u0 = 0.0f, u1 = 0.0f;
            if (dither && sl.valid_at(i))
            {
                const u64 stream = (u64)(first + sl.batch_of(i) * batch_step + (i64)sl.spec_of(i) * spectrum_step) << 1;
                u0 = dither_f32(mix(seed, stream, (u64)c));
                u1 = dither_f32(mix(seed, stream | 1, (u64)c));
            }
            bool c0, c1;
            const int re = quantise(v[t][j][2 * r], u0, &c0);
            const int im = quantise(v[t][j][2 * r + 1], u1, &c1);
            clipped[i] = beam && sl.valid_at(i) && (c0 || c1);
            packed[i >> 1] |= ((u32)(re & 0xff) | (u32)(im & 0xff) << 8) << (16 * (i & 1));
        }
        if (beam)
        {
#if VEC
            if (sl.valid)
                *reinterpret_cast<uint2 *>(out + 2 * ((((i64)sl.batch * N_BEAMS + b) * CHANNELS + c) * SPECTRA + sl.spec)) =
                    make_uint2(packed[0], packed[1]);
#else
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (sl.valid[i])
                    *reinterpret_cast<unsigned short *>(out + 2 * ((((i64)sl.batch[i] * N_BEAMS + b) * CHANNELS + c) * SPECTRA + sl.spec[i])) =
                        (unsigned short)(packed[i >> 1] >> (16 * (i & 1)));
#endif
        }
#if WARP_BATCH
        // The warp's 32 slots are one batch: the 8 lanes of beam q sum their counts.
        int n = clipped[0] + clipped[1] + clipped[2] + clipped[3];
        n += __shfl_xor_sync(0xffffffffu, n, 4);
        n += __shfl_xor_sync(0xffffffffu, n, 8);
        n += __shfl_xor_sync(0xffffffffu, n, 16);
        if (g == 0 && n)
            atomicAdd(&clips[(i64)sl.batch_of(0) * N_BEAMS + b], (u64)n);
#else
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (clipped[i])
                atomicAdd(&clips[(i64)sl.batch_of(i) * N_BEAMS + b], 1ull);
#endif
    }
}

// Accumulate the antenna batch from k-step ks0 (nks k-steps) into acc, with the digits staged
// first (the previous batch's are no longer read once every warp has passed the first barrier).
__device__ __forceinline__ void accumulate(int (&acc)[BT][3][2][4], uint2 (&coeff)[KS][BT][PAIRS],
                                           const uint2 *__restrict__ table, const Slab &slab, int c, int t0,
                                           int ks0, int nks, int q, int lane, void *ring_mem)
{
    const int a0 = 8 * ks0;
#if VEC
    Slot *ring = reinterpret_cast<Slot *>(ring_mem) + (threadIdx.x >> 5) * DEPTH;
    const u64 bits = presence_bits(slab, a0, nks, q, lane);
    __syncthreads();
    stage(coeff, table, c, t0, ks0, nks);
    // DEPTH − 1 k-steps in flight before the first is used; one group committed per k-step
    // (empty past nks), so that `wait_group DEPTH − 1` always means "k-step k has landed" and,
    // before the loop, "the digits have landed".
#pragma unroll
    for (int k = 0; k < DEPTH - 1; ++k)
    {
        if (k < nks)
            issue(ring, k, slab, a0, k, bits, q, lane);
        commit();
    }
    for (int k = 0; k < nks; ++k)
    {
        if (k + DEPTH - 1 < nks)
            issue(ring, (k + DEPTH - 1) % DEPTH, slab, a0, k + DEPTH - 1, bits, q, lane);
        commit();
        asm volatile("cp.async.wait_group %0;\n" ::"n"(DEPTH - 1) : "memory");
        if (k == 0)
            __syncthreads(); // every thread's part of the digits has landed
        uint4 frag[2];
        fragments(frag, ring, k % DEPTH, lane);
        multiply(acc, frag, coeff, k, t0, lane);
    }
#else
    uint4 raw[UNROLL][2];
    load_group(raw, slab, a0, 0, nks, q);
    __syncthreads();
    stage(coeff, table, c, t0, ks0, nks);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    for (int k0 = 0; k0 < nks; k0 += UNROLL)
    {
        uint4 now[UNROLL][2];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
        {
            now[u][0] = raw[u][0];
            now[u][1] = raw[u][1];
        }
        if (k0 + UNROLL < nks)
            load_group(raw, slab, a0, k0 + UNROLL, nks, q);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (k0 + u < nks)
            {
                const uint4 frag[2] = {make_uint4(now[u][0].x, now[u][0].y, now[u][1].x, now[u][1].y),
                                       make_uint4(now[u][0].z, now[u][0].w, now[u][1].z, now[u][1].w)};
                multiply(acc, frag, coeff, k0 + u, t0, lane);
            }
    }
#endif
}

// table: `beam_coeffs`'s digits; scales (2^s): per beam. present: (batch, antenna) u8. seeds:
// per beam, the dither seed + beam index; dithered: per beam, 1 to dither. Spectrum t of batch
// i has timestamp first + i·batch_step + t·spectrum_step. Dynamic shared memory: the ring,
// WARPS × DEPTH Slots where VEC, none otherwise.
//
// A block takes channel blockIdx.y and WARPS slabs, a warp one.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) beamform(
    const unsigned char *__restrict__ in, const uint2 *__restrict__ table, const float *__restrict__ scales,
    const unsigned char *__restrict__ present, const u64 *__restrict__ seeds, const int *__restrict__ dithered,
    signed char *__restrict__ out, u64 *__restrict__ clips, i64 first, i64 batch_step, i64 spectrum_step)
{
    __shared__ __align__(16) uint2 coeff[KS][BT][PAIRS];
    extern __shared__ __align__(16) unsigned char ring_mem[];
    const int c = blockIdx.y;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const Slab slab = slab_at(in, present, c, blockIdx.x * WARPS + (threadIdx.x >> 5), g);

    for (int t0 = 0; t0 < NT; t0 += BT)
    {
        int acc[BT][3][2][4];
#pragma unroll
        for (int t = 0; t < BT; ++t)
#pragma unroll
            for (int k = 0; k < 3; ++k)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int p = 0; p < 4; ++p)
                        acc[t][k][j][p] = 0;
        for (int ks0 = 0; ks0 < NKS; ks0 += KS)
            accumulate(acc, coeff, table, slab, c, t0, ks0, min(KS, NKS - ks0), q, lane, ring_mem);
        float v[BT][2][4];
        combine(v, acc, t0, q, scales);
        finish(v, slab, t0, c, g, q, seeds, dithered, out, clips, first, batch_step, spectrum_step);
    }
}
