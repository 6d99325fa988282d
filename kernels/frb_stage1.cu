// The FRB beamformer's first stage (seed 004 §4; `dsp::frb::intensities` is its oracle): for
// every channel f, gridded dish field E (dishes on an M×N grid), per-dish weights W,
//
//   Ẽ_{τπpq} = Σ_{m<M} Σ_{n<N} W_{fπmn} E_{τfπmn} e^{2πi(mp/2M + nq/2N)}     (eq. 51)
//   I_{f τ̄ pq} = Σ_{τ in slot τ̄} Σ_π |Ẽ_{τπpq}|²                           (eq. 50)
//
// for 0 ≤ p < 2M, 0 ≤ q < 2N.
//
// Method. The seed builds each zero-padded transform from two short FFTs on tensor cores (§3);
// this kernel instead applies the two 1-D transforms as dense DFT matrices with fp16
// `mma.sync.m16n8k16` (fp32 accumulation), which needs no register shuffling between the
// factors and keeps the same data flow as §4.2: gridding into shared memory, the transform
// along n for a block of TB time samples, G written to shared memory and read "transposed",
// the transform along m, |Ẽ|² summed in registers and written once per T_DS samples. Complex
// products are real 2×2 blocks (§3.4 "ReIm in/out"): a DFT matrix row tile of 16 holds the
// real parts of 8 outputs in rows 0–7 and their imaginary parts in rows 8–15, so one thread's
// accumulator fragment holds both parts of the same output and |Ẽ|² needs no exchange.
//
//   stage 1 (along n):  Gᵀ[(q, re/im)][(τ, π, m)] = A1[(q, re/im)][(n, re/im)] · Xᵀ[(n, re/im)][(τ, π, m)]
//   stage 2 (along m):  Ẽ[(p, re/im)][q]          = A2[(p, re/im)][(m, re/im)] · G[(m, re/im)][q]   per (τ, π)
//
// A2 (the transform along m, used twice as often) lives in registers for the whole kernel; A1
// is read from shared memory once per row tile and used for all of a warp's columns.
// Warp w owns q-tile w (8 values of q) of stage 2 for every p, so its intensity registers are
// fixed for the whole kernel; in stage 1 it takes CT / WARPS column tiles of X.
//
// Shared-memory rows are padded by 16 bytes so that ldmatrix's eight row addresses fall in
// distinct bank groups. Unoccupied grid cells and the padding to multiples of 8 stay zero
// from the start: gridding writes only occupied cells.
//
// Time slots. Slot j covers call samples [j·T_DS − phase, (j+1)·T_DS − phase) ∩ [0, TIMES):
// `phase` samples of slot 0 were summed by earlier calls into `carry_in` (channel, p, q); a
// slot that ends inside this call is written to `out` (channel, OUT_MAX, p, q) at row j; one
// that does not (only the last) is written to `carry_out`. The op alternates the two carry
// buffers between calls, so blocks that read one never race blocks that write the other.
//
// The DFT tables come from the op (fp16, rounded once from double on the host): `a1_table`,
// A1 in its shared-memory image (QT·16 rows of XROW halves); `a2_table`, A2 as mma A fragments
// (pt, ks, register, lane). In both, a 16-row tile t holds the real parts of outputs
// 8t + (0..8) in rows 0–7 and their imaginary parts in rows 8–15, and column k is input k/2's
// real (k even) or imaginary part.
//
// Input: the XB-engine's chunk, (batch, dish, channel, spectrum, pol, re/im) int8; call sample
// t is spectrum t % SPECTRA of batch t / SPECTRA. Weights: (channel, dish, pol) float2;
// `cells`: per dish, the offset of its (m, n) in a gridded row ((m·XROW + 2n) halves).
//
// Compile-time constants (-D): M, N, D, T_DS, CHANNELS, SPECTRA, BATCHES, TB (time samples per
// block step; TB·2·MP/8 a multiple of the warp count).

typedef unsigned int u32;
typedef unsigned short f16_bits; // fp16 values are only moved and packed here (no cuda_fp16.h:
                                 // NVRTC has no include path for it)

#define TIMES (SPECTRA * BATCHES)
#define MP ((M + 7) / 8 * 8)
#define NP ((N + 7) / 8 * 8)
#define PP ((2 * M + 7) / 8 * 8)
#define QP ((2 * N + 7) / 8 * 8)
#define PT (PP / 8)             // stage-2 row tiles (8 values of p each)
#define QT (QP / 8)             // stage-1 row tiles, stage-2 column tiles: one warp each
#define WARPS QT
#define K1S (NP / 8)            // stage-1 k steps of 16 (8 values of n)
#define K2S (MP / 8)            // stage-2 k steps of 16 (8 values of m)
#define XROW (2 * NP + 8)       // halves per gridded row (π, m): (n, re/im) + pad
#define GROW (2 * MP + 8)       // halves per G row (π, q): (m, re/im) + pad
#define CT (TB * 2 * MP / 8)    // stage-1 column tiles per block step
#define CPW (CT / WARPS)
#define OUT_MAX ((TIMES + T_DS - 1) / T_DS)

static_assert(CT % WARPS == 0, "TB·2·MP/8 must be a multiple of the warp count");

// Shared memory, in bytes: raw input (two block steps), X, G, A1, weights, cells.
#define RAW_BYTES ((2 * TB * D * 4 + 15) / 16 * 16)
#define X_BYTES (TB * 2 * MP * XROW * 2)
#define G_BYTES (TB * 2 * QP * GROW * 2)
#define A1_BYTES (QT * 16 * XROW * 2)
#define W_BYTES (D * 2 * 8)
#define CELL_BYTES (D * 4)
#define SMEM_BYTES (RAW_BYTES + X_BYTES + G_BYTES + A1_BYTES + W_BYTES + CELL_BYTES)

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async4(u32 dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

// Two floats rounded to fp16 (nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Load the raw samples of block step starting at t0 (TB samples, clipped to t_end) for every
// dish into raw (tb, dish) words.
__device__ __forceinline__ void load_raw(u32 *raw, const u32 *__restrict__ in, int f, int t0, int t_end)
{
    for (int e = threadIdx.x; e < TB * D; e += WARPS * 32) {
        const int d = e / TB, tb = e % TB, t = t0 + tb;
        if (t < t_end) {
            const int batch = t / SPECTRA, s = t % SPECTRA;
            const size_t word = ((size_t)(batch * D + d) * CHANNELS + f) * SPECTRA + s;
            cp_async4(smem_addr(raw + tb * D + d), in + word);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
frb_stage1(const u32 *__restrict__ in, const float2 *__restrict__ weights, const int *__restrict__ cells,
           const u32 *__restrict__ a1_table, const u32 *__restrict__ a2_table, const float *__restrict__ carry_in, float *__restrict__ carry_out, float *__restrict__ out,
           int phase, int slots_per_block)
{
    extern __shared__ __align__(16) unsigned char smem[];
    u32 *raw = (u32 *)smem;
    f16_bits *xs = (f16_bits *)(smem + RAW_BYTES);
    f16_bits *gs = (f16_bits *)(smem + RAW_BYTES + X_BYTES);
    f16_bits *a1 = (f16_bits *)(smem + RAW_BYTES + X_BYTES + G_BYTES);
    float2 *ws = (float2 *)(smem + RAW_BYTES + X_BYTES + G_BYTES + A1_BYTES);
    int *cs = (int *)(smem + RAW_BYTES + X_BYTES + G_BYTES + A1_BYTES + W_BYTES);

    const int f = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, i = lane & 3;

    const int slots = (phase + TIMES + T_DS - 1) / T_DS;
    const int j0 = blockIdx.x * slots_per_block;
    const int j1 = min(j0 + slots_per_block, slots);
    if (j0 >= j1)
        return;
    const int t_begin = max(0, j0 * T_DS - phase);
    const int t_end = min(TIMES, j1 * T_DS - phase);

    // Set-up: zero X (unoccupied cells and padding stay zero), the A1 table, weights, cells.
    for (int e = threadIdx.x; e < X_BYTES / 4; e += WARPS * 32)
        ((u32 *)xs)[e] = 0;
    for (int e = threadIdx.x; e < A1_BYTES / 4; e += WARPS * 32)
        ((u32 *)a1)[e] = a1_table[e];
    for (int e = threadIdx.x; e < 2 * D; e += WARPS * 32)
        ws[e] = weights[(size_t)f * 2 * D + e];
    for (int e = threadIdx.x; e < D; e += WARPS * 32)
        cs[e] = cells[e];

    // A2 fragments in registers for the whole kernel: (tile pt, k step ks, register r, lane).
    u32 a2[PT][K2S][4];
#pragma unroll
    for (int pt = 0; pt < PT; pt++)
#pragma unroll
        for (int ks = 0; ks < K2S; ks++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                a2[pt][ks][r] = a2_table[((pt * K2S + ks) * 4 + r) * 32 + lane];

    // Running intensities: (p = 8pt + g, q = 8·warp + 2i + j).
    float acc[PT][2];
    const size_t plane = (size_t)(2 * M) * (2 * N);
    auto load_running = [&](int j) {
#pragma unroll
        for (int pt = 0; pt < PT; pt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int p = 8 * pt + g, q = 8 * warp + 2 * i + h;
                acc[pt][h] = (j == 0 && phase > 0 && p < 2 * M && q < 2 * N)
                                 ? carry_in[f * plane + p * (2 * N) + q]
                                 : 0.0f;
            }
    };
    load_running(j0);

    load_raw(raw, in, f, t_begin, t_end);
    int step = 0;
    for (int t0 = t_begin; t0 < t_end; t0 += TB, step++) {
        u32 *cur = raw + (step & 1) * TB * D;
        if (t0 + TB < t_end) {
            load_raw(raw + ((step + 1) & 1) * TB * D, in, f, t0 + TB, t_end);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();

        // Gridding with weights: X[(tb, π, m)][(n, re/im)] = W·E.
        for (int e = threadIdx.x; e < TB * D * 2; e += WARPS * 32) {
            const int tb = e / (2 * D), rem = e % (2 * D);
            if (t0 + tb >= t_end)
                continue;
            const int d = rem >> 1, pol = rem & 1;
            const u32 word = cur[tb * D + d];
            const float re = (float)(signed char)(word >> (16 * pol));
            const float im = (float)(signed char)(word >> (16 * pol + 8));
            const float2 w = ws[rem];
            *(u32 *)(xs + (tb * 2 + pol) * MP * XROW + cs[d]) =
                pack(w.x * re - w.y * im, w.x * im + w.y * re);
        }
        __syncthreads();

        // Stage 1: this warp's column tiles of Xᵀ in registers, every row tile of A1.
        {
            u32 xb[CPW][K1S][2];
#pragma unroll
            for (int c = 0; c < CPW; c++)
#pragma unroll
                for (int ks = 0; ks < K1S; ks++) {
                    const int col = 8 * (warp * CPW + c) + (lane & 7);
                    ldmatrix_x2(xb[c][ks], smem_addr(xs + col * XROW + 16 * ks + 8 * ((lane >> 3) & 1)));
                }
#pragma unroll 1
            for (int qt = 0; qt < QT; qt++) {
                u32 af[K1S][4];
#pragma unroll
                for (int ks = 0; ks < K1S; ks++) {
                    const int row = 16 * qt + (lane & 7) + 8 * ((lane >> 3) & 1);
                    ldmatrix_x4(af[ks], smem_addr(a1 + row * XROW + 16 * ks + 8 * (lane >> 4)));
                }
#pragma unroll
                for (int c = 0; c < CPW; c++) {
                    float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int ks = 0; ks < K1S; ks++)
                        mma(r, af[ks], xb[c][ks]);
                    // Columns 2i, 2i+1 of the tile: (τ, π, m), (τ, π, m + 1); rows g (re), g+8 (im).
                    const int col = 8 * (warp * CPW + c) + 2 * i;
                    const int tp = col / MP, m = col % MP, q = 8 * qt + g;
                    uint2 v = make_uint2(pack(r[0], r[2]), pack(r[1], r[3]));
                    *(uint2 *)(gs + (tp * QP + q) * GROW + 2 * m) = v;
                }
            }
        }
        __syncthreads();

        // Stage 2 for q-tile `warp`, every p-tile, each time sample and pol; flush at slot ends.
        for (int tb = 0; tb < TB; tb++) {
            const int t = t0 + tb;
            if (t >= t_end)
                break;
#pragma unroll
            for (int pol = 0; pol < 2; pol++) {
                u32 gb[K2S][2];
#pragma unroll
                for (int ks = 0; ks < K2S; ks++) {
                    const int q = 8 * warp + (lane & 7);
                    ldmatrix_x2(gb[ks], smem_addr(gs + ((tb * 2 + pol) * QP + q) * GROW + 16 * ks +
                                                  8 * ((lane >> 3) & 1)));
                }
#pragma unroll
                for (int pt = 0; pt < PT; pt++) {
                    float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int ks = 0; ks < K2S; ks++)
                        mma(r, a2[pt][ks], gb[ks]);
                    acc[pt][0] += r[0] * r[0] + r[2] * r[2];
                    acc[pt][1] += r[1] * r[1] + r[3] * r[3];
                }
            }
            const int j = (t + phase) / T_DS;
            const bool complete = (t + phase + 1) % T_DS == 0;
            if (complete || t == t_end - 1) {
                float *dst = complete ? out + ((size_t)f * OUT_MAX + j) * plane : carry_out + f * plane;
#pragma unroll
                for (int pt = 0; pt < PT; pt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int p = 8 * pt + g, q = 8 * warp + 2 * i + h;
                        if (p < 2 * M && q < 2 * N)
                            dst[p * (2 * N) + q] = acc[pt][h];
                        acc[pt][h] = 0.0f;
                    }
            }
        }
    }
}
