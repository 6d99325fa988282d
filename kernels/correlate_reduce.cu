// The correlator's reduce (seed 001 §Accumulation: "the separate accumulators are added
// together ... converts from 64-bit to 32-bit integers, saturating"): sum N_ACC int64
// accumulators, saturate to ±(2³¹ − 1) counting each clipped re or im part, and write
// katgpucbf's missing marker (−2³¹, 1) into every baseline touching an antenna whose presence
// flag is 0. Mirrors `dsp::correlate::reduce` over the accumulators' sum.
//
// Compile-time constants (-D): N_ANTS, CHANNELS, N_ACC (accumulators summed).
//
// Mapping: one thread per (channel, baseline): 8 int64 values (4 products × re, im) read from
// each accumulator with 16-byte loads. Clip counts are summed in the warp and added with one
// 64-bit atomic per warp. When `clear` is non-zero the accumulators are zeroed as they are read
// (the next dump starts from zero without a separate memset pass).

#define THREADS 256
#define N_BASELINES (N_ANTS * (N_ANTS + 1) / 2)
#define VIS_LEN ((long long)CHANNELS * N_BASELINES * 8)

typedef long long i64;
typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(THREADS)
    corr_reduce(longlong2 *__restrict__ acc, const unsigned char *__restrict__ present, int *__restrict__ out,
                u64 *__restrict__ clips, int clear)
{
    const long long k = (long long)blockIdx.x * THREADS + threadIdx.x; // channel · N_BASELINES + bl
    unsigned n_clip = 0;
    if (k < (long long)CHANNELS * N_BASELINES)
    {
        const int bl = (int)(k % N_BASELINES);
        // a2 = the largest a with a(a + 1)/2 ≤ bl; the float guess is corrected exactly.
        int a2 = (int)((sqrtf(8.0f * bl + 1.0f) - 1.0f) * 0.5f);
        while (a2 * (a2 + 1) / 2 > bl)
            --a2;
        while ((a2 + 1) * (a2 + 2) / 2 <= bl)
            ++a2;
        const int a1 = bl - a2 * (a2 + 1) / 2;
        i64 sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 2 // left to the compiler, the hoisted loads spilled at N_ACC = 32
        for (int n = 0; n < N_ACC; ++n)
        {
            longlong2 *p = acc + (n * VIS_LEN + k * 8) / 2;
#pragma unroll
            for (int v = 0; v < 4; ++v)
            {
                longlong2 x = p[v];
                sum[2 * v] += x.x;
                sum[2 * v + 1] += x.y;
                if (clear)
                    p[v] = make_longlong2(0, 0);
            }
        }
        int4 *o = reinterpret_cast<int4 *>(out + k * 8);
        if (present[a1] && present[a2])
        {
            int r[8];
#pragma unroll
            for (int v = 0; v < 8; ++v)
            {
                const i64 lim = 2147483647LL;
                const i64 s = sum[v] > lim ? lim : (sum[v] < -lim ? -lim : sum[v]);
                n_clip += s != sum[v];
                r[v] = (int)s;
            }
            o[0] = make_int4(r[0], r[1], r[2], r[3]);
            o[1] = make_int4(r[4], r[5], r[6], r[7]);
        }
        else
        {
            const int m = -2147483647 - 1;
            o[0] = make_int4(m, 1, m, 1);
            o[1] = make_int4(m, 1, m, 1);
        }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1)
        n_clip += __shfl_xor_sync(0xffffffffu, n_clip, s);
    if (threadIdx.x % 32 == 0 && n_clip)
        atomicAdd(clips, (u64)n_clip);
}
