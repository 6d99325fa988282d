// Narrowband digital down-conversion: mixer, low-pass FIR and subsampling in one kernel (seed
// 000 §Down-conversion kernel, seed 002). Mirrors `dsp::ddc::ddc`; `cbf selftest --gpu`
// compares them with katgpucbf's tolerances.
//
// Compile-time constants (-D): SAMPLE_BITS (2..10, 12, 16), SUBSAMPLING (S), PB (taps per phase
// in one register block) and NPB (blocks: W = PB·NPB taps per phase, the filter zero-padded to
// W·S taps), COARSEN (C: consecutive outputs per thread), GROUPS (G: threads sharing one phase,
// a multiple of 32), SUBGROUP (SG: phases worked in parallel; a block is SG·G threads) and
// QTILE (rows of the span decoded at once, S or a multiple of SG: `DdcPlan::q_tile`).
//
// Output b of the block's O = G·C outputs starting at b0 is (seed 000, with k = p·S + q and the
// mixed weights z_k = h_k·e^{2πj·f·k} computed on the host):
//   y_b = e^{2πj·f·(t0 + S·b)} · Σ_{q<S} Σ_{p<W} x[S·(b + p) + q] · z_{p·S + q}.
// The block decodes its input span once into shared memory as S rows, row q holding
// x[S·(b0 + m) + q] for m < O + W − 1, so that a warp (one phase q, 32 consecutive threads) reads
// one row at stride C; QTILE rows at a time where S rows do not fit (large S), each tile
// decoded, summed over and then overwritten by the next. Thread (r, g) takes the phases q ≡ r (mod SG) and outputs b0 + g·C + i,
// keeps the C + PB − 1 samples of a register block (the sliding window of seed 000: each sample
// is read from shared memory once per block, for up to C outputs) and accumulates C complex
// sums. All 32 lanes of a warp read the same z, from global memory (one broadcast load). The
// SG partial sums of an output are then added through shared memory, and the output is mixed
// and written by consecutive threads.
//
// The mixer phase is a 32-bit fixed-point fraction of a cycle (seed 000 §Mixer signal): only the
// low 32 bits of t0 matter, and step·(t0 + S·b) wraps by whole cycles.
//
// Row padding: element m of a row is stored at m + m/32, which makes the stride-C reads of a
// warp conflict-free for C = 1, 2, 4, 8.

typedef long long i64;

#define W (PB * NPB)
#define BLOCK (SUBGROUP * GROUPS)
#define OUTS (GROUPS * COARSEN)
#define ROW_LEN (OUTS + W - 1)
// Floats per padded row; odd, so that the decode's stores (consecutive samples, consecutive
// rows) spread over the banks.
#define ROW_STRIDE ((ROW_LEN + ROW_LEN / 32 + 1) | 1)

// decode_at: kernels/decode.cuh, which `gpu::compile` puts before this file.

__device__ __forceinline__ int padded(int m)
{
    return m + (m >> 5);
}

// out: [pol][out_stride] complex outputs; in: polarisation p's packed samples at byte
// p·pol_stride, n_in samples each (samples past n_in read as zero); z: [q][W] complex mixed
// weights; t0: low 32 bits of the absolute index of each polarisation's first sample.
// Tiled spans (large S) with filters of two register blocks made ptxas settle on 32 registers
// and spill (S = 100, 1601 taps, C 4, G 64, SG 4); bounding it at 64 (1024 threads per SM)
// gives it room (56 there, 64 at most for C 8). Untiled spans keep ptxas's own choice.
#if QTILE < SUBSAMPLING
#define LAUNCH_BOUNDS __launch_bounds__(BLOCK, 1024 / BLOCK)
#else
#define LAUNCH_BOUNDS __launch_bounds__(BLOCK)
#endif

extern "C" __global__ void LAUNCH_BOUNDS ddc(
    float2 *__restrict__ out,
    const u8 *__restrict__ in,
    const float2 *__restrict__ z,
    i64 n_in,
    i64 pol_stride,
    i64 n_out,
    i64 out_stride,
    unsigned int t0_0,
    unsigned int t0_1,
    unsigned int step)
{
    extern __shared__ float smem[];
    const int pol = blockIdx.y;
    const i64 b0 = (i64)blockIdx.x * OUTS;
    const u8 *__restrict__ src = in + pol * pol_stride;

    const int r = threadIdx.x / GROUPS;
    const int g = threadIdx.x % GROUPS;
    float2 acc[COARSEN];
#pragma unroll
    for (int i = 0; i < COARSEN; i++)
        acc[i] = make_float2(0.0f, 0.0f);

    const i64 first = b0 * SUBSAMPLING;
#if QTILE < SUBSAMPLING
    for (int q0 = 0; q0 < SUBSAMPLING; q0 += QTILE)
#else
    // One tile: q0 a constant, so the decode is the plain run of samples it was before tiles
    // (the general indexing cost 16 % at S = 8).
    const int q0 = 0;
#endif
    {
        // Decode rows q0 … q0 + QTILE − 1 of the span: element (k, m) is sample
        // S·(b0 + m) + q0 + k, so consecutive threads take consecutive samples.
        if (q0 > 0)
            __syncthreads(); // the previous tile is no longer read
        for (int n = threadIdx.x; n < QTILE * ROW_LEN; n += BLOCK)
        {
            const int k = n % QTILE, m = n / QTILE;
            // m·S + k = n + m·(S − QTILE)
            const i64 at = first + q0 + n + (i64)m * (SUBSAMPLING - QTILE);
            int v = 0;
            if ((QTILE == SUBSAMPLING || q0 + k < SUBSAMPLING) && at < n_in)
            {
                const i64 bit = at * SAMPLE_BITS;
                v = decode_at(src + (bit >> 3), (int)(bit & 7));
            }
            smem[k * ROW_STRIDE + padded(m)] = (float)v;
        }
        __syncthreads();

        // QTILE is a multiple of SG (or S itself), so thread r takes its phases q ≡ r (mod SG)
        // in increasing order whatever the tiling, and the sums are the same bit for bit.
        for (int q = q0 + r; q < min(q0 + QTILE, SUBSAMPLING); q += SUBGROUP)
        {
            const float *__restrict__ row = smem + (q - q0) * ROW_STRIDE;
            const float2 *__restrict__ zq = z + q * W;
#pragma unroll 1
            for (int pb = 0; pb < NPB; pb++)
            {
                float xv[COARSEN + PB - 1];
#pragma unroll
                for (int u = 0; u < COARSEN + PB - 1; u++)
                    xv[u] = row[padded(g * COARSEN + pb * PB + u)];
#pragma unroll
                for (int p = 0; p < PB; p++)
                {
                    const float2 zz = __ldg(zq + pb * PB + p);
#pragma unroll
                    for (int i = 0; i < COARSEN; i++)
                    {
                        acc[i].x = fmaf(xv[i + p], zz.x, acc[i].x);
                        acc[i].y = fmaf(xv[i + p], zz.y, acc[i].y);
                    }
                }
            }
        }
    }

    // The SG partial sums of each output, through shared memory (the span is no longer read).
    __syncthreads();
    float2 *part = (float2 *)smem;
#pragma unroll
    for (int i = 0; i < COARSEN; i++)
        part[r * OUTS + g * COARSEN + i] = acc[i];
    __syncthreads();

    const unsigned int t0 = pol == 0 ? t0_0 : t0_1;
    for (int o = threadIdx.x; o < OUTS; o += BLOCK)
    {
        const i64 b = b0 + o;
        if (b >= n_out)
            break;
        float2 y = part[o];
#pragma unroll
        for (int k = 1; k < SUBGROUP; k++)
        {
            const float2 v = part[k * OUTS + o];
            y.x += v.x;
            y.y += v.y;
        }
        // e^{2πj·phase/2³²}: the phase read as a signed fraction of half-turns.
        const unsigned int phase = step * (t0 + (unsigned int)(SUBSAMPLING * b));
        float s, c;
        sincospif((float)(int)phase * 4.656612873077393e-10f, &s, &c);
        out[pol * out_stride + b] = make_float2(y.x * c - y.y * s, y.x * s + y.y * c);
    }
}
