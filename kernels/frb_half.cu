// The FRB second stage's fp16 operands (src/gpu/frb_half.rs): float32 intensities scaled by a
// power of two (exact) and rounded to the nearest fp16, saturated at ±65504 (the caller's
// bound on the intensities keeps them below it; stage 1 never writes NaN).
//
// Mapping: a grid-stride loop, one value per thread per step: reads of 4 bytes and writes of
// 2 bytes coalesce across a warp. Not taken: pairs (float2 → f16x2), which would halve the
// instructions but need 8-byte alignment of the caller's view; the conversion moves 6 bytes per
// intensity, a small fraction of the GEMMs' time. No cuda_fp16.h (NVRTC has no include path
// for it): the conversion is one PTX instruction.
extern "C" __global__ void frb_half(const float *__restrict__ in, unsigned short *__restrict__ out,
                                    float scale, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = fminf(fmaxf(in[i] * scale, -65504.0f), 65504.0f);
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
        out[i] = h;
    }
}
