// The FRB second stage's resampling matrix for a list of beams (src/gpu/frb_weights.rs; seed 004
// §5.2 eq. 138 and §5.4 "Should we write a GPU kernel to compute W?": tracking beams re-point
// every t_k ~ 1 s, too often to upload a 4MN × B table): W_{(p,q),β} = U_p^M(θ_β)·U_q^N(θ′_β),
// each U by the cosine sum of eq. 7 in double exactly as dsp::frb::u_sum writes it, W as the
// double product of the two, then rounded once to the GEMM's operand type.
//
// ROWS = M, COLS = N: the dish grid; HALF = 1 writes the fp16 bits of 2^15·W (gpu::frb_half's
// TABLE_SCALE, rounded to nearest even and saturated at ±65504 as frb_half::f16_bits), 0 writes
// float32 rounded to nearest even (Rust's `as f32`).
//
// Two entry points, one launch each, in stream order:
// - frb_u, grid (⌈B/256⌉, 2M + 2N), block 256: thread (β, r) writes u[r][β] = U_r^M(θ_β) for
//   r < 2M and U_{r−2M}^N(θ′_β) after. A warp shares r, so it runs one loop length and its writes
//   coalesce along β.
// - frb_w, grid (⌈B/256⌉, 4MN), block 256: thread (β, ρ = p·2N + q) writes W[ρ][β], row-major
//   (4MN × B) as the GEMM reads it; the warp's two reads of u and its write coalesce along β.
// A 2-D grid instead of a grid-stride loop: no 64-bit division per entry (4MN ≤ 16384 rows fit
// gridDim.y). Not taken: one kernel forming each W entry from its own two cosine sums
// (8MN·B·(M + N) cosines against 2(M + N)·B·max(M, N) here, with u small enough to stay in L2),
// and a Chebyshev recurrence for cos(kφ) (fewer cosines, but other roundings than the host's, so
// the tables would no longer agree within one rounding).
//
// Exactness: only IEEE-rounded +, −, ×, / (written as __d*_rn so that nothing is contracted into
// an FMA the host does not do) and CUDA's double cos, in the host's order of operations. The
// doubles therefore differ from the host's only through cos's last bits; the Rust side derives
// the bound and what it means for the rounded tables.

#if HALF
typedef unsigned short weight_t;
#else
typedef float weight_t;
#endif

// std::f64::consts::PI: this literal parses to the same double.
#define PI_F64 3.14159265358979323846

// dsp::frb::u_sum: U_q^n(θ) = (1/n)·(½(1 + cos πx) + Σ_{k=1}^{n−1} cos(πx·k/n)), x = 2θ − q.
__device__ __forceinline__ double u_sum(int q, int n, double theta)
{
    const double x = __dsub_rn(__dmul_rn(2.0, theta), (double)q);
    const double nf = (double)n;
    const double px = __dmul_rn(PI_F64, x);
    double s = __dmul_rn(0.5, __dadd_rn(1.0, cos(px)));
    for (int k = 1; k < n; ++k) {
        s = __dadd_rn(s, cos(__ddiv_rn(__dmul_rn(px, (double)k), nf)));
    }
    return __ddiv_rn(s, nf);
}

// beams: (β, θ/θ′) double; u: (2M + 2N, B) double, overwritten.
extern "C" __global__ void frb_u(const double2 *__restrict__ beams, double *__restrict__ u,
                                 int n_beams)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (b >= n_beams) {
        return;
    }
    const double2 t = beams[b];
    u[(long long)r * n_beams + b] = r < 2 * ROWS ? u_sum(r, ROWS, t.x) : u_sum(r - 2 * ROWS, COLS, t.y);
}

// u: frb_u's; w: (4MN, B) weight_t, overwritten.
extern "C" __global__ void frb_w(const double *__restrict__ u, weight_t *__restrict__ w, int n_beams)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    const int rho = blockIdx.y;
    if (b >= n_beams) {
        return;
    }
    const int p = rho / (2 * COLS), q = rho % (2 * COLS);
    const double v = __dmul_rn(u[(long long)p * n_beams + b], u[(long long)(2 * ROWS + q) * n_beams + b]);
#if HALF
    // 2^15·v is exact; clamped first, so that the conversion saturates as the host's does.
    const double s = fmin(fmax(__dmul_rn(v, 32768.0), -65504.0), 65504.0);
    unsigned short h;
    asm("cvt.rn.f16.f64 %0, %1;\n" : "=h"(h) : "d"(s));
    w[(long long)rho * n_beams + b] = h;
#else
    w[(long long)rho * n_beams + b] = __double2float_rn(v);
#endif
}
