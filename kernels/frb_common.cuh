// The FRB first stage's device helpers that both of its kernels use (`gpu::compile` puts this
// file before kernels/frb_stage1.cu and kernels/frb_stage1_wgmma.cu, whose headers describe the
// data): the raw samples' copies, the weighted gridding of one sample, the |Ẽ|² sum with its
// roundings fixed, the output's rounding, and a block's time slots. Sizes come from the -D
// constants TB, D, CHANNELS, SPECTRA, BATCHES, T_DS and OUT_HALF.

typedef unsigned int u32;

#define TIMES (SPECTRA * BATCHES)
#define OUT_MAX ((TIMES + T_DS - 1) / T_DS) // output rows per channel: slots a call can end

// The slow-time slots of this block (frb_stage1.cu's header, "Time slots"): slot j covers call
// samples [begin(j), end(j)); a block takes slots j0 … j1 − 1 of the call's (frb_stage1.cu: block
// blockIdx.x the run blockIdx.x of `slots_per_block`).
struct Slots {
    int phase, j0, j1;

    __device__ __forceinline__ Slots(int phase, int slots_per_block) : phase(phase)
    {
        const int slots = (phase + TIMES + T_DS - 1) / T_DS;
        j0 = blockIdx.x * slots_per_block;
        j1 = min(j0 + slots_per_block, slots);
    }

    // Slots j0 … j1 − 1 of the call's (frb_stage1_wgmma.cu's runs of units).
    __device__ __forceinline__ Slots(int phase, int j0, int j1) : phase(phase), j0(j0), j1(j1)
    {
    }

    __device__ __forceinline__ int begin(int j) const
    {
        return max(0, j * T_DS - phase);
    }

    __device__ __forceinline__ int end(int j) const
    {
        return min(TIMES, (j + 1) * T_DS - phase);
    }
};

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async4(u32 dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

// sum + (re² + im²) with its roundings fixed: re² + im² by one fused multiply-add on the
// rounded im², then one rounded add (each term within 2·2⁻²⁴ of its value, the sum within
// 2⁻²⁴ per add). Written out so that ptxas cannot contract them its own way: it may fuse a
// plain multiply and add differently in two builds (the fp32 and fp16 outputs, or two register
// budgets), and the fp16 output must be the fp32 build's value rounded, bit for bit (one value
// in 80640 differed at 30×28, whose two outputs built at different blocks per SM).
__device__ __forceinline__ float add_power(float sum, float re, float im)
{
    return __fadd_rn(sum, fmaf(re, re, __fmul_rn(im, im)));
}

// The same sum by two fused multiply-adds, each rounded once (the exact squares summed: 2⁻²⁴
// per add), one instruction fewer: frb_stage1_wgmma.cu's form. (frb_stage1.cu keeps the
// three: with two its 32×24 build spilled and case 5 measured 1.5 % slower, bench/RESULTS.md
// 2026-11-28.) Either way the error bound's (4·t_ds + 2)·2⁻²⁴ of I covers the sums.
__device__ __forceinline__ float add_power_fma(float sum, float re, float im)
{
    return __fmaf_rn(im, im, __fmaf_rn(re, re, sum));
}

// Two floats rounded to fp16 (nearest even), `lo` in the low half. (No cuda_fp16.h: NVRTC has
// no include path for it, and nothing here needs more than this conversion.)
__device__ __forceinline__ u32 pack(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

#if OUT_HALF
typedef unsigned short out_t;
// scale·v saturated to fp16's range and rounded to the nearest fp16 (ties to even).
__device__ __forceinline__ out_t to_out(float v, float scale)
{
    const float s = fminf(fmaxf(v * scale, -65504.0f), 65504.0f);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(s));
    return h;
}
#else
typedef float out_t;
__device__ __forceinline__ out_t to_out(float v, float scale)
{
    return v * scale;
}
#endif

// Queue the raw samples t0 … t0+n−1 of every dish into raw (slot, tb) words: a thread per dish
// (its samples are consecutive in the chunk), four at a time where they start on a 16-byte
// boundary of one batch (one copy instead of four: the 4-byte copies and their addresses were a
// fifth of the kernel's instructions at seed 004 case 5, bench/RESULTS.md).
__device__ __forceinline__ void load_raw(u32 *raw, const u32 *__restrict__ in, const int *ds, int f, int t0, int n,
                                         int threads)
{
    for (int k = threadIdx.x; k < D; k += threads) {
        u32 *dst = raw + k * TB;
        const int d = ds[k];
        int tb = 0;
#if TB % 4 == 0 && SPECTRA % 4 == 0
        // s ≡ 0 (mod 4) and 4 | SPECTRA: the four lie in one batch, 16-byte aligned.
        for (; tb + 4 <= n; tb += 4) {
            const int t = t0 + tb, batch = t / SPECTRA, s = t % SPECTRA;
            if (s % 4 != 0)
                break;
            cp_async16(smem_addr(dst + tb), in + ((size_t)(batch * D + d) * CHANNELS + f) * SPECTRA + s);
        }
#endif
        for (; tb < n; tb++) {
            const int t = t0 + tb, batch = t / SPECTRA, s = t % SPECTRA;
            cp_async4(smem_addr(dst + tb), in + ((size_t)(batch * D + d) * CHANNELS + f) * SPECTRA + s);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// Times of a dish one gridding thread takes (its weights and cell read once for all of them).
#if TB % 4 == 0
#define GT 4
#elif TB % 2 == 0
#define GT 2
#else
#define GT 1
#endif

// re·a + im·b for the complex sample s = (re, im) (fp16 pair): one fp16 multiply, rounded, and
// one fused multiply-add, with re and im taken from s's halves.
__device__ __forceinline__ u32 cmul(u32 s, u32 a, u32 b)
{
    u32 r;
    asm("{\n.reg .f16 re, im;\n.reg .b32 rr, ii, t;\n"
        "mov.b32 {re, im}, %1;\n"
        "mov.b32 rr, {re, re};\n"
        "mov.b32 ii, {im, im};\n"
        "mul.rn.f16x2 t, rr, %2;\n"
        "fma.rn.f16x2 %0, ii, %3, t;\n}"
        : "=r"(r)
        : "r"(s), "r"(a), "r"(b));
    return r;
}

// Grid one raw sample (both pols) of a dish into X at x: W·E in fp16 pairs. `w` holds, per pol,
// (Wr, Wi) and (−Wi, Wr), so W·E = re·(Wr, Wi) + im·(−Wi, Wr). A sample byte b + 128 under the
// fp16 exponent of 1024 (bits 0x64xx) is 1024 + b + 128 exactly; subtracting 1152 leaves b,
// exactly. A byte permute and three fp16 pair operations (subtract, multiply, fused
// multiply-add) per pol replace four float conversions, four multiplies and a pack (the
// gridding was a third of the stall samples at seed 004 case 5, bench/RESULTS.md).
__device__ __forceinline__ void grid_sample(unsigned short *x, u32 raw, uint4 w, int pol_stride)
{
    const u32 biased = raw ^ 0x80808080u;
    u32 e0, e1;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(e0) : "r"(__byte_perm(biased, 0x6464u, 0x4140)), "r"(0x64806480u));
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(e1) : "r"(__byte_perm(biased, 0x6464u, 0x4342)), "r"(0x64806480u));
    *(u32 *)x = cmul(e0, w.x, w.y);
    *(u32 *)(x + pol_stride) = cmul(e1, w.z, w.w);
}


// Grid GT consecutive times of one dish slot: raw words r[0 … GT−1] (times tb … tb+GT−1 of the
// step, those from `n` on past its end and skipped) into X at x, `time_stride` halves between
// times and `pol_stride` between a time's two pols.
__device__ __forceinline__ void grid_times(unsigned short *x, const u32 *r, uint4 w, int tb, int n, int time_stride,
                                           int pol_stride)
{
#if GT == 4
    const uint4 v = *(const uint4 *)r;
    const u32 rw[4] = {v.x, v.y, v.z, v.w};
#elif GT == 2
    const uint2 v = *(const uint2 *)r;
    const u32 rw[2] = {v.x, v.y};
#else
    const u32 rw[1] = {r[0]};
#endif
#pragma unroll
    for (int k = 0; k < GT; k++)
        if (k == 0 || tb + k < n)
            grid_sample(x + k * time_stride, rw[k], w, pol_stride);
}
