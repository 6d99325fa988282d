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
// **Why tensor cores.** Seed 003's kernel multiplies on the CUDA cores: four FMAs per antenna,
// beam and sample, plus a coefficient read and a polarisation select. On the H100 that version
// reached 1.3 T complex MACs/s, 22 % of the copy bandwidth at MeerKAT's 8 beams, latency- and
// issue-bound, not DRAM-bound. Here a channel's beamforming is a real GEMM on fp16 `mma.sync`
// m16n8k16 with fp32 accumulation, so each input byte costs about one instruction of conversion
// and the multiplies cost next to nothing at few beams:
//
//   D (16 times × 8 columns) += A (16 times × 16 k) · B (16 k × 8 columns)
//
// - k (one "k-step"): 4 antennas × 2 pols × (re, im). Lane (g, q) = (lane / 4, lane % 4) holds,
//   in A, k = 2q, 2q+1 (antenna q, pol 0, re and im) and k = 2q+8, 2q+9 (antenna q, pol 1): the
//   four bytes of one input word, converted by byte permutes (no int-to-float instruction).
// - Rows: a warp takes 32 consecutive (batch, spectrum) slots as two m16 tiles; lane g's rows
//   g and g+8 of tile j are slots 4g+2j and 4g+2j+1, so a lane's four slots are consecutive and
//   its k-step is one 16-byte load (4-bit input: 8 bytes).
// - Columns: 4 beams × (re, im). B holds (Wr, −Wi) in a beam's re column and (Wi, Wr) in its im
//   column, in the rows of the beam's polarisation, zeros in the other's: half the products are
//   zeros, which costs nothing that limits this kernel, and no polarisation select is needed.
//   Lane (g, q)'s D values are beam q's re and im at its four slots: one 8-byte store.
// - **Precision.** fp16 weights alone would put every output off by ~1e-2 LSB (2⁻¹² relative
//   rounding over ~100 terms of ~100), flipping a quantisation in ~1 % of values. Each weight is
//   therefore split into hi + lo fp16 parts (lo = the rounding error of hi, so their sum carries
//   ~22 bits), two MMAs per tile, and scaled per beam by a power of two (`scales`: |w|·2^s ≤ 2¹⁴)
//   so that the parts are normal numbers; the samples are exact in fp16 and every product exact
//   in the fp32 accumulator. The sums are then within a few fp32 roundings of the oracle's
//   double ones, as the CUDA-core kernel's were: a value whose sum lies within that of a
//   quantisation boundary may round the other way, ±1 LSB, rarely and unbiased (the self-test
//   bounds count and bias).
//
// Coefficients depend only on (antenna, beam, channel): they are generated in the kernel per
// antenna batch (KS k-steps) and beam batch (BT tiles of 4 beams) into shared memory, already in
// the B-fragment order (a 16-byte hi/lo quad per lane, read conflict-free), with a barrier between
// generating and applying them. Beams beyond a batch are taken in an outer loop (seed 003 §Higher
// beam counts); the input is then read again, mostly from L2. The phase π·c·d is reduced modulo
// 2π in double (c·d may be hundreds of turns), the sine and cosine taken in float.
//
// Missing antennas: the presence flag (batch, antenna) zeroes the lane's input word, so absent
// antennas add exact zeros.
//
// Compile-time constants (-D): N_ANTS, CHANNELS, SPECTRA, BATCHES, N_BEAMS, IN_BITS (8 or 4),
// THREADS (a multiple of 32: one warp per 32-slot slab), BT, KS (below).

// The host picks the blocking (`BeamformConfig::defines`) and passes it: BT tiles of 4 beams per
// beam batch (8 accumulators each per lane), KS k-steps per antenna batch (BT·KS ≤ 64: at most
// 32 KiB of coefficients).
#define WARPS (THREADS / 32)
#define SLOTS (BATCHES * SPECTRA)
// A lane's four slots are one batch's consecutive spectra, loaded and stored as one vector.
#define VEC (SPECTRA % 4 == 0)
// Every lane of a warp in the same batch (clip counts summed across the warp).
#define WARP_BATCH (SPECTRA % 32 == 0)
// k-steps whose loads are issued together (a group); registers hold two groups.
#define UNROLL (BT > 2 ? 2 : 4)
#if BT * KS > 64 || BT < 1 || KS < 1
#error "BT tiles × KS k-steps of coefficients must fit 32 KiB"
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

// Two floats rounded to fp16 (nearest even), `lo` in the low half. (No cuda_fp16.h: NVRTC has
// no include path for it.)
__device__ __forceinline__ u32 pack(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float half_lo(u32 h)
{
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(h));
    return f;
}

__device__ __forceinline__ float half_hi(u32 h)
{
    float f;
    asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(h));
    return f;
}

// (x, y) as hi + lo fp16 pairs: lo is the rounding error of hi.
__device__ __forceinline__ void split(float x, float y, u32 *hi, u32 *lo)
{
    *hi = pack(x, y);
    *lo = pack(x - half_lo(*hi), y - half_hi(*hi));
}

// Bytes 0 and 1 (selector 0x4140) or 2 and 3 (0x4342) of a word of int8 samples as an fp16
// pair: with the sign bit flipped a byte is u = x + 128, and 0x64uu is the fp16 1024 + u, so
// one permute and one exact subtraction of 1152 give x.
__device__ __forceinline__ u32 to_half2(u32 flipped, u32 sel)
{
    const u32 h = __byte_perm(flipped, 0x64646464u, sel);
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(0x64806480u));
    return r;
}

__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#if IN_BITS == 8
#define WORD_BYTES 4
// One (antenna, spectrum)'s word: (re0, im0, re1, im1) int8.
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return __ldg(reinterpret_cast<const u32 *>(p));
}
// Four consecutive spectra's words.
__device__ __forceinline__ uint4 words_at(const unsigned char *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
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
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return widen(__ldg(reinterpret_cast<const unsigned short *>(p)));
}
__device__ __forceinline__ uint4 words_at(const unsigned char *p)
{
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    return make_uint4(widen(v.x & 0xffff), widen(v.x >> 16), widen(v.y & 0xffff), widen(v.y >> 16));
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

// The lane's words of k-steps ks0 … ks0 + UNROLL − 1 (antenna a0 + 4·ks + q), zero past nks, past
// the last antenna, for absent antennas and for slots past the end. The loads come first and
// the presence flags are applied after, so that no load waits for another.
__device__ __forceinline__ void load_group(uint4 (&raw)[UNROLL], const Slab &s, int a0, int ks0, int nks, int q)
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
    {
        const int a = a0 + 4 * (ks0 + u) + q;
        raw[u] = make_uint4(0, 0, 0, 0);
        if (ks0 + u < nks && a < N_ANTS)
        {
#if VEC
            if (s.valid)
            {
                const uint4 v = words_at(s.in + (i64)a * ANT_STRIDE);
                const u32 keep = __ldg(s.present + a) ? ~0u : 0u;
                raw[u] = make_uint4(v.x & keep, v.y & keep, v.z & keep, v.w & keep);
            }
#else
            u32 w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                w[i] = s.valid[i] ? word_at(s.in + (i64)a * ANT_STRIDE + s.offset[i]) : 0u;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                w[i] &= s.valid[i] && __ldg(s.present_at[i] + a) ? ~0u : 0u;
            raw[u] = make_uint4(w[0], w[1], w[2], w[3]);
#endif
        }
    }
}

// W for antennas a0 … a0 + 4·KS − 1 and beams b0 … b0 + 4·BT − 1 of channel c, scaled, split and
// placed in B-fragment order: coeff[ks][t][lane] is lane (g, q)'s (hi b0, hi b1, lo b0, lo b1)
// for column g (beam 4t + g/2, re or im) and antenna 4·ks + q. Consecutive threads take
// consecutive antennas of one beam, so the reads of w and d coalesce.
__device__ __forceinline__ void generate(uint4 (&coeff)[KS][BT][32], const double2 *__restrict__ weights,
                                         const double *__restrict__ delays, const int *__restrict__ pols,
                                         const float *__restrict__ scales, int c, int a0, int b0)
{
    for (int i = threadIdx.x; i < 16 * KS * BT; i += THREADS)
    {
        const int lb = i / (4 * KS), la = i % (4 * KS);
        const int a = a0 + la, b = b0 + lb;
        float wr = 0.0f, wi = 0.0f;
        int pol = 0;
        if (a < N_ANTS && b < N_BEAMS)
        {
            const double2 wab = weights[(i64)b * N_ANTS + a];
            double x = (double)c * delays[(i64)b * N_ANTS + a];
            x -= 2.0 * rint(0.5 * x); // e^{jπx} has period 2 in x
            float s, co;
            sincospif((float)x, &s, &co);
            const float sc = scales[b];
            const float vr = (float)wab.x * sc, vi = (float)wab.y * sc;
            wr = vr * co - vi * s;
            wi = vr * s + vi * co;
            pol = pols[b];
        }
        // Column re of beam lb % 4 takes (Wr, −Wi) of (xr, xi), column im (Wi, Wr).
        u32 hr, lr, hm, lm;
        split(wr, -wi, &hr, &lr);
        split(wi, wr, &hm, &lm);
        const int ks = la >> 2, t = lb >> 2, lre = 8 * (lb & 3) + (la & 3);
        coeff[ks][t][lre] = pol ? make_uint4(0, hr, 0, lr) : make_uint4(hr, 0, lr, 0);
        coeff[ks][t][lre + 4] = pol ? make_uint4(0, hm, 0, lm) : make_uint4(hm, 0, lm, 0);
    }
}

// One k-step's words (antennas 4·ks + q) to A fragments, and two MMAs (lo, hi) per tile and m16
// tile.
__device__ __forceinline__ void multiply(float (&acc)[BT][2][4], uint4 raw, const uint4 (&coeff)[KS][BT][32], int ks,
                                        int b0, int lane)
{
    const u32 w[4] = {raw.x ^ 0x80808080u, raw.y ^ 0x80808080u, raw.z ^ 0x80808080u, raw.w ^ 0x80808080u};
    u32 frag[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
    {
        frag[j][0] = to_half2(w[2 * j], 0x4140);
        frag[j][1] = to_half2(w[2 * j + 1], 0x4140);
        frag[j][2] = to_half2(w[2 * j], 0x4342);
        frag[j][3] = to_half2(w[2 * j + 1], 0x4342);
    }
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        if (b0 + 4 * t >= N_BEAMS)
            break;
        const uint4 bq = coeff[ks][t][lane];
#pragma unroll
        for (int j = 0; j < 2; ++j)
        {
            mma(acc[t][j], frag[j], bq.z, bq.w);
            mma(acc[t][j], frag[j], bq.x, bq.y);
        }
    }
}

// Lane (g, q) holds beam b0 + 4t + q at its four slots: slot 4g + 2j + r is
// (acc[t][j][2r], acc[t][j][2r + 1]). Dither, quantise, store, count clips.
__device__ __forceinline__ void finish(float (&acc)[BT][2][4], const Slab &sl, int b0, int c, int g, int q,
                                       const float *__restrict__ scales, const u64 *__restrict__ seeds,
                                       const int *__restrict__ dithered, signed char *__restrict__ out,
                                       u64 *__restrict__ clips, i64 first, i64 batch_step, i64 spectrum_step)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        const int b = b0 + 4 * t + q;
        if (b0 + 4 * t >= N_BEAMS)
            break;
        const bool beam = b < N_BEAMS;
        const float inv = beam ? 1.0f / scales[b] : 0.0f;
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
            const int re = quantise(acc[t][j][2 * r] * inv, u0, &c0);
            const int im = quantise(acc[t][j][2 * r + 1] * inv, u1, &c1);
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

// weights: (beam, antenna) complex double w_ab; delays: (beam, antenna) double d_ab; pols and
// scales (2^s, see above): per beam. present: (batch, antenna) u8. seeds: per beam, the dither
// seed + beam index; dithered: per beam, 1 to dither. Spectrum t of batch i has timestamp
// first + i·batch_step + t·spectrum_step.
//
// A block takes channel blockIdx.y and WARPS slabs, a warp one. Each group's loads are issued
// before the previous group is multiplied, and the first before the coefficients are generated,
// so that a warp has loads in flight while it computes. (Staging 16 k-steps per warp ahead in
// shared memory with `cp.async`, and several slabs per warp sharing one coefficient set, were
// both measured slower on the H100: bench/xbengine-notes.md.)
extern "C" __global__ void __launch_bounds__(THREADS, 2) beamform(
    const unsigned char *__restrict__ in, const double2 *__restrict__ weights,
    const double *__restrict__ delays, const int *__restrict__ pols,
    const float *__restrict__ scales, const unsigned char *__restrict__ present,
    const u64 *__restrict__ seeds, const int *__restrict__ dithered, signed char *__restrict__ out,
    u64 *__restrict__ clips, i64 first, i64 batch_step, i64 spectrum_step)
{
    __shared__ uint4 coeff[KS][BT][32];
    const int c = blockIdx.y;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const Slab slab = slab_at(in, present, c, blockIdx.x * WARPS + (threadIdx.x >> 5), g);

    for (int b0 = 0; b0 < N_BEAMS; b0 += 4 * BT)
    {
        float acc[BT][2][4];
#pragma unroll
        for (int t = 0; t < BT; ++t)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    acc[t][j][r] = 0.0f;

        for (int a0 = 0; a0 < N_ANTS; a0 += 4 * KS)
        {
            const int nks = min(KS, (N_ANTS - a0 + 3) / 4);
            uint4 raw[UNROLL];
            load_group(raw, slab, a0, 0, nks, q);
            __syncthreads(); // the previous batch's coefficients are no longer read
            generate(coeff, weights, delays, pols, scales, c, a0, b0);
            __syncthreads();
            for (int ks0 = 0; ks0 < nks; ks0 += UNROLL)
            {
                uint4 now[UNROLL];
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
                    now[u] = raw[u];
                if (ks0 + UNROLL < nks)
                    load_group(raw, slab, a0, ks0 + UNROLL, nks, q);
#pragma unroll
                for (int u = 0; u < UNROLL; ++u)
                    if (ks0 + u < nks)
                        multiply(acc, now[u], coeff, ks0 + u, b0, lane);
            }
        }
        finish(acc, slab, b0, c, g, q, scales, seeds, dithered, out, clips, first, batch_step, spectrum_step);
    }
}
