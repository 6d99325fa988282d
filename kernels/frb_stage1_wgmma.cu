// The FRB beamformer's first stage on Hopper's warpgroup MMAs (sm_90a; seed 004 §4,
// `dsp::frb::intensities` its oracle, kernels/frb_stage1.cu the portable form of the same
// sums, whose header gives the equations, the time slots, the carries and the output types;
// everything said there holds here except the method below).
//
// Method. Both 1-D transforms are dense DFT products as in frb_stage1.cu, but a block step's
// P = 2·TB (time, pol) pairs go through each stage together, as one product with the DFT
// matrix shared, so that the tensor cores see large products with no padding at 24×24:
//
//   stage 1 (along n): G[(pair, m)][(q, c)]  = X[(pair, m)][(n, d)] · A1[(n, d)][(q, c)]
//   stage 2 (along m): Ẽ[(pair, q)][(p, c)]  = G'[(pair, q)][(m, d)] · B2[(m, d)][(p, c)]
//
// c and d are re/im, innermost; A1 and B2 are the real 2×2 blocks of e^{iπnq/N} and e^{iπmp/M}
// (for output c = re: (re, −im) of the entry; for c = im: (im, re)). Rows are m64 tiles of a
// warpgroup's `wgmma.m64nNk16` (fp16 in, fp32 accumulators), both operands read from shared
// memory: stage 1's rows (pair, m) are P·MP (192 at 24×24, three tiles), stage 2's (pair, q)
// are P·QP (384, six tiles). G leaves stage 1's accumulators as fp16 (re, im) pairs written
// straight into stage 2's operand G' — a transpose of each pair's 2-D block, which is why it
// goes through shared memory. A thread of stage 2 holds Re and Im of one (p, q) side by side
// (c innermost), so |Ẽ|² needs no exchange.
//
// Work. A block takes a run of the call's (channel, slot) units (the segment loop below) with NWG
// warpgroups; warpgroup w takes stage-1 tiles w, w + NWG, … and stage-2 tiles likewise. 64·NWG
// is a multiple of QP (the op checks), so a thread's stage-2 rows have the same q in every tile
// and step: it sums |Ẽ|² over its pairs in registers, and at each slot's end the block adds the
// 64·NWG/QP partial sums of each (p, q) through shared memory, in a fixed order (the fp16 output
// must be the float32 output rounded, bit for bit, in every build). Steps are pipelined, X and G'
// double-buffered so that each warpgroup keeps a stage-1 and a stage-2 tile in flight while it works:
//
//   step s's first stage-2 tile and step s+1's stage 1 issued → step s+2 gridded (each thread
//   from the raw samples it copied itself: no barrier), step s+3's raw samples queued → the
//   tile summed, the next tile issued → G of step s+1 stored from stage 1 → the remaining
//   tiles summed → one block barrier,
//
// and the rows of pairs past a short step's end (a slot that ends mid-step) are computed on
// stale X but not summed.
//
// Shared-memory operands are in the canonical K-major layout with the 32-byte swizzle (PTX ISA,
// "Shared Memory Matrix Layout"; `gpu::frb_wgmma::operand_offset`): each k step of 16 values is one
// 256-byte atom per 8 rows. The tables come from the host in exactly that layout
// (`gpu::frb_tables`).
//
// Measured (bench/RESULTS.md, 2026-11-28, twenty-second session): 1.68–1.70 ms at seed 004 case 5
// on the H200 (1.79–1.81 before the runs of units crossed channels) against frb_stage1.cu's
// 2.01–2.03, so the op's default at 24×24 on sm_90 (`gpu::frb_wgmma`); slower than frb_stage1.cu
// at 8×8 and 16×16, where the products are narrow.
//
// Compile-time constants (-D): M, N, D, T_DS, CHANNELS, SPECTRA, BATCHES, TB, NWG, OUT_HALF.

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "frb_stage1_wgmma.cu needs sm_90a (wgmma)"
#endif

typedef unsigned long long u64;

#define MP ((M + 7) / 8 * 8)       // m padded: stage-1 rows per pair, stage-2 k / 2
#define NP ((N + 7) / 8 * 8)       // n padded: stage-1 k / 2
#define QP ((2 * N + 7) / 8 * 8)   // q padded: stage-1 columns / 2, stage-2 rows per pair
#define PP ((2 * M + 3) / 4 * 4)   // p padded: stage-2 columns / 2
#define K1 (2 * NP)
#define K2 (2 * MP)
#define N1 (2 * QP)
#define N2 (2 * PP)
#define PAIRS (2 * TB)
#define T1 (PAIRS * MP / 64)       // stage-1 tiles
#define T2 (PAIRS * QP / 64)       // stage-2 tiles
#define T1W (T1 / NWG)             // per warpgroup
#define T2W (T2 / NWG)
#define AN (N1 > N2 ? N1 / 2 : N2 / 2) // accumulators per tile and thread
#define SHARE (64 * NWG / QP)      // stage-2 rows of one q in a step's first 64·NWG
#define THREADS (NWG * 128)

#if PAIRS * MP % 64 != 0 || PAIRS * QP % 64 != 0 || T1 % NWG != 0 || T2 % NWG != 0 || \
    64 * NWG % QP != 0 || N1 > 128 || N2 > 128 || N1 % 16 != 0 || N2 % 16 != 0
#error "frb_stage1_wgmma.cu: shape outside the op's checks"
#endif

// Shared memory, in bytes: the operands first (128-byte aligned; X and G' twice), then the rest.
#define X_BYTES (PAIRS * MP * K1 * 2)
#define G_BYTES (PAIRS * QP * K2 * 2)
#define A1_BYTES (N1 * K1 * 2)
#define B2_BYTES (N2 * K2 * 2)
#define RAW_BYTES ((2 * TB * D * 4 + 15) / 16 * 16)
#define W_BYTES (D * 16)
#define CELL_BYTES ((D * 8 + 15) / 16 * 16)

// K-major descriptor in the 32-byte swizzle (mode 3): atoms of 8 rows × 32 bytes, a row
// group's atoms consecutive along k, so row groups `kbytes`·8 apart (the stride byte offset);
// the leading byte offset is unused for swizzled K-major layouts (1, as CUTLASS sets it).
__device__ __forceinline__ u64 desc(u32 addr, u32 kbytes)
{
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)((kbytes * 8) >> 4) << 32) | ((u64)3 << 62);
}

// The byte offset of (row, k) in such an operand with `k_len` values per row is
// `gpu::frb_wgmma::operand_offset` (the host places the tables and cells by it; store_g below
// follows it in closed form): a row's 32 bytes of an atom hold k/16's 16 values, its two 16-byte
// halves swapped in rows 4–7 of the atom (address bit 4 ^= bit 7; buffers are 256-byte aligned).
// Against the unswizzled layout the whole kernel measured 1–3 % faster (G''s stores fall in
// distinct banks), though its MMAs alone were 9 % slower (bench/RESULTS.md, 2026-11-28).

// Accumulator register lists (adjacent string literals join): four per block.
#define R0 "%0, %1, %2, %3"
#define R1 ", %4, %5, %6, %7"
#define R2 ", %8, %9, %10, %11"
#define R3 ", %12, %13, %14, %15"
#define R4 ", %16, %17, %18, %19"
#define R5 ", %20, %21, %22, %23"
#define R6 ", %24, %25, %26, %27"
#define R7 ", %28, %29, %30, %31"
#define R8 ", %32, %33, %34, %35"
#define R9 ", %36, %37, %38, %39"
#define R10 ", %40, %41, %42, %43"
#define R11 ", %44, %45, %46, %47"
#define R12 ", %48, %49, %50, %51"
#define R13 ", %52, %53, %54, %55"
#define R14 ", %56, %57, %58, %59"
#define R15 ", %60, %61, %62, %63"
#define O0 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define O1 , "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define O2 , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
#define O3 , "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define O4 , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define O5 , "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#define O6 , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
#define O7 , "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define O8 , "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#define O9 , "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define O10 , "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43])
#define O11 , "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define O12 , "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51])
#define O13 , "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define O14 , "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59])
#define O15 , "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_F16(NN, REGS, A, B, S, OUTS)                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" S ", 0;\n"                                 \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k16.f32.f16.f16 {" REGS "}, %" A ", %" B \
                 ", p, 1, 1, 0, 0;\n}\n"                                                         \
                 : OUTS                                                                          \
                 : "l"(a), "l"(b), "r"(scale_d))

// One m64nNNk16 fp16 warpgroup MMA from two descriptors into accumulators 0 .. NN/2 − 1;
// `scale_d` 0 starts the sum, 1 adds to it.
template <int NN>
__device__ __forceinline__ void wgmma(float (&d)[AN], u64 a, u64 b, int scale_d)
{
    static_assert(NN / 2 <= AN, "accumulators");
    if constexpr (NN == 16)
        WGMMA_F16(16, R0 R1, "8", "9", "10", O0 O1);
    else if constexpr (NN == 32)
        WGMMA_F16(32, R0 R1 R2 R3, "16", "17", "18", O0 O1 O2 O3);
    else if constexpr (NN == 48)
        WGMMA_F16(48, R0 R1 R2 R3 R4 R5, "24", "25", "26", O0 O1 O2 O3 O4 O5);
    else if constexpr (NN == 64)
        WGMMA_F16(64, R0 R1 R2 R3 R4 R5 R6 R7, "32", "33", "34", O0 O1 O2 O3 O4 O5 O6 O7);
    else if constexpr (NN == 80)
        WGMMA_F16(80, R0 R1 R2 R3 R4 R5 R6 R7 R8 R9, "40", "41", "42", O0 O1 O2 O3 O4 O5 O6 O7 O8 O9);
    else if constexpr (NN == 96)
        WGMMA_F16(96, R0 R1 R2 R3 R4 R5 R6 R7 R8 R9 R10 R11, "48", "49", "50",
                  O0 O1 O2 O3 O4 O5 O6 O7 O8 O9 O10 O11);
    else if constexpr (NN == 112)
        WGMMA_F16(112, R0 R1 R2 R3 R4 R5 R6 R7 R8 R9 R10 R11 R12 R13, "56", "57", "58",
                  O0 O1 O2 O3 O4 O5 O6 O7 O8 O9 O10 O11 O12 O13);
    else
        WGMMA_F16(128, R0 R1 R2 R3 R4 R5 R6 R7 R8 R9 R10 R11 R12 R13 R14 R15, "64", "65", "66",
                  O0 O1 O2 O3 O4 O5 O6 O7 O8 O9 O10 O11 O12 O13 O14 O15);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most W groups are in flight, naming the accumulators of the groups that are
// then complete (`done`, and `also` where both are), so that no use of them moves above the
// wait. Naming those of a group still in flight would read them mid-MMA (ptxas then
// serialises every MMA: C7514).
template <int W>
__device__ __forceinline__ void wgmma_wait(float (&done)[AN])
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(W) : "memory");
#pragma unroll
    for (int k = 0; k < AN; k++)
        asm volatile("" : "+f"(done[k])::"memory");
}

__device__ __forceinline__ void wgmma_wait_all(float (&done)[AN], float (&also)[AN])
{
    wgmma_wait<0>(done);
#pragma unroll
    for (int k = 0; k < AN; k++)
        asm volatile("" : "+f"(also[k])::"memory");
}

// Generic-proxy shared-memory writes made visible to the MMAs' async proxy.
__device__ __forceinline__ void fence_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One tile of a stage as one commit group: K/16 k steps of the operand whose tile starts at
// descriptor `a` by the table at descriptor `b`. A descriptor's start address is the byte
// address / 16 in its low 14 bits, so a step of 256 bytes along k adds 16 (no carry leaves the
// field: shared memory is below 2¹⁸ bytes); the callers form every descriptor the same way,
// from one per buffer made before the loop, which keeps the address arithmetic out of the step.
template <int NN, int K>
__device__ __forceinline__ void product(float (&d)[AN], u64 a, u64 b)
{
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < K / 16; ks++)
        wgmma<NN>(d, a + ks * 16, b + ks * 16, ks > 0);
    wgmma_commit();
}

// Descriptor offsets of a tile (64 rows of K values) and of a buffer of `bytes`.
#define TILE_DESC(K, tile) ((u64)(tile) * (64 * (K) * 2 / 16))
#define BUF_DESC(bytes, k) ((u64)((k) & 1) * ((bytes) / 16))

__device__ __forceinline__ void stage1(float (&d)[AN], u64 x, u64 a1, int tile)
{
    product<N1, K1>(d, x + TILE_DESC(K1, tile), a1);
}

__device__ __forceinline__ void stage2(float (&d)[AN], u64 g, u64 b2, int tile)
{
    product<N2, K2>(d, g + TILE_DESC(K2, tile), b2);
}

// Grid samples 0 … n−1 of a step (raw words `cur`) into X: pair 2·tb + pol, rows (pair, m). A
// thread takes the dish slots whose raw samples it copied (load_raw's mapping), so it needs only
// its own copies to have landed, not a barrier; consecutive threads take consecutive slots at
// the same times, so their stores fall in distinct cells (and, by the slots' order, banks).
__device__ __forceinline__ void grid_step(unsigned short *xs, const u32 *cur, const uint4 *ws, const int *cs, int n)
{
    for (int slot = threadIdx.x; slot < D; slot += THREADS) {
        const uint4 w = ws[slot];
        unsigned short *x = xs + cs[slot];
        for (int tb = 0; tb < n; tb += GT)
            grid_times(x + tb * 2 * MP * K1, cur + slot * TB + tb, w, tb, n, 2 * MP * K1, MP * K1);
    }
}

// Stage 1's accumulators of `tile` as fp16 (re, im) pairs into G' (row (pair, q), k (m, d)).
// Accumulator block j holds q = 4j + i: as QP is a multiple of 8 and i < 4, its row
// pair·QP + 4j + i lies in row group pair·QP/8 + j/2 at place 4·(j mod 2) + i, with swizzle bit
// j mod 2, so its operand offset is one of two per-thread bases (j even, odd) plus a constant.
__device__ __forceinline__ void store_g(unsigned char *g, const float (&d)[AN], int tile, int row16, int i)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = tile * 64 + row16 + 8 * h, pair = r / MP, k = 2 * (r % MP);
        const int sw = ((k >> 3) & 1) << 4;
        unsigned char *base = g + (pair * (QP / 8) * (K2 / 16) + (k >> 4)) * 256 + i * 32 + (k & 7) * 2;
        unsigned char *even = base + sw, *odd = base + 128 + (sw ^ 16);
#pragma unroll
        for (int j = 0; j < N1 / 8; j++)
            *(u32 *)((j & 1 ? odd : even) + (j >> 1) * K2 * 16) = pack(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    }
}

// One block step: slot j, call samples t0 … t0 + n − 1 (te: the slot's end).
struct Step {
    int j, t0, te, n;
};

extern "C" __global__ void __launch_bounds__(THREADS, 1)
frb_stage1_wgmma(const u32 *__restrict__ in, const float2 *__restrict__ weights, const int *__restrict__ cells,
                 const int *__restrict__ dishes, const uint4 *__restrict__ a1_table,
                 const uint4 *__restrict__ b2_table, const float *__restrict__ carry_in,
                 float *__restrict__ carry_out, out_t *__restrict__ out, int phase, int units_per_block,
                 float scale)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char *xs = smem;           // two buffers
    unsigned char *gs = xs + 2 * X_BYTES; // two buffers
    unsigned char *a1s = gs + 2 * G_BYTES;
    unsigned char *b2s = a1s + A1_BYTES;
    u32 *raw = (u32 *)(b2s + B2_BYTES); // two buffers
    uint4 *ws = (uint4 *)((unsigned char *)raw + RAW_BYTES);
    int *cs = (int *)((unsigned char *)ws + W_BYTES);
    int *ds = cs + D;
    float *red = (float *)((unsigned char *)cs + CELL_BYTES);

    // The warpgroup broadcast from lane 0, so that ptxas knows it is warp-uniform and keeps the
    // descriptors made from it in uniform registers.
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int g = lane >> 2, i = lane & 3;
    const int row16 = 16 * warp + g; // this thread's first accumulator row in a tile

    auto raw_buf = [&](int k) { return raw + (k & 1) * TB * D; };
    auto x_buf = [&](int k) { return xs + (k & 1) * X_BYTES; };

    // Set-up: X zeroed (unoccupied cells and padding stay zero), the tables, cells.
    for (int e = threadIdx.x; e < 2 * X_BYTES / 16; e += THREADS)
        ((uint4 *)xs)[e] = make_uint4(0, 0, 0, 0);
    for (int e = threadIdx.x; e < A1_BYTES / 16; e += THREADS)
        ((uint4 *)a1s)[e] = a1_table[e];
    for (int e = threadIdx.x; e < B2_BYTES / 16; e += THREADS)
        ((uint4 *)b2s)[e] = b2_table[e];
    for (int k = threadIdx.x; k < D; k += THREADS) {
        cs[k] = cells[k];
        ds[k] = dishes[k];
    }
    const u64 a1_d = desc(smem_addr(a1s), K1 * 2), b2_d = desc(smem_addr(b2s), K2 * 2);
    const u64 x_d = desc(smem_addr(xs), K1 * 2), g_d = desc(smem_addr(gs), K2 * 2);

    // The block's run of (channel, slot) units, unit f·slots + j: runs of equal length over
    // the grid (`gpu::frb`), so that the SMs finish together whatever the channel count (whole
    // channels per block left a 256-channel call's second wave of blocks 124 of 132 SMs wide).
    // A run that crosses a channel's end is two segments, the pipeline drained and refilled
    // between them, the tables and X's zeros kept.
    const int slots = (phase + TIMES + T_DS - 1) / T_DS;
    const int u1 = min((int)(blockIdx.x + 1) * units_per_block, CHANNELS * slots);
    for (int u = blockIdx.x * units_per_block; u < u1;) {
        const int f = u / slots;
        const Slots sl(phase, u % slots, min(slots, u % slots + (u1 - u)));
        u += sl.j1 - sl.j0;
        // The channel's weights (a previous segment's last gridding is behind its last barrier).
        for (int k = threadIdx.x; k < D; k += THREADS) {
            const int d = ds[k];
            const float2 w0 = weights[((size_t)f * D + d) * 2], w1 = weights[((size_t)f * D + d) * 2 + 1];
            ws[k] = make_uint4(pack(w0.x, w0.y), pack(-w0.y, w0.x), pack(w1.x, w1.y), pack(-w1.y, w1.x));
        }
        // The step after c: later in c's slot, or the start of the next (past j1: not run).
        auto next = [&](Step c) {
            Step r = {c.j, c.t0 + c.n, c.te, 0};
            if (r.t0 >= c.te) {
                r.j = c.j + 1;
                r.t0 = sl.begin(r.j);
                r.te = sl.end(r.j);
            }
            r.n = min(TB, r.te - r.t0);
            return r;
        };

        // |Ẽ|² of this thread's (q, p): rows row16 (lo) and row16 + 8 (hi) mod QP, p = 4c + i.
        float lo[N2 / 8], hi[N2 / 8];
#pragma unroll
        for (int c = 0; c < N2 / 8; c++)
            lo[c] = hi[c] = 0.0f;
        float acc1[AN], acc2[AN];

        // Steps s, s + 1, s + 2 and s + 3; step 0 gridded and through stage 1, step 1 gridded.
        Step cur = {sl.j0, sl.begin(sl.j0), sl.end(sl.j0), 0};
        cur.n = min(TB, cur.te - cur.t0);
        Step nx1 = next(cur), nx2 = next(nx1), nx3 = next(nx2);
        load_raw(raw_buf(0), in, ds, f, cur.t0, cur.n, THREADS);
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads();
        grid_step((unsigned short *)x_buf(0), raw_buf(0), ws, cs, cur.n);
        if (nx1.j < sl.j1)
            load_raw(raw_buf(1), in, ds, f, nx1.t0, nx1.n, THREADS);
        fence_async_smem();
        __syncthreads();
#pragma unroll
        for (int k = 0; k < T1W; k++) {
            stage1(acc1, x_d, a1_d, wg + k * NWG);
            wgmma_wait<0>(acc1);
            store_g(gs, acc1, wg + k * NWG, row16, i);
        }
        if (nx1.j < sl.j1) {
            asm volatile("cp.async.wait_group 0;\n" ::);
            grid_step((unsigned short *)x_buf(1), raw_buf(1), ws, cs, nx1.n);
            if (nx2.j < sl.j1)
                load_raw(raw_buf(0), in, ds, f, nx2.t0, nx2.n, THREADS);
        }
        fence_async_smem();
        __syncthreads();

        auto sum_tile = [&](int tile) {
            const bool ok_lo = (tile * 64 + row16) / QP < 2 * cur.n;
            const bool ok_hi = (tile * 64 + row16 + 8) / QP < 2 * cur.n;
#pragma unroll
            for (int c = 0; c < N2 / 8; c++) {
                if (ok_lo)
                    lo[c] = add_power_fma(lo[c], acc2[4 * c], acc2[4 * c + 1]);
                if (ok_hi)
                    hi[c] = add_power_fma(hi[c], acc2[4 * c + 2], acc2[4 * c + 3]);
            }
        };

        for (int s = 0;; s++) {
            const bool more = nx1.j < sl.j1;
            const u64 g_a = g_d + BUF_DESC(G_BYTES, s), x_a = x_d + BUF_DESC(X_BYTES, s + 1);
            unsigned char *g_next = gs + ((s + 1) & 1) * G_BYTES;
            // Step s's first stage-2 tile and step s+1's stage 1 in flight while step s+2 is
            // gridded and step s+3's samples queued. Stage 1 runs after the last step too (on
            // stale X, its G never read): issued only when `more`, ptxas lost track of the groups
            // and serialised every MMA (C7514).
            stage2(acc2, g_a, b2_d, wg);
            stage1(acc1, x_a, a1_d, wg);
            if (nx2.j < sl.j1) {
                asm volatile("cp.async.wait_group 0;\n" ::);
                grid_step((unsigned short *)x_buf(s), raw_buf(s), ws, cs, nx2.n);
                if (nx3.j < sl.j1)
                    load_raw(raw_buf(s + 1), in, ds, f, nx3.t0, nx3.n, THREADS);
            }
            // Each stage-2 tile summed while the next one (and the first, step s+1's stage 1)
            // runs; G of step s+1 stored once its stage 1 is done.
            wgmma_wait<1>(acc2);
            sum_tile(wg);
            if (T2W > 1) {
                stage2(acc2, g_a, b2_d, wg + NWG);
                wgmma_wait<1>(acc1);
            } else {
                wgmma_wait<0>(acc1);
            }
            store_g(g_next, acc1, wg, row16, i);
#pragma unroll
            for (int k = 1; k < T1W; k++) {
                stage1(acc1, x_a, a1_d, wg + k * NWG);
                wgmma_wait_all(acc1, acc2);
                store_g(g_next, acc1, wg + k * NWG, row16, i);
            }
#pragma unroll
            for (int k = 1; k < T2W; k++) {
                wgmma_wait<0>(acc2);
                sum_tile(wg + k * NWG);
                if (k + 1 < T2W)
                    stage2(acc2, g_a, b2_d, wg + (k + 1) * NWG);
            }
            fence_async_smem();

            if (cur.t0 + cur.n >= cur.te) {
                // Slot j ends: the block's partial sums of each (p, q) added in row order, the slot
                // written (or its part carried).
                const int j = cur.j;
                const bool complete = cur.te == (j + 1) * T_DS - phase;
                const bool carried = j == 0 && phase > 0;
                const size_t plane = (size_t)(2 * M) * (2 * N);
                const size_t at = complete ? ((size_t)f * OUT_MAX + j) * plane : f * plane;
#pragma unroll
                for (int c = 0; c < N2 / 8; c++) {
                    red[(4 * c + i) * 64 * NWG + wg * 64 + row16] = lo[c];
                    red[(4 * c + i) * 64 * NWG + wg * 64 + row16 + 8] = hi[c];
                    lo[c] = hi[c] = 0.0f;
                }
                __syncthreads();
                for (int e = threadIdx.x; e < (int)plane; e += THREADS) {
                    const int p = e / (2 * N), q = e % (2 * N);
                    float v = carried ? carry_in[f * plane + e] : 0.0f;
#pragma unroll
                    for (int k = 0; k < SHARE; k++)
                        v = __fadd_rn(v, red[p * 64 * NWG + k * QP + q]);
                    if (complete)
                        out[at + e] = to_out(v, scale);
                    else
                        carry_out[at + e] = v;
                }
            }
            __syncthreads();
            if (!more)
                break;
            cur = nx1;
            nx1 = nx2;
            nx2 = nx3;
            nx3 = next(nx3);
        }
    }
}
