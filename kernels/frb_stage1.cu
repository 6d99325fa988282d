// The FRB beamformer's first stage (seed 004 §4; `dsp::frb::intensities` is its oracle): for
// every channel f, gridded dish field E (dishes on an M×N grid), per-dish weights W,
//
//   Ẽ_{τπpq} = Σ_{m<M} Σ_{n<N} W_{fπmn} E_{τfπmn} e^{2πi(mp/2M + nq/2N)}     (eq. 51)
//   I_{f τ̄ pq} = Σ_{τ in slot τ̄} Σ_π |Ẽ_{τπpq}|²                           (eq. 50)
//
// for 0 ≤ p < 2M, 0 ≤ q < 2N.
//
// Method. The seed builds each zero-padded transform from two short FFTs on tensor cores (§3);
// this kernel applies the two 1-D transforms as dense DFT matrices with fp16
// `mma.sync.m16n8k16` (fp32 accumulation) and never lets the intermediate G leave registers:
//
//   stage 1 (along n):  C1[(q, re/im)][m]  = A1[(q, re/im)][(n, re/im)] · Xᵀ[(n, re/im)][m]
//   stage 2 (along m):  Ẽᵀ[q][(p, re/im)] = Gᵀ[q][(m, re/im)] · B2[(m, re/im)][(p, re/im)]
//
// Complex products are real 2×2 blocks (§3.4 "ReIm in/out"). A stage-1 row tile of 16 holds
// the real parts of G for 8 values of q in rows 0–7 and the imaginary parts in rows 8–15; two
// such tiles (16 values of q) packed to fp16 *are* stage 2's A fragments, once stage 2's k
// index is ordered (within each step of 16) as Re G for 8 values of m, then Im G for the same
// 8 — the order of the real and imaginary rows of B2 follows it. A stage-2 column tile of 8
// holds (Re, Im) of Ẽ for 4 values of p, so each thread's accumulator holds both parts of the
// same beam and |Ẽ|² needs no exchange. This replaces the seed's shared-memory G array and its
// transposed read (§4.10–4.11) by register reuse; shared memory carries only the gridded field.
//
// Work. A block takes one channel and a run of slow-time slots. Warp (qw, r) owns q values
// 16qw … 16qw+15 (A1's two tiles for them and all of B2 in registers for the whole kernel, or
// B2 once per block in shared memory: B2_SMEM, below) and the (time, pol) pairs of a block
// step with index ≡ r (mod R); its |Ẽ|² sums are partial over those pairs, so at the end of
// each slot the R groups add theirs through shared memory. Block steps never straddle a slot,
// so a slot's sums never mix with the next's.
//
// Time slots. Slot j covers call samples [j·T_DS − phase, (j+1)·T_DS − phase) ∩ [0, TIMES):
// `phase` samples of slot 0 were summed by earlier calls into `carry_in` (channel, p, q); a
// slot that ends inside this call is written to `out` (channel, OUT_MAX, p, q) at row j; one
// that does not (only the last) is written to `carry_out`. The op alternates the two carry
// buffers between calls, so blocks that read one never race blocks that write the other.
//
// Output type (OUT_HALF). 0: float32 `scale`·I (the op passes 1). 1: the fp16 second stage's
// operand itself, fp16(`scale`·I) as bits, `scale` a power of two (exact), saturated at ±65504
// and rounded to nearest even (cvt.rn.f16.f32): the float32 sum the other form writes, rounded
// once, so the bits equal a host's round-to-nearest of that float32 value (the self-test checks
// it). Writing it here saves the second stage a pass over I (read 4 B, write 2 B per value) and
// halves this kernel's writes. Carries stay float32 either way: a partial slot's sum is
// rounded only once it is complete.
//
// Tables (fp16, rounded once from double by the op): `a1_table`, stage-1 A fragments per
// (q tile of 8, k step, register, lane); `b2_table`, stage-2 B fragments per (k step, column
// tile, register, lane); the kernel takes the first NT2H column tiles of each k step into
// registers, or (B2_SMEM) into shared memory as (k step, column tile, lane) register pairs.
//
// Input: the XB-engine's chunk, (batch, dish, channel, spectrum, pol, re/im) int8; call sample
// t is spectrum t % SPECTRA of batch t / SPECTRA. Weights: (channel, dish, pol) float2, held in
// shared memory as fp16 pairs (Wr, Wi) and (−Wi, Wr) per pol (`grid_sample`);
// `cells` and `dishes`: per gridding slot k, the offset of its dish's (m, n) in a gridded row
// ((m·XROW + 2n) halves) and the dish's index in the input. The op orders the slots so that the
// 32 of each warp's gridding stores fall in distinct shared-memory banks where the dish map
// allows it (`gpu::frb::gridding_order`): in dish order, a shuffled map cost 3.2-way conflicts
// on the stores (Nsight Compute at seed 004 case 5, bench/RESULTS.md). The raw samples, weights
// and cells are held in slot order.
// Unoccupied cells and the padding stay zero from the start: gridding writes only occupied
// cells. Gridded rows are padded by 16 bytes so that ldmatrix's eight row addresses fall in
// distinct bank groups.
//
// Compile-time constants (-D): M, N, D, T_DS, CHANNELS, SPECTRA, BATCHES, TB (time samples per
// block step), R (warp groups over (time, pol) pairs), OUT_HALF (the output type, above),
// B2_SMEM and MIN_BLOCKS (below).
//
// B2_SMEM: 0 holds B2 in every warp's registers (36 at 24×24); 1 holds it once per block in
// shared memory, one 8-byte read per fragment in the transform loop (a warp's 32 reads are 256
// consecutive bytes: no bank conflict). The op takes registers where ptxas holds them without
// spilling — 1–2 % faster at seed 004 case 5 on the H100 (bench/RESULTS.md) — and shared memory
// for larger grids, which with B2 in registers spilled at 25×24, 30×28 or 30×32 even at one
// block per SM. Two (time, pol) pairs per warp at once (B2 fragments read once for both) were
// measured slower: 11–56 % at case 5, for want of registers.

#define MP ((M + 7) / 8 * 8)     // m padded: stage-1 columns per (time, pol), stage-2 k
#define NP ((N + 7) / 8 * 8)     // n padded: stage-1 k
#define QP ((2 * N + 15) / 16 * 16) // q padded: stage-1 rows, stage-2 rows
#define PP ((2 * M + 3) / 4 * 4) // p padded: stage-2 columns (4 values of p per tile)
#define QW (QP / 16)             // warps along q
#define WARPS (QW * R)
#define K1S (NP / 8)             // stage-1 k steps of 16 (8 values of n, re/im)
#define K2S (MP / 8)             // stage-2 k steps of 16 (8 values of m, re then im)
#define NT2 (PP / 4)             // stage-2 column tiles
// With 4 | M, the columns p ≥ M come from those p − M with G negated at odd m
// (e^{iπm(p+M)/M} = (−1)^m e^{iπmp/M}): B2 is held for half the tiles only.
#define HALF (M % 4 == 0)
#define NT2H (HALF ? M / 4 : NT2)    // stage-2 column tiles held
#define XROW (2 * NP + 8)        // halves per gridded row (time, pol, m): (n, re/im) + pad
// MIN_BLOCKS (-D): blocks per SM the registers must allow. The op asks first for 12 warps in
// all (three per scheduler), enough to hide the tensor cores' latency, and where ptxas would
// spill there for one block.

// Shared memory, in bytes: raw input (two block steps), X, weights, cells, B2, the slot
// reduction.
#define RAW_BYTES ((2 * TB * D * 4 + 15) / 16 * 16)
#define X_BYTES (TB * 2 * MP * XROW * 2)
#define W_BYTES (D * 2 * 8)
#define CELL_BYTES ((D * 8 + 15) / 16 * 16)
#define B2_BYTES (B2_SMEM ? K2S * NT2H * 32 * 8 : 0)
#define RED_BYTES ((R - 1) * QW * 32 * 2 * NT2 * 4)

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

extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
frb_stage1(const u32 *__restrict__ in, const float2 *__restrict__ weights, const int *__restrict__ cells,
           const int *__restrict__ dishes,
           const u32 *__restrict__ a1_table, const u32 *__restrict__ b2_table, const float *__restrict__ carry_in,
           float *__restrict__ carry_out, out_t *__restrict__ out, int phase, int slots_per_block,
           float scale)
{
    extern __shared__ __align__(16) unsigned char smem[];
    u32 *raw = (u32 *)smem;
    unsigned short *xs = (unsigned short *)(smem + RAW_BYTES);
    uint4 *ws = (uint4 *)(smem + RAW_BYTES + X_BYTES);
    int *cs = (int *)(smem + RAW_BYTES + X_BYTES + W_BYTES);
    int *ds = cs + D;
#if B2_SMEM
    const uint2 *b2s = (const uint2 *)(smem + RAW_BYTES + X_BYTES + W_BYTES + CELL_BYTES);
#endif
    float *red = (float *)(smem + RAW_BYTES + X_BYTES + W_BYTES + CELL_BYTES + B2_BYTES);

    const int f = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qw = warp % QW, r = warp / QW;
    const int g = lane >> 2, i = lane & 3;

    const Slots sl(phase, slots_per_block);
    if (sl.j0 >= sl.j1)
        return;

    // Set-up: zero X (unoccupied cells and padding stay zero), weights, cells, tables.
    for (int e = threadIdx.x; e < X_BYTES / 4; e += WARPS * 32)
        ((u32 *)xs)[e] = 0;
    // Slot k's cell, dish and weights; load_raw's thread for slot k is the one that writes them
    // here, so its first call needs no barrier.
    for (int k = threadIdx.x; k < D; k += WARPS * 32) {
        const int d = dishes[k];
        const float2 w0 = weights[((size_t)f * D + d) * 2], w1 = weights[((size_t)f * D + d) * 2 + 1];
        ws[k] = make_uint4(pack(w0.x, w0.y), pack(-w0.y, w0.x), pack(w1.x, w1.y), pack(-w1.y, w1.x));
        cs[k] = cells[k];
        ds[k] = d;
    }
    u32 a1[2][K1S][4];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int ks = 0; ks < K1S; ks++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                a1[h][ks][k] = a1_table[(((2 * qw + h) * K1S + ks) * 4 + k) * 32 + lane];
#if B2_SMEM
    for (int e = threadIdx.x; e < K2S * NT2H * 32; e += WARPS * 32) {
        const int ks = e / (NT2H * 32), nt = e / 32 % NT2H, l = e % 32;
        ((uint2 *)b2s)[e] =
            make_uint2(b2_table[((ks * NT2 + nt) * 2) * 32 + l], b2_table[((ks * NT2 + nt) * 2 + 1) * 32 + l]);
    }
#else
    u32 b2[K2S][NT2H][2];
#pragma unroll
    for (int ks = 0; ks < K2S; ks++)
#pragma unroll
        for (int nt = 0; nt < NT2H; nt++)
#pragma unroll
            for (int k = 0; k < 2; k++)
                b2[ks][nt][k] = b2_table[((ks * NT2 + nt) * 2 + k) * 32 + lane];
#endif

    // Partial |Ẽ|² over this warp's pairs: (q = 16qw + g [lo] or + 8 [hi], p = 4nt + i).
    float lo[NT2], hi[NT2];
    const size_t plane = (size_t)(2 * M) * (2 * N);
#pragma unroll
    for (int nt = 0; nt < NT2; nt++) {
        const int p = 4 * nt + i, q = 16 * qw + g;
        const bool carried = sl.j0 == 0 && phase > 0 && r == 0 && p < 2 * M;
        lo[nt] = carried && q < 2 * N ? carry_in[f * plane + p * (2 * N) + q] : 0.0f;
        hi[nt] = carried && q + 8 < 2 * N ? carry_in[f * plane + p * (2 * N) + q + 8] : 0.0f;
    }

    int j = sl.j0, te = sl.end(sl.j0), t0 = sl.begin(sl.j0);
    load_raw(raw, in, ds, f, t0, min(TB, te - t0), WARPS * 32);
    for (int step = 0;; step++) {
        const int n = min(TB, te - t0);
        // The next block step: later in this slot, or the start of the next.
        int nj = j, nt0 = t0 + n, nte = te;
        if (nt0 >= te) {
            nj = j + 1;
            nt0 = sl.begin(nj);
            nte = sl.end(nj);
        }
        const bool more = nj < sl.j1;
        if (more) {
            load_raw(raw + ((step + 1) & 1) * TB * D, in, ds, f, nt0, min(TB, nte - nt0), WARPS * 32);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();

        // Gridding with weights: X[(tb, π, m)][(n, re/im)] = W·E, GT times of a dish per
        // thread (the weights and cell read once for all); consecutive threads take
        // consecutive slots at the same times, so their writes fall in distinct cells (and,
        // by the slots' order, banks).
        const u32 *cur = raw + (step & 1) * TB * D;
        for (int e = threadIdx.x; e < (n + GT - 1) / GT * D; e += WARPS * 32) {
            const int tb = GT * (e / D), slot = e % D;
            const uint4 w = ws[slot];
            grid_times(xs + tb * 2 * MP * XROW + cs[slot], cur + slot * TB + tb, w, tb, n, 2 * MP * XROW, MP * XROW);
        }
        __syncthreads();

        // Both stages for this warp's (time, pol) pairs, G kept in registers.
#pragma unroll 1
        for (int pi = r; pi < 2 * n; pi += R) {
            u32 ga[K2S][4];
#pragma unroll
            for (int mg = 0; mg < K2S; mg++) {
                u32 xb[K1S][2];
#pragma unroll
                for (int ks = 0; ks < K1S; ks++)
                    ldmatrix_x2(xb[ks], smem_addr(xs + (pi * MP + 8 * mg + (lane & 7)) * XROW + 16 * ks +
                                                  8 * ((lane >> 3) & 1)));
                float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int ks = 0; ks < K1S; ks++) {
                    mma(c[0], a1[0][ks], xb[ks]);
                    mma(c[1], a1[1][ks], xb[ks]);
                }
                // Rows g / g+8 of the 16-q tile are tiles 2qw / 2qw+1; k: Re G, then Im G.
                ga[mg][0] = pack(c[0][0], c[0][1]);
                ga[mg][1] = pack(c[1][0], c[1][1]);
                ga[mg][2] = pack(c[0][2], c[0][3]);
                ga[mg][3] = pack(c[1][2], c[1][3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT2H; nt++) {
                float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int mg = 0; mg < K2S; mg++) {
#if B2_SMEM
                    const uint2 bv = b2s[(mg * NT2H + nt) * 32 + lane];
                    const u32 b[2] = {bv.x, bv.y};
#else
                    const u32(&b)[2] = b2[mg][nt];
#endif
                    mma(e, ga[mg], b);
                    if (HALF) {
                        // Each register's high half is the odd m of its pair: negate it.
                        const u32 neg[4] = {ga[mg][0] ^ 0x80000000u, ga[mg][1] ^ 0x80000000u,
                                            ga[mg][2] ^ 0x80000000u, ga[mg][3] ^ 0x80000000u};
                        mma(o, neg, b);
                    }
                }
                lo[nt] = add_power(lo[nt], e[0], e[1]);
                hi[nt] = add_power(hi[nt], e[2], e[3]);
                if (HALF) {
                    lo[nt + NT2H] = add_power(lo[nt + NT2H], o[0], o[1]);
                    hi[nt + NT2H] = add_power(hi[nt + NT2H], o[2], o[3]);
                }
            }
        }

        if (t0 + n >= te) {
            // Slot j ends: add the groups' partial sums, write the slot (or carry the part).
            const bool complete = te == (j + 1) * T_DS - phase;
            // One offset for either destination (two live pointers here cost a spill at 24×24).
            const size_t at = complete ? ((size_t)f * OUT_MAX + j) * plane : f * plane;
            auto put = [&](int k, float v) {
                if (complete)
                    out[at + k] = to_out(v, scale);
                else
                    carry_out[at + k] = v;
            };
            __syncthreads();
            if (r > 0) {
                float *mine = red + ((r - 1) * QW + qw) * 32 * 2 * NT2;
#pragma unroll
                for (int nt = 0; nt < NT2; nt++) {
                    mine[(2 * nt) * 32 + lane] = lo[nt];
                    mine[(2 * nt + 1) * 32 + lane] = hi[nt];
                }
            }
            __syncthreads();
            if (r == 0) {
#pragma unroll
                for (int nt = 0; nt < NT2; nt++) {
                    float a = lo[nt], b = hi[nt];
                    for (int k = 0; k < R - 1; k++) {
                        const float *other = red + (k * QW + qw) * 32 * 2 * NT2;
                        a += other[(2 * nt) * 32 + lane];
                        b += other[(2 * nt + 1) * 32 + lane];
                    }
                    const int p = 4 * nt + i, q = 16 * qw + g;
                    if (p < 2 * M && q < 2 * N)
                        put(p * (2 * N) + q, a);
                    if (p < 2 * M && q + 8 < 2 * N)
                        put(p * (2 * N) + q + 8, b);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT2; nt++)
                lo[nt] = hi[nt] = 0.0f;
            if (!more)
                break;
        }
        j = nj;
        t0 = nt0;
        te = nte;
    }
}
