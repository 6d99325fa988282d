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
// Mapping (seed 003 §GPU kernel): a block takes one channel and THREADS consecutive (batch,
// spectrum) pairs of it (batches laid end to end, so that heaps of few spectra still fill
// blocks), a thread one pair. Coefficients depend only on (antenna, beam, channel): they are
// generated in the kernel, per antenna batch of ANT_BATCH antennas and beam batch of BEAM_BATCH
// beams, into shared memory, with a barrier between generating and applying them; each thread
// loads an antenna's sample (both pols, one 32-bit word) once for every beam of the batch and
// keeps one complex float accumulator per beam in registers (loading a whole antenna batch
// into registers before generating the coefficients was measured slower: 421 against 284 µs). Beams beyond BEAM_BATCH are taken
// in an outer loop (seed 003 §Higher beam counts) so that registers never spill; the input is
// then read again, mostly from L2. An antenna absent from a thread's batch is skipped.
//
// Arithmetic: the phase π·c·d is reduced modulo 2π in double (c·d may be hundreds of turns), the
// sine and cosine taken in float, and the sums are in float (seed 003: single precision) where
// the oracle works in double throughout, so a value whose sum lies within float rounding of a
// quantisation boundary may round the other way: ±1 LSB, rarely, unbiased (the self-test bounds
// count and bias).
//
// Compile-time constants (-D): N_ANTS, CHANNELS, SPECTRA, BATCHES, N_BEAMS, IN_BITS (8 or 4),
// THREADS ((batch, spectrum) pairs per block, a multiple of 32).

#define ANT_BATCH 32
#define BEAM_BATCH (N_BEAMS < 16 ? N_BEAMS : 16)
// Antennas whose loads are in flight together per thread: two at few beams, one at more (ptxas
// spilled a few bytes at some shapes with four, and at 130 beams with two; the compile check
// builds every shape the self-test and the benchmark use).
#define ANT_UNROLL (BEAM_BATCH > 8 ? 1 : 2)

typedef unsigned long long u64;
typedef long long i64;

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

// The input as words of one complex sample of both pols (32 bits, or 16 of 4-bit values).
#if IN_BITS == 8
typedef unsigned int word_t;
#elif IN_BITS == 4
typedef unsigned short word_t;
#else
#error "IN_BITS must be 8 or 4"
#endif

// The raw bits as (re0, im0, re1, im1).
__device__ __forceinline__ float4 unpack(unsigned int r)
{
#if IN_BITS == 8
    return make_float4((signed char)r, (signed char)(r >> 8), (signed char)(r >> 16), (signed char)(r >> 24));
#else
    const signed char p0 = (signed char)r, p1 = (signed char)(r >> 8);
    return make_float4(p0 >> 4, (signed char)(p0 << 4) >> 4, p1 >> 4, (signed char)(p1 << 4) >> 4);
#endif
}

// weights: (beam, antenna) complex double w_ab; delays: (beam, antenna) double d_ab; pols: per
// beam. present: (batch, antenna) u8. seeds: per beam, the dither seed + beam index; dithered:
// per beam, 1 to dither. Spectrum t of batch i has timestamp first + i·batch_step + t·spectrum_step.
// n_ants: N_ANTS again, at run time (see below).
extern "C" __global__ void __launch_bounds__(THREADS) beamform(
    const unsigned char *__restrict__ in, const double2 *__restrict__ weights,
    const double *__restrict__ delays, const int *__restrict__ pols,
    const unsigned char *__restrict__ present, const u64 *__restrict__ seeds,
    const int *__restrict__ dithered, signed char *__restrict__ out, u64 *__restrict__ clips,
    i64 first, i64 batch_step, i64 spectrum_step, int n_ants)
{
    __shared__ float2 coeff[ANT_BATCH][BEAM_BATCH];
    const int c = blockIdx.y;
    const int f = blockIdx.x * THREADS + threadIdx.x;
    const bool active = f < BATCHES * SPECTRA;
    const int batch = active ? f / SPECTRA : 0;
    const int t = f - batch * SPECTRA;
    const i64 ts = first + batch * batch_step + (i64)t * spectrum_step;
    const unsigned char *pres = present + (i64)batch * N_ANTS;

    for (int b0 = 0; b0 < N_BEAMS; b0 += BEAM_BATCH)
    {
        const int nb = min(BEAM_BATCH, N_BEAMS - b0);
        float2 acc[BEAM_BATCH];
#pragma unroll
        for (int k = 0; k < BEAM_BATCH; ++k)
            acc[k] = make_float2(0.0f, 0.0f);
        // Beams are few and their pols uniform across the block: no divergence.
        unsigned int pol1 = 0;
        for (int k = 0; k < nb; ++k)
            pol1 |= (unsigned int)(pols[b0 + k] == 1) << k;

        for (int a0 = 0; a0 < N_ANTS; a0 += ANT_BATCH)
        {
            // n_ants == N_ANTS, passed at run time: with one antenna batch a constant count
            // here led ptxas into spilling kilobytes (19 antennas, 64 beams).
            const int na = min(ANT_BATCH, n_ants - a0);
            __syncthreads(); // the previous batch's coefficients are no longer read
            for (int i = threadIdx.x; i < ANT_BATCH * BEAM_BATCH; i += THREADS)
            {
                const int la = i / BEAM_BATCH, lb = i % BEAM_BATCH;
                const int a = a0 + la, b = b0 + lb;
                float2 w = make_float2(0.0f, 0.0f);
                if (la < na && lb < nb)
                {
                    const double2 wab = weights[(i64)b * N_ANTS + a];
                    double x = (double)c * delays[(i64)b * N_ANTS + a];
                    x -= 2.0 * rint(0.5 * x); // e^{jπx} has period 2 in x
                    float s, co;
                    sincospif((float)x, &s, &co);
                    const float wr = (float)wab.x, wi = (float)wab.y;
                    w = make_float2(wr * co - wi * s, wr * s + wi * co);
                }
                coeff[la][lb] = w;
            }
            __syncthreads();
            if (!active)
                continue;
            // This thread's sample of antenna a0, then one antenna-row further per antenna.
            const word_t *src = reinterpret_cast<const word_t *>(in) +
                                ((((i64)batch * N_ANTS + a0) * CHANNELS + c) * SPECTRA + t);
            const unsigned char *pa = pres + a0;
#pragma unroll ANT_UNROLL
            for (int la = 0; la < na; ++la)
            {
                // An absent antenna's sample is masked to zero (its terms add exact zeros);
                // the two loads are independent, so neither waits for the other.
                const unsigned int keep = __ldg(pa + la) ? ~0u : 0u;
                const float4 x = unpack(__ldg(src + la * (CHANNELS * SPECTRA)) & keep);
#pragma unroll
                for (int k = 0; k < BEAM_BATCH; ++k)
                {
                    const float2 w = coeff[la][k];
                    const bool p1 = (pol1 >> k) & 1;
                    const float xr = p1 ? x.z : x.x, xi = p1 ? x.w : x.y;
                    acc[k].x = fmaf(w.x, xr, fmaf(-w.y, xi, acc[k].x));
                    acc[k].y = fmaf(w.x, xi, fmaf(w.y, xr, acc[k].y));
                }
            }
        }
        if (active)
        {
            // Lanes of one batch count together (a warp may straddle two batches).
            const unsigned int mask = __activemask();
            const unsigned int same = __match_any_sync(mask, batch);
#pragma unroll
            for (int k = 0; k < BEAM_BATCH; ++k)
            {
                if (k >= nb)
                    break;
                const int b = b0 + k;
                float u0 = 0.0f, u1 = 0.0f;
                if (dithered[b])
                {
                    const u64 stream = (u64)ts << 1;
                    u0 = dither_f32(mix(seeds[b], stream, (u64)c));
                    u1 = dither_f32(mix(seeds[b], stream | 1, (u64)c));
                }
                bool c0, c1;
                const int re = quantise(acc[k].x, u0, &c0);
                const int im = quantise(acc[k].y, u1, &c1);
                const i64 o = (((i64)batch * N_BEAMS + b) * CHANNELS + c) * SPECTRA + t;
                reinterpret_cast<char2 *>(out)[o] = make_char2((signed char)re, (signed char)im);
                const unsigned int clipped = __ballot_sync(mask, c0 || c1) & same;
                if ((threadIdx.x & 31) == __ffs(same) - 1 && clipped)
                    atomicAdd(&clips[(i64)batch * N_BEAMS + b], (u64)__popc(clipped));
            }
        }
    }
}
