// Device-to-device copy with 16-byte accesses: the memory-bandwidth ceiling the F-engine's
// kernels are compared with (bench/gpu_fengine.rs; METHOD.md "two numbers first").
extern "C" __global__ void copy(float4 *__restrict__ dst, const float4 *__restrict__ src, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
