// Hopper thread-block-cluster primitives for kernels/correlate_wgmma.cu (`gpu::compile` puts
// this file before it): mbarriers in shared memory (initialised, waited on with CTA- or
// cluster-scope acquire, arrived on in this block or another of the cluster), addresses in
// another block's shared memory (`mapa`), the cluster barrier, and bulk asynchronous copies
// from global memory (to this block, or multicast to several) that complete on an mbarrier.
// Nothing here depends on the correlator's constants.

typedef unsigned int u32;

__device__ __forceinline__ int cluster_rank()
{
    u32 v;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(v));
    return (int)v;
}

__device__ __forceinline__ void mbar_init(u32 bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

// Wait until the mbarrier at shared offset `bar` has completed the phase of `parity`, with
// CTA-scope acquire, or with CLUSTER cluster-scope acquire: for data that another block of the
// cluster wrote before its arrival (the correlator's item ring).
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity)
{
#define MBAR_WAIT_LOOP(SCOPE, LABEL)                                                             \
    asm volatile("{\n.reg .pred p;\n" LABEL ":\nmbarrier.try_wait.parity" SCOPE               \
                 ".shared::cta.b64 p, [%0], %1;\n@!p bra " LABEL ";\n}\n" ::"r"(bar), "r"(parity) \
                 : "memory")
    if constexpr (CLUSTER)
        MBAR_WAIT_LOOP(".acquire.cluster", "WAITC");
    else
        MBAR_WAIT_LOOP("", "WAIT");
#undef MBAR_WAIT_LOOP
}

// The shared-memory address in block `rank` of the cluster of this block's shared offset `addr`.
__device__ __forceinline__ u32 in_block(u32 addr, u32 rank)
{
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}

// Arrive with cluster-scope release on the mbarrier at shared offset `bar` of block `rank`.
__device__ __forceinline__ void mbar_arrive_at(u32 bar, u32 rank)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(in_block(bar, rank)) : "memory");
}

// Arrive on the mbarrier at shared offset `bar` in both blocks of a two-block cluster, with
// the default (CTA-scope) semantics: for an arrival that publishes no data to the peer (the
// correlator's consumers releasing a stage once their own reads of it are done).
// `.release.cluster` made every such arrival wait for a cluster-wide memory fence, which
// stalled those consumers half of the time (Nsight Compute, bench/correlator-notes.md v7).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar)
{
#pragma unroll
    for (u32 rank = 0; rank < 2; ++rank)
        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(in_block(bar, rank)) : "memory");
}

__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Stage `bytes` contiguous bytes from global memory into this block's shared memory, counted on
// the mbarrier `bar`; with `mask`, into the same offset of every block in the mask.
__device__ __forceinline__ void bulk_load(u32 dst, const void *src, u32 bytes, u32 bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void bulk_load_multicast(u32 dst, const void *src, u32 bytes, u32 bar, unsigned short mask)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, "
                 "[%3], %4;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "h"(mask)
                 : "memory");
}
