// The wgmma correlator's shapes and work (`gpu::compile` puts this file after
// kernels/hopper_cluster.cuh and before kernels/correlate_wgmma_fused.cuh and
// kernels/correlate_wgmma.cu, whose header describes the kernel): the compile-time constants,
// the shared-memory matrix descriptor and the warpgroup MMA wrappers, and the mapping of a
// work item to its channel, column tile and row chunks.

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "correlate_wgmma.cu needs sm_90a (wgmma)"
#endif

#ifndef FUSED
#define FUSED 0
#endif
#if FUSED && (SPECTRA % 128 != 0)
#error "FUSED needs SPECTRA % KSTEP == 0: a step must lie in one batch"
#endif

#ifndef RIDE
#define RIDE 0
#endif

#define CONSUMERS 256 // two warpgroups
#if FUSED
#define PRODUCERS 128 // a producer warpgroup that de-interleaves the chunk's words
#elif RIDE
#define PRODUCERS 128 // a producer warp and three turners (kernels/correlate_wgmma_ride.cuh)
#else
#define PRODUCERS 32 // a producer warp whose lane 0 issues bulk copies
#endif
#define THREADS (CONSUMERS + PRODUCERS)
#define KSTEP 128                 // times per stage: one 128-byte swizzle row
#define A_ROWS 128                // planar rows of a block's row tile (64 antenna-pols)
#define B_ROWS 256                // planar rows of the column tile (128 antenna-pols)
#define A_BYTES (A_ROWS * KSTEP)
#define CHUNK_BYTES (A_BYTES / 2) // a warpgroup's row chunk: 64 planar rows
#define B_BYTES (B_ROWS * KSTEP)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define COL_TILES (NP / 128)
#define PAIRS (COL_TILES * (COL_TILES + 1) / 2)
#define N_BASELINES (N_ANTS * (N_ANTS + 1) / 2)
#define STAGE_A2 64 // antennas of a column tile
#define RING 4      // slots of the cluster's item ring

typedef long long i64;
typedef unsigned long long u64;

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

// The accumulator registers an m64nNk32 wgmma names, a quarter (64 column planar rows, 32
// accumulators) at a time. A trimmed MMA (N = 256 − 64·J0, its B operand starting at the
// column tile's planar row 64·J0) writes accumulators 0 .. N/2 − 1, so accumulator i holds
// column chunk i / 4 + 8·J0. Every shape starts at accumulator 0: with the trimmed ones writing
// the full one's last registers instead (the same columns in the same registers), ptxas
// serialised every wgmma for want of registers (C7511).
#define WG_REGS_0 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_1 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
    "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_2 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, " \
    "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_REGS_3 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, " \
    "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, " \
    "%125, %126, %127"
#define WG_OUTS \
    "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
    "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), \
    "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), \
    "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), \
    "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), \
    "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), \
    "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), \
    "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), \
    "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), \
    "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), \
    "+r"(d[71]), "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), \
    "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), \
    "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), \
    "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), \
    "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), "+r"(d[104]), \
    "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), \
    "+r"(d[111]), "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), \
    "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), \
    "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
#define WGMMA_S8(N, REGS)                                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                   \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.s32.s8.s8 {" REGS "}, %128, %129, p;\n}\n" \
                 : WG_OUTS                                                                        \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d))

// One m64nNk32 s8 warpgroup MMA (N = 256 − 64·J0) from two shared-memory descriptors into this
// thread's int32 accumulators 0 .. 127 − 32·J0; `scale_d` = 0 starts the sum afresh, 1 adds to it.
// The trimmed shapes serve the diagonal items, where a row chunk needs only the columns at or
// after it (see corr_wgmma).
template <int J0>
__device__ __forceinline__ void wgmma_s8(int (&d)[128], u64 a_desc, u64 b_desc, int scale_d)
{
    if constexpr (J0 == 0)
        WGMMA_S8(256, WG_REGS_0 ", " WG_REGS_1 ", " WG_REGS_2 ", " WG_REGS_3);
    else if constexpr (J0 == 1)
        WGMMA_S8(192, WG_REGS_0 ", " WG_REGS_1 ", " WG_REGS_2);
    else if constexpr (J0 == 2)
        WGMMA_S8(128, WG_REGS_0 ", " WG_REGS_1);
    else
        WGMMA_S8(64, WG_REGS_0);
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

// Item → (batch group and channel `cb`, column tile ct, pair pp of its row tiles), pairs inner:
// column tile ct holds row tiles 0 .. 2·ct + 1, i.e. ct + 1 pairs (the last on the diagonal),
// so the pairs before it number ct·(ct + 1)/2. Items are handed out in this order (next_item),
// so the clusters at work at once share a few channels' rows in L2.
__device__ __forceinline__ void item_parts(int it, int &cb, int &ct, int &pp)
{
    const int k = it % PAIRS;
    cb = it / PAIRS;
    ct = 0;
    while ((ct + 1) * (ct + 2) / 2 <= k)
        ++ct;
    pp = k - ct * (ct + 1) / 2;
}

// The row chunk (32 antenna-pols: 64 planar rows, 8 KB of a step) that warpgroup wg of block
// `rank` multiplies in pair pp of column tile ct. Off the diagonal (pp < ct) the block takes
// row tile 2·pp + rank whole, one chunk per warpgroup. On it (pp = ct, the row tiles that are
// the column tile itself) row chunk j of the tile needs only the columns from its own first
// antenna-pol on, N = 256 − 64·j planar rows, so the four chunks cost 4 : 3 : 2 : 1 tensor
// time; block 0 takes chunks 0 and 3, block 1 chunks 1 and 2, which balances the two blocks
// (5 : 5) that share each stage through the multicast, and the diagonal item costs 5/8 of a
// full one.
__device__ __forceinline__ int row_chunk(int ct, int pp, int rank, int wg)
{
    if (pp < ct)
        return 2 * (2 * pp + rank) + wg;
    return wg == 0 ? 4 * ct + rank : 4 * ct + 3 - rank;
}

// The planar row of antenna `ant` (counted from a tile's or channel's first) holding split4's
// output q, i.e. plane q % 2 (Re, Im) of pol q / 2: the corner turn's order, (ant / 4)·16 +
// plane·8 + 2·(ant % 4) + pol (kernels/correlate_turn.cu `word`), for both staged producers.
__device__ __forceinline__ int planar_row(int ant, int q)
{
    return (ant >> 2) * 16 + (q & 1) * 8 + 2 * (ant & 3) + (q >> 1);
}

// The de-interleave of both staged producers (FUSED, RIDE): a byte permute.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel)
{
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// The four planar rows' words of 4 consecutive times from their samples w0 … w3 (each word
// (re₀, im₀, re₁, im₁) of one time): rows (pol 0, Re), (0, Im), (1, Re), (1, Im).
__device__ __forceinline__ void split4(u32 w0, u32 w1, u32 w2, u32 w3, u32 (&r)[4])
{
    const u32 lo01 = prmt(w0, w1, 0x5140), hi01 = prmt(w0, w1, 0x7362);
    const u32 lo23 = prmt(w2, w3, 0x5140), hi23 = prmt(w2, w3, 0x7362);
    r[0] = prmt(lo01, lo23, 0x5410);
    r[1] = prmt(lo01, lo23, 0x7632);
    r[2] = prmt(hi01, hi23, 0x5410);
    r[3] = prmt(hi01, hi23, 0x7632);
}
