// The Hopper correlator (issue 12; sm_90a only): warpgroup MMA (`wgmma.mma_async` m64n256k32
// s8) over the corner turn's planar rows (kernels/correlate_turn.cu), adding into int64
// per-batch accumulators in `dsp::correlate`'s layout, exactly as kernels/correlate_mma.cu does
// with warp-level MMA (same planar scheme, same epilogue: V = (RR + II) + i(IR − RI)).
//
// Compile-time constants (-D): N_ANTS, CHANNELS, TPAD (times per row, a multiple of KSTEP),
// NP (antenna-pols per (batch, channel), a multiple of 128), STAGES (shared-memory stages,
// 3 to 4). A launch sums steps [step0, step0 + nsteps) of KSTEP times in int32; the host keeps
// nsteps · KSTEP ≤ 65536 so that RR stays below 2³¹ (|product| ≤ 128²), and launches again for
// longer rows.
//
// Tiling: a block of two consumer warpgroups (and a producer warpgroup) takes 64 row
// antenna-pols × 128 column antenna-pols of one (batch, channel): warpgroup g multiplies its 64 planar rows (32 antenna-pols: Re and Im of 8
// at a time, one group per warp) by the block's 256 planar column rows, so each thread's n8
// chunks 2h and 2h + 1 hold RR, IR and RI, II of the same pairs (the wgmma accumulator layout
// repeats mma.sync's per 16-row warp slice). blockIdx.x walks the tiles (row tile, column
// tile) that hold any baseline a1 ≤ a2, blockIdx.y the channel, blockIdx.z the batch.
//
// Staging (warp-specialised): a third warpgroup, the producer, copies each stage with `cp.async`
// (16 bytes) into the 128-byte-swizzle layout wgmma reads (8 rows × 128 B atoms, 16-byte chunk c
// of row r at (c ^ (r & 7)) · 16, stage buffers 1024-byte aligned; K advances by 32 B inside an
// atom) and signals a "full" mbarrier when its copies land (`cp.async.mbarrier.arrive.noinc`);
// the two consumer warpgroups wait on it, make the copies visible to the tensor cores
// (`fence.proxy.async`), issue the stage's wgmma, wait for them, and arrive on the stage's
// "empty" mbarrier, which the producer waits on before it refills the buffer. So up to
// STAGES − 1 stages are in flight while one is multiplied, and the consumers never wait for each
// other or for the producer's issue. A first version (every thread copying, a block barrier per
// stage, loads two stages ahead) reached 38 % of L2 and 36 % of the tensor pipe, latency-bound;
// a single producer warp was slower still (bench/correlator-notes.md). The epilogue adds the
// tile into the int64 accumulators with bulk asynchronous reduce-adds from shared memory (see
// there). Not taken (yet): TMA loads with multicast across a cluster (half the L2 traffic per
// tile), trimming N on diagonal tiles, fusing the corner turn into the producer.

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "correlate_wgmma.cu needs sm_90a (wgmma)"
#endif

#define CONSUMERS 256             // two warpgroups
#define PRODUCERS 128             // and the producer warpgroup
#define THREADS (CONSUMERS + PRODUCERS)
#define KSTEP 128               // times per stage: one 128-byte swizzle row
#define A_ROWS 128              // planar rows of the block's row tile (64 antenna-pols)
#define B_ROWS 256              // planar rows of the column tile (128 antenna-pols)
#define STAGE_BYTES ((A_ROWS + B_ROWS) * KSTEP)
#define COL_TILES (NP / 128)
#define N_BASELINES (N_ANTS * (N_ANTS + 1) / 2)
#define STAGE_A1 32 // antennas of a row tile
#define STAGE_A2 64 // antennas of a column tile

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ void cp_async16(u32 dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): K-major operand in the
// 128-byte swizzle, 1024 bytes between 8-row groups (stride byte offset); the leading byte
// offset is unused for K-major swizzled layouts and set to 1 as CUTLASS does.
__device__ __forceinline__ u64 desc(u32 smem_addr)
{
    u64 d = 0;
    d |= (u64)((smem_addr & 0x3FFFF) >> 4);
    d |= (u64)1 << 16;
    d |= (u64)(1024 >> 4) << 32;
    d |= (u64)1 << 62;
    return d;
}

// One m64n256k32 s8 warpgroup MMA from two shared-memory descriptors into the 128 int32
// accumulators of this thread; `scale_d` = 0 starts the sum afresh, 1 adds to it.
__device__ __forceinline__ void wgmma_m64n256k32(int (&d)[128], u64 a_desc, u64 b_desc, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                 "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                 "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                 "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                 "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                 "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                 "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                 "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
                 "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
                 "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
                 "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
                 "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
                 "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
                 "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
                 "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
                 "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

// Wait until at most N wgmma groups are in flight. The accumulators are named as operands so
// that the compiler keeps every use of them after the wait (not doing so is what makes ptxas
// serialise wgmma).
template <int N>
__device__ __forceinline__ void wgmma_wait(int (&d)[128])
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#pragma unroll
    for (int i = 0; i < 128; ++i)
        asm volatile("" : "+r"(d[i])::"memory");
}

// Block index → (row tile of 64 antenna-pols, column tile of 128): column tile ct holds row
// tiles 0 .. 2·ct + 1, so the tiles before it number ct·(ct + 1).
__device__ __forceinline__ void tile_of(int k, int &rt, int &ct)
{
    ct = 0;
    while ((ct + 1) * (ct + 2) <= k)
        ++ct;
    rt = k - ct * (ct + 1);
}

__device__ __forceinline__ void mbar_init(u32 bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) corr_wgmma(const signed char *__restrict__ planar,
                                                                    i64 *__restrict__ acc, int step0, int nsteps)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 bars[2 * STAGES]; // full[s], then empty[s]
    int rt, ct;
    tile_of(blockIdx.x, rt, ct);
    const int c = blockIdx.y;
    const int b = blockIdx.z;
    const int warp_all = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Dynamic shared memory is only 16-byte aligned by contract: round up to 1024.
    const u32 sbase = ((u32)__cvta_generic_to_shared(smem) + 1023) & ~1023u;
    const u32 full = (u32)__cvta_generic_to_shared(bars), empty = full + 8 * STAGES;
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; ++s)
        {
            mbar_init(full + 8 * s, PRODUCERS);
            mbar_init(empty + 8 * s, CONSUMERS);
        }
    __syncthreads();

    if (threadIdx.x >= CONSUMERS)
    {
        // The producer warpgroup.
        const int p = threadIdx.x - CONSUMERS;
        const signed char *chan = planar + ((i64)b * CHANNELS + c) * (i64)(2 * NP) * TPAD;
        const signed char *a_src = chan + (i64)rt * A_ROWS * TPAD;
        const signed char *b_src = chan + (i64)ct * B_ROWS * TPAD;
        for (int k = 0; k < nsteps; ++k)
        {
            const int s = k % STAGES;
            if (k >= STAGES)
                mbar_wait(empty + 8 * s, ((k / STAGES) & 1) ^ 1);
            const u32 st = sbase + s * STAGE_BYTES;
            const int t0 = (step0 + k) * KSTEP;
#pragma unroll
            for (int i = 0; i < (A_ROWS + B_ROWS) * 8 / PRODUCERS; ++i)
            {
                const int idx = i * PRODUCERS + p;
                const int row = idx >> 3, chunk = idx & 7; // row < A_ROWS: A; else B
                const signed char *src =
                    row < A_ROWS ? a_src + (i64)row * TPAD : b_src + (i64)(row - A_ROWS) * TPAD;
                cp_async16(st + row * KSTEP + ((chunk ^ (row & 7)) << 4), src + t0 + chunk * 16);
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full + 8 * s) : "memory");
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // The consumers.
    const int wg = threadIdx.x / 128, warp = warp_all % 4;
    int d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        d[i] = 0;
    for (int k = 0; k < nsteps; ++k)
    {
        const int s = k % STAGES;
        mbar_wait(full + 8 * s, (k / STAGES) & 1);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const u32 st = sbase + s * STAGE_BYTES;
        const u32 a_tile = st + wg * 64 * KSTEP;
        const u32 b_tile = st + A_ROWS * KSTEP;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < KSTEP / 32; ++kk)
            wgmma_m64n256k32(d, desc(a_tile + kk * 32), desc(b_tile + kk * 32), 1);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        wgmma_wait<0>(d);
        mbar_arrive(empty + 8 * s);
    }

    // Epilogue. Warp `warp` of warpgroup `wg` holds planar rows gid (Re) and gid + 8 (Im) of
    // antenna-pol group 4·wg + warp of the row tile; n8 chunk j covers column rows 8j .. 8j + 7
    // (Re of group j/2 for even j, Im for odd), columns 2q, 2q + 1. The sums go to shared
    // memory in the accumulators' own order, (column antenna, row antenna, product, re/im), which
    // is contiguous over the row antennas of one column antenna; then one bulk asynchronous
    // reduce-add per column antenna adds them into the int64 accumulators (two's-complement
    // addition is the same for signed values). Added one baseline at a time, each thread's 64
    // read-modify-writes waited a DRAM round trip each (bench/correlator-notes.md). Every
    // stage buffer is free once both warpgroups are past their last wgmma (named barrier 1).
    asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS) : "memory");
    longlong2 *staged = reinterpret_cast<longlong2 *>(smem + (sbase - (u32)__cvta_generic_to_shared(smem)));
    const int gid = lane >> 2, q = lane & 3;
    const int i_local = (wg * 4 + warp) * 8 + gid; // row antenna-pol within the tile
    const int a1l = i_local >> 1, p1 = i_local & 1;
#pragma unroll
    for (int h = 0; h < 16; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
        {
            const int a2l = 4 * h + q, p2 = e; // column antenna-pol h·8 + 2q + e
            const i64 rr = d[8 * h + e], ir = d[8 * h + 2 + e], ri = d[8 * h + 4 + e], ii = d[8 * h + 6 + e];
            staged[(a2l * STAGE_A1 + a1l) * 4 + p1 + 2 * p2] = make_longlong2(rr + ii, ir - ri);
        }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, %0;\n" ::"n"(CONSUMERS) : "memory");
    if (threadIdx.x < STAGE_A2)
    {
        const int a2 = ct * STAGE_A2 + threadIdx.x;
        const int a1lo = rt * STAGE_A1, a1hi = min(a1lo + STAGE_A1 - 1, a2);
        if (a2 < N_ANTS && a1hi >= a1lo)
        {
            i64 *dst = acc + (((i64)b * CHANNELS + c) * N_BASELINES + a2 * (a2 + 1) / 2 + a1lo) * 8;
            const u32 src = sbase + threadIdx.x * STAGE_A1 * 64;
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(dst),
                         "r"(src), "r"((a1hi - a1lo + 1) * 64)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        }
    }
}
