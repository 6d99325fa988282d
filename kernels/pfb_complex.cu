// The narrowband PFB FIR (seed 000 §Narrowband step 4): the real weights of an M-point
// filterbank applied to the complex DDC output, real and imaginary parts alike. Mirrors
// `dsp::ddc::complex_pfb_fir`; `cbf selftest --gpu` compares the narrowband backends.
//
// Compile-time constants (-D): FFT_LEN (M), TAPS, SPECTRA (frames per polarisation in the
// frames buffer).
//
//   frame[i] = Σ_{t<TAPS} w[t·M + i] · x[start + t·M + i]
//
// One launch computes `count` consecutive spectra (frame slots k, k+1, ...) of one or both
// polarisations (blockIdx.z) whose windows start at DDC outputs start, start + M, ... (one
// coarse delay: the caller splits a run where it changes). A thread owns column i for
// `section` spectra and keeps the FIR's window in registers, so each input value is read once
// per section. Each tap is a product and a sum, each rounded, in tap order from 0, as the oracle
// does them (no fused multiply-add), so the two agree bit for bit.

typedef long long i64;

#define BLOCK 256

extern "C" __global__ void __launch_bounds__(BLOCK) pfb_complex(
    float2 *__restrict__ frames,       // [pol][SPECTRA][M]
    const float2 *__restrict__ x,      // [pol][x_stride] DDC output
    const float *__restrict__ w,       // [TAPS][M]
    i64 x_stride,
    i64 start0,
    i64 start1,
    int first_pol,
    int k,
    int count,
    int section)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= FFT_LEN)
        return;
    const int pol = first_pol + blockIdx.z;
    const int s0 = blockIdx.y * section;
    const int n = min(section, count - s0);
    if (n <= 0)
        return;
    float wt[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; t++)
        wt[t] = w[t * FFT_LEN + i];
    const float2 *__restrict__ src = x + pol * x_stride + (pol ? start1 : start0) + (i64)s0 * FFT_LEN + i;
    float2 *__restrict__ dst = frames + ((i64)pol * SPECTRA + k + s0) * FFT_LEN + i;
    // The window: TAPS values of column i, shifted by one row per spectrum.
    float2 win[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS - 1; t++)
        win[t] = src[(i64)t * FFT_LEN];
    for (int s = 0; s < n; s++)
    {
        win[TAPS - 1] = src[(i64)(s + TAPS - 1) * FFT_LEN];
        float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int t = 0; t < TAPS; t++)
        {
            acc.x = __fadd_rn(acc.x, __fmul_rn(win[t].x, wt[t]));
            acc.y = __fadd_rn(acc.y, __fmul_rn(win[t].y, wt[t]));
        }
        dst[(i64)s * FFT_LEN] = acc;
#pragma unroll
        for (int t = 0; t < TAPS - 1; t++)
            win[t] = win[t + 1];
    }
}
