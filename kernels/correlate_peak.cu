// The int8 tensor-core ceiling the correlator is compared with (bench/gpu_correlate.rs;
// METHOD.md "two numbers first"): a saturating loop of warp-level `mma.sync.m16n8k32` on
// register operands, 8 independent accumulator chains per warp so that the pipe never waits on
// a result. Each call of the inner body is 8 × 16 × 8 × 32 multiply-adds per warp.
// Operands come from `seed`, and the sum of the results is written so that nothing is dropped.

typedef unsigned int u32;

extern "C" __global__ void __launch_bounds__(256) corr_peak_mma(int *__restrict__ out, u32 seed, int iters)
{
    u32 a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        a[i] = seed * (threadIdx.x + 7 * i + 1);
    b[0] = seed ^ threadIdx.x;
    b[1] = seed + threadIdx.x;
    int d[8][4] = {};
    for (int it = 0; it < iters; ++it)
    {
#pragma unroll
        for (int k = 0; k < 8; ++k)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                         "{%8, %9}, {%0, %1, %2, %3};\n"
                         : "+r"(d[k][0]), "+r"(d[k][1]), "+r"(d[k][2]), "+r"(d[k][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
        s += d[k][0] + d[k][1] + d[k][2] + d[k][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
