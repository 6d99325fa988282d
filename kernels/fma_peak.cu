// The fp32 arithmetic ceiling the DDC kernel is compared with (bench/gpu_ddc.rs; METHOD.md "two
// numbers first"): a saturating loop of fused multiply-adds, 8 independent chains per thread
// so that the pipe never waits on a result. Each chain converges to 1 (no overflow, no
// denormals), and the sum of the chains is written so that nothing is dropped.

extern "C" __global__ void __launch_bounds__(256) fma_peak(float *__restrict__ out, float seed, int iters)
{
    float a[8];
#pragma unroll
    for (int k = 0; k < 8; ++k)
        a[k] = seed * (float)(threadIdx.x + k + 1);
    const float m = 0.999f - 1e-9f * seed, c = 0.001f;
#pragma unroll 4
    for (int it = 0; it < iters; ++it)
    {
#pragma unroll
        for (int k = 0; k < 8; ++k)
            a[k] = fmaf(a[k], m, c);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k)
        s += a[k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
