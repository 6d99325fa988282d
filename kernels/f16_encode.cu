// float32 rows to float16 heap bytes on the device (src/gpu/f16_encode.rs): out = fp16(x·s_r),
// s_r the row's scale, saturated at ±65504 and rounded to nearest even, little-endian, with
// the count of saturated values added to `clips`. The same bits as the host's
// `dsp::frb_fast::encode_f16` (the product in float32, the clamp, one rounding; NaN stays a
// NaN, though its payload may differ), which the self-test checks value by value.
//
// Mapping: blockIdx.y is the row (its scale read once), a grid-stride loop along it; the
// saturated values are counted by warp ballots, one atomic per warp that saw any. No
// cuda_fp16.h (NVRTC has no include path for it): the conversion is one PTX instruction.
extern "C" __global__ void f16_encode(const float *__restrict__ in, const float *__restrict__ scales,
                                      unsigned short *__restrict__ out, unsigned long long *__restrict__ clips,
                                      long long row_len)
{
    const float s = scales[blockIdx.y];
    const float *x = in + (long long)blockIdx.y * row_len;
    unsigned short *o = out + (long long)blockIdx.y * row_len;
    unsigned int over = 0;
    // Every lane runs the same number of iterations (the bound is rounded up to whole warps),
    // so the ballots below see the full warp.
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i - threadIdx.x % 32 < row_len; i += stride) {
        const bool in_row = i < row_len;
        const float y = in_row ? __fmul_rn(x[i], s) : 0.0f;
        const bool sat = fabsf(y) > 65504.0f;
        const float v = sat ? copysignf(65504.0f, y) : y;
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
        if (in_row)
            o[i] = h;
        over += __popc(__ballot_sync(0xffffffffu, in_row && sat));
    }
    if (threadIdx.x % 32 == 0 && over != 0)
        atomicAdd(clips, (unsigned long long)over);
}
