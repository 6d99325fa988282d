// The portable correlator (issue 12; any sm_80 and later device): warp-level int8
// `mma.sync.m16n8k32` over the corner turn's planar rows (kernels/correlate_turn.cu), adding
// into int64 per-batch accumulators in `dsp::correlate`'s layout.
//
// Compile-time constants (-D): N_ANTS, CHANNELS, TPAD (times per row, a multiple of KSTEP),
// NP (antenna-pols per (batch, channel), a multiple of 64), WINDOW (times summed in int32
// before they are added to int64: |product| ≤ 128², so RR < 2³¹ needs WINDOW ≤ 131072).
//
// Complex products from real ones (correlator_hopper.md "A planar alternative"): rows of a
// channel are Re and Im planes of 8 antenna-pols at a time, so one m16 A tile holds Re and Im
// of 8 row antenna-pols, and the two n8 B tiles Re and Im of 8 column antenna-pols. A thread's
// accumulators then hold RR, IR (from the Re column tile) and RI, II (from the Im one) of the
// same pairs, and V = x_i·conj(x_j) = (RR + II) + i(IR − RI) is formed in the epilogue, in
// int64. Nothing is negated, so −128 is exact. The (−im, re) copy of TCC's scheme is not needed.
//
// Tiling: a block of 4 warps takes one 64 × 64 antenna-pol tile (128 × 128 planar rows) of one
// (batch, channel); blockIdx.x walks the triangle of tiles with row tile ≤ column tile
// (Hermitian symmetry: the others are conjugates), blockIdx.y the channel, blockIdx.z the
// batch. Warps split the tile 2 × 2 (32 × 32 antenna-pols each: 4 m16 × 8 n8 mma per k32, 128
// int32 accumulators per thread); on a diagonal tile the warp strictly below the diagonal sits
// out. Operands are staged in shared memory by `cp.async`, three stages of KSTEP = 64 times,
// with the four 16-byte chunks of each 64-byte row XOR-swizzled so that `ldmatrix` is free of
// bank conflicts. The alternative not taken, TCC's 32-wide tiles with the full square
// computed on diagonals, wastes more of the tensor cores at small antenna counts.

#define THREADS 128
#define KSTEP 64
#define STAGES 3
#define TILE_ROWS 128 // planar rows per operand tile: 64 antenna-pols × (Re, Im)
#define TILES (NP / 64)
#define N_BASELINES (N_ANTS * (N_ANTS + 1) / 2)

typedef long long i64;
typedef unsigned int u32;

// Byte offset of 16-byte chunk `chunk` (0..3) of planar row `row` within one operand stage.
__device__ __forceinline__ int swz(int row, int chunk)
{
    return row * KSTEP + ((chunk ^ ((row >> 1) & 3)) << 4);
}

__device__ __forceinline__ void cp_async16(u32 dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Row tile and column tile (row ≤ column) of triangle index `k`, walked column by column.
__device__ __forceinline__ void tile_of(int k, int &rt, int &ct)
{
    ct = 0;
    while ((ct + 1) * (ct + 2) / 2 <= k)
        ++ct;
    rt = k - ct * (ct + 1) / 2;
}

// Blocks per SM the registers must allow: three on sm_90 (168 registers; its 228 KB of shared
// memory holds three blocks' stages) where a launch is one window, the compiler's own choice
// elsewhere (sm_89 has room for two blocks' stages only; the window loop spills at 168).
#if __CUDA_ARCH__ >= 900 && TPAD <= WINDOW
#define MIN_BLOCKS 3
#else
#define MIN_BLOCKS 1
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) corr_mma(const signed char *__restrict__ planar,
                                                              i64 *__restrict__ acc)
{
    __shared__ __align__(128) unsigned char smem[STAGES][2][TILE_ROWS * KSTEP];
    int rt, ct;
    tile_of(blockIdx.x, rt, ct);
    const int c = blockIdx.y;
    const int b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wr = warp >> 1, wc = warp & 1;
    const bool idle = rt == ct && wr > wc;
    const signed char *chan = planar + ((i64)b * CHANNELS + c) * (i64)(2 * NP) * TPAD;
    const signed char *a_src = chan + (i64)rt * TILE_ROWS * TPAD;
    const signed char *b_src = chan + (i64)ct * TILE_ROWS * TPAD;
    const u32 sbase = (u32)__cvta_generic_to_shared(&smem[0][0][0]);

    // Each thread copies 8 of the 2 × 512 16-byte chunks of a stage.
    auto load = [&](int stage, int t0) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
        {
            const int op = i >> 2; // unrolled: A for i < 4, B after
            const int idx = (i & 3) * THREADS + threadIdx.x; // 0..511
            const int row = idx >> 2, chunk = idx & 3;
            cp_async16(sbase + (stage * 2 + op) * TILE_ROWS * KSTEP + swz(row, chunk),
                       (op ? b_src : a_src) + (i64)row * TPAD + t0 + chunk * 16);
        }
    };

    for (int w0 = 0; w0 < TPAD; w0 += WINDOW)
    {
        int steps = (min(TPAD, w0 + WINDOW) - w0) / KSTEP;
        // Opaque to the compiler: with one step known at compile time (TPAD = KSTEP) ptxas
        // spread the sm_90 epilogue through the MMAs and spilled at 255 registers.
        asm("" : "+r"(steps));
        int d[4][8][4];
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int nj = 0; nj < 8; ++nj)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    d[mi][nj][e] = 0;

        load(0, w0);
        asm volatile("cp.async.commit_group;\n" ::);
        if (steps > 1)
            load(1, w0 + KSTEP);
        asm volatile("cp.async.commit_group;\n" ::);
        for (int s = 0; s < steps; ++s)
        {
            asm volatile("cp.async.wait_group 1;\n" ::);
            __syncthreads(); // stage s is in; every warp is done with stage s - 1's buffer
            if (s + 2 < steps)
                load((s + 2) % STAGES, w0 + (s + 2) * KSTEP);
            asm volatile("cp.async.commit_group;\n" ::);
            if (idle)
                continue;
            const u32 a_base = sbase + (s % STAGES) * 2 * TILE_ROWS * KSTEP;
            const u32 b_base = a_base + TILE_ROWS * KSTEP;
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
            {
                u32 a[4][4], bf[4][4];
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
                {
                    // Matrices: (Re, k 0-15), (Im, k 0-15), (Re, k 16-31), (Im, k 16-31).
                    const int row = (wr * 4 + mi) * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
                    ldmatrix_x4(a[mi], a_base + swz(row, kk * 2 + (lane >> 4)));
                }
#pragma unroll
                for (int h = 0; h < 4; ++h)
                {
                    // Matrices: (Re, k 0-15), (Re, k 16-31), (Im, k 0-15), (Im, k 16-31).
                    const int row = (wc * 4 + h) * 16 + (lane & 7) + 8 * (lane >> 4);
                    ldmatrix_x4(bf[h], b_base + swz(row, kk * 2 + ((lane >> 3) & 1)));
                }
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int h = 0; h < 4; ++h)
                    {
                        mma_s8(d[mi][2 * h], a[mi], bf[h][0], bf[h][1]);
                        mma_s8(d[mi][2 * h + 1], a[mi], bf[h][2], bf[h][3]);
                    }
            }
        }
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads(); // the stage buffers are free: the next window's prologue, or staging
        const int gid = lane >> 2, q = lane & 3;
        i64 *out = acc + ((i64)b * CHANNELS + c) * N_BASELINES * 8;
#if __CUDA_ARCH__ >= 900
        // Epilogue on sm_90: each warp adds its 16 × 16 antennas with bulk asynchronous
        // reduce-adds (as `corr_wgmma` does; two's-complement addition is the same for signed
        // values), so the block leaves while the adds drain in L2 instead of waiting for its
        // read-modify-writes' round trips. Round h stages the warp's column antennas
        // 4h .. 4h + 3 (n8 tiles 2h, 2h + 1: columns (wc·4 + h)·8 + 2q + e) in the accumulators'
        // order, (column antenna, row antenna, product, re/im), 1 KB of 16 row antennas for each;
        // lane l < 4 then adds column antenna 4h + l's run. Two 4 KB buffers per warp alternate
        // in the stage memory: before a buffer is written again, its adds must have read it.
        if (!idle)
        {
            const u32 wbuf = sbase + warp * 8192;
            longlong2 *staged = reinterpret_cast<longlong2 *>(&smem[0][0][0]) + warp * 512;
            const int a1g = rt * 32 + wr * 16; // the warp's first row antenna
#pragma unroll
            for (int h = 0; h < 4; ++h)
            {
                if (h >= 2)
                {
                    if (lane < 4)
                        asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
                    __syncwarp();
                }
                longlong2 *o = staged + (h & 1) * 256;
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                    {
                        const i64 rr = d[mi][2 * h][e], ir = d[mi][2 * h][2 + e];
                        const i64 ri = d[mi][2 * h + 1][e], ii = d[mi][2 * h + 1][2 + e];
                        o[(q * 16 + mi * 4 + (gid >> 1)) * 4 + (gid & 1) + 2 * e] =
                            make_longlong2(rr + ii, ir - ri);
                    }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (lane < 4)
                {
                    const int a2 = ct * 32 + wc * 16 + h * 4 + lane;
                    const int a1hi = min(a1g + 15, a2);
                    if (a2 < N_ANTS && a1hi >= a1g)
                    {
                        i64 *dst = out + (i64)(a2 * (a2 + 1) / 2 + a1g) * 8;
                        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(dst),
                                     "r"(wbuf + (h & 1) * 4096 + lane * 1024), "r"((a1hi - a1g + 1) * 64)
                                     : "memory");
                    }
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
            // The staging must be read before the next window's copies overwrite it (and
            // outlive the block); a following window's adds go to the same accumulators, so
            // there these must have completed.
            if (lane < 4)
            {
                if (w0 + WINDOW < TPAD)
                    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
                else
                    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            }
        }
        __syncthreads();
#else
        if (idle)
            continue;
        // Epilogue: thread holds rows gid (Re) and gid + 8 (Im) of each m16 tile and columns
        // 2q, 2q + 1 of each n8 tile. Per m16 tile, all 8 read-modify-writes load before any
        // stores: one at a time, each waited a DRAM round trip (the compiler cannot prove that
        // the addresses differ), which cost as much as the multiplications.
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
        {
            const int i = rt * 64 + (wr * 4 + mi) * 8 + gid;
            const int a1 = i >> 1, p1 = i & 1;
            longlong2 *v[4][2];
            longlong2 old[4][2];
#pragma unroll
            for (int h = 0; h < 4; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                {
                    const int j = ct * 64 + (wc * 4 + h) * 8 + 2 * q + e;
                    const int a2 = j >> 1, p2 = j & 1;
                    v[h][e] = a1 <= a2 && a2 < N_ANTS
                                  ? reinterpret_cast<longlong2 *>(out) + (i64)(a2 * (a2 + 1) / 2 + a1) * 4 + p1 + 2 * p2
                                  : nullptr;
                    if (v[h][e])
                        old[h][e] = *v[h][e];
                }
#pragma unroll
            for (int h = 0; h < 4; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (v[h][e])
                    {
                        const i64 rr = d[mi][2 * h][e], ir = d[mi][2 * h][2 + e];
                        const i64 ri = d[mi][2 * h + 1][e], ii = d[mi][2 * h + 1][2 + e];
                        *v[h][e] = make_longlong2(old[h][e].x + rr + ii, old[h][e].y + ir - ri);
                    }
        }
#endif
    }
}
