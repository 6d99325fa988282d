// Narrowband digital down-conversion: mixer, low-pass FIR and subsampling in one kernel (seed
// 000 §Down-conversion kernel, seed 002). Mirrors `dsp::ddc::ddc`; `cbf selftest --gpu`
// compares them with katgpucbf's tolerances.
//
// Compile-time constants (-D): SAMPLE_BITS (2..10, 12, 16), SUBSAMPLING (S), PB (taps per phase
// in one register block) and NPB (blocks: W = PB·NPB taps per phase, the filter zero-padded to
// W·S taps), COARSEN (C: consecutive outputs per thread), GROUPS (G: threads sharing one phase,
// a multiple of 32) and SUBGROUP (SG: phases worked in parallel; a block is SG·G threads).
//
// Output b of the block's O = G·C outputs starting at b0 is (seed 000, with k = p·S + q and the
// mixed weights z_k = h_k·e^{2πj·f·k} computed on the host):
//   y_b = e^{2πj·f·(t0 + S·b)} · Σ_{q<S} Σ_{p<W} x[S·(b + p) + q] · z_{p·S + q}.
// The block decodes its input span once into shared memory as S rows, row q holding
// x[S·(b0 + m) + q] for m < O + W − 1, so that a warp (one phase q, 32 consecutive threads) reads
// one row at stride C. Thread (r, g) takes the phases q ≡ r (mod SG) and outputs b0 + g·C + i,
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
extern "C" __global__ void __launch_bounds__(BLOCK) ddc(
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

    // Decode the span: samples S·b0 + n for n < S·ROW_LEN, sample n to row n % S, column n / S.
    const i64 first = b0 * SUBSAMPLING;
    for (int n = threadIdx.x; n < SUBSAMPLING * ROW_LEN; n += BLOCK)
    {
        const i64 g = first + n;
        int v = 0;
        if (g < n_in)
        {
            const i64 bit = g * SAMPLE_BITS;
            v = decode_at(src + (bit >> 3), (int)(bit & 7));
        }
        smem[(n % SUBSAMPLING) * ROW_STRIDE + padded(n / SUBSAMPLING)] = (float)v;
    }
    __syncthreads();

    const int r = threadIdx.x / GROUPS;
    const int g = threadIdx.x % GROUPS;
    float2 acc[COARSEN];
#pragma unroll
    for (int i = 0; i < COARSEN; i++)
        acc[i] = make_float2(0.0f, 0.0f);

    for (int q = r; q < SUBSAMPLING; q += SUBGROUP)
    {
        const float *__restrict__ row = smem + q * ROW_STRIDE;
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
