// The Hopper correlator (issue 12; sm_90a only): warpgroup MMA (`wgmma.mma_async` m64n256k32
// s8) over the corner turn's planar rows (kernels/correlate_turn.cu with TILED = 1), or with
// FUSED over the chunk itself, de-interleaved into the same rows as it is staged, adding into
// int64 per-batch accumulators in `dsp::correlate`'s layout, exactly as kernels/correlate_mma.cu
// does with warp-level MMA (same planar scheme, same products: V = (RR + II) + i(IR − RI)).
//
// `gpu::compile` puts before this file kernels/hopper_cluster.cuh (the cluster's mbarriers,
// barrier and bulk copies), kernels/correlate_wgmma_tiles.cuh (the constants, the MMA
// wrappers, the work items), kernels/correlate_wgmma_fused.cuh (the fused producer) and
// kernels/correlate_wgmma_ride.cuh (RIDE: the corner turn's turner warps in this launch).
//
// Compile-time constants (-D): N_ANTS, CHANNELS, TPAD (times per row, a multiple of KSTEP), NP
// (antenna-pols per (batch, channel), a multiple of 128), STAGES (shared-memory stages), FUSED
// (1: stage from the chunk, see copy_item and split_item), RIDE (1: turn the chunk in this
// launch, kernels/correlate_wgmma_ride.cuh); with either, SPECTRA and GROUP too. A launch
// sums steps [step0, step0 + nsteps) of KSTEP times in int32; the host keeps nsteps · KSTEP ≤
// 65536 so that RR stays below 2³¹ (|product| ≤ 128²), and launches again for longer rows.
//
// Work: an item is one (batch group, channel, column tile of 128 antenna-pols, pair of row
// tiles of 64 antenna-pols). A cluster of two blocks takes an item, block r of the cluster the
// row tile 2p + r (on the diagonal, two of its four row chunks: row_chunk), so both multiply
// the same column tile: each block loads half of the column tile's 256 planar rows and multicasts it to both (cp.async.bulk … .multicast::cluster), which
// halves the L2 → SM traffic of the column operand (48 KB → 32 KB staged per block per step; at
// ~1,000 useful TOPS v6 pulled ≈ 6 TB/s out of L2, bench/correlator-notes.md). The grid is
// persistent: as many clusters as fit at once, each taking the next item from a counter of the
// launch's (block 0's producer takes it and passes it to the rest of the cluster through a ring
// in shared memory), so that one item's epilogue overlaps the next item's loads, the blocks
// never drain and refill the pipeline per tile as v6's one-tile blocks did, items of unequal
// cost (the diagonal's) balance out, and the clusters at work at once stay on neighbouring
// items, which share their rows in L2 (dealt statically instead, the clusters drifted apart by
// up to 200 channels and lost that sharing: bench/correlator-notes.md v9).
//
// Block: two consumer warpgroups and one producer warp (FUSED: a producer warpgroup, one
// copier warp and three splitters, each block the whole column tile, no multicast; RIDE: the
// producer warp and three turner warps writing the planar rows it stages).
// The producer's lane 0 stages each step
// with two bulk copies (one on the diagonal, whose row chunks are the column tile's own rows;
// the corner turn stored a step of a tile's rows contiguously, already in
// the 128-byte swizzle wgmma reads: 16-byte chunk c of row r at (c ^ (r & 7)) · 16) onto the
// stage's "full" mbarrier (transaction bytes), after waiting on its "empty" mbarrier, which every
// consumer warp of both blocks arrives on once its wgmma reading the stage has completed (the
// multicast writes the peer's stage too). Consumer warpgroup g multiplies its 64 planar rows (32
// antenna-pols: Re and Im of 8 at a time, one group per warp) by the 256 column rows, so each
// thread's n8 chunks 2h and 2h + 1 hold RR, IR and RI, II of the same pairs (the wgmma
// accumulator layout repeats mma.sync's per 16-row warp slice); one step's wgmma stay in flight
// while the next step's are issued. The epilogue adds the item's sums into the int64
// accumulators with bulk asynchronous reduce-adds from a shared staging area of its own (not
// the stages, which the producer is already refilling), a quarter of the column antennas at a
// time. On the diagonal (a column tile against its own antenna-pols) each warpgroup multiplies
// only the columns at or after its row chunk, with a narrower wgmma (row_chunk), so a
// diagonal item costs 5/8 of a full one (the work below the diagonal was a tenth of the issued
// work at N = 576, a fifth at 256, half at 64).

// The item of sequence number `seq` from the cluster's ring (next_item), read by one lane of
// every consumer warp and by block 1's producer (FUSED: of every producer warp of both
// blocks); the reader's arrival on block 0's "taken"
// mbarrier lets block 0's producer reuse the slot.
__device__ __forceinline__ int take_item(u32 seq, u32 ring_full, u32 ring_taken, const volatile int *ring)
{
    const u32 q = seq % RING;
    mbar_wait<true>(ring_full + 8 * q, (seq / RING) & 1);
    const int item = ring[q];
    mbar_arrive_at(ring_taken + 8 * q, 0);
    return item;
}

// take_item for a whole warp: its lane 0 takes the item (one arrival per warp) and shares it.
__device__ __forceinline__ int warp_take_item(u32 seq, u32 ring_full, u32 ring_taken, const volatile int *ring)
{
    int it = 0;
    if (threadIdx.x % 32 == 0)
        it = take_item(seq, ring_full, ring_taken, ring);
    return __shfl_sync(0xffffffffu, it, 0);
}

// Block 0's publication of item `it` (−1: none left) as sequence number `seq` into both
// blocks' rings (the ring at shared offset `ring0`), once every reader has taken the slot's
// previous item.
__device__ __forceinline__ void publish_item(u32 seq, int it, u32 ring0, u32 ring_full, u32 ring_taken)
{
    const u32 q = seq % RING;
    if (seq >= RING)
        mbar_wait<true>(ring_taken + 8 * q, ((seq / RING) & 1) ^ 1);
#pragma unroll
    for (u32 r = 0; r < 2; ++r)
    {
        asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(in_block(ring0 + 4 * q, r)), "r"(it) : "memory");
        mbar_arrive_at(ring_full + 8 * q, r);
    }
}

// A consumer warp's release of a stage it has finished reading: to both blocks' producers where
// the column tile is multicast into both (each block's copy half of it), to its own block's
// where its producers stage every row themselves (FUSED).
__device__ __forceinline__ void release_stage(u32 bar)
{
#if FUSED
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
    mbar_arrive_cluster(bar);
#endif
}

// One item's steps for a consumer warpgroup: wait for each stage, issue its KSTEP / 32 MMAs of
// the warpgroup's row chunk (A: 64 planar rows at the stage's offset wg · 64 rows, or on the
// diagonal the column tile's own rows 64·J0 on) against
// column planar rows 64·J0 .. 255 (B), keep one step's group in flight while the next is
// issued, and release each stage (release_stage) once its MMAs have completed.
template <int J0>
__device__ __forceinline__ void multiply(int (&d)[128], u32 sbase, int wg, bool diag, u32 full, u32 empty, int nsteps,
                                         u32 &g)
{
    const int lane = threadIdx.x % 32;
    for (int k = 0; k < nsteps; ++k, ++g)
    {
        const u32 s = g % STAGES;
        mbar_wait(full + 8 * s, (g / STAGES) & 1);
        const u32 st = sbase + s * STAGE_BYTES;
        const u32 b_tile = st + A_BYTES + J0 * 64 * KSTEP;
        // On the diagonal the row chunk J0 is the column tile's planar rows 64·J0 on, already
        // staged (in the same swizzle), so nothing else was loaded for it.
        const u32 a_tile = diag ? b_tile : st + wg * CHUNK_BYTES;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < KSTEP / 32; ++kk)
            wgmma_s8<J0>(d, desc(a_tile + kk * 32), desc(b_tile + kk * 32), 1);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // The previous step's wgmma are done: its stage is free (this step's stay in flight).
        if (k > 0)
        {
            wgmma_wait<1>(d);
            __syncwarp();
            if (lane == 0)
                release_stage(empty + 8 * ((g - 1) % STAGES));
        }
    }
    wgmma_wait<0>(d);
    __syncwarp();
    if (lane == 0)
        release_stage(empty + 8 * ((g - 1) % STAGES));
}

// Block `rank`'s copies of one item's steps (the producer's lane 0): each stage waits for its
// "empty" mbarrier, then its row tile (none on the diagonal, whose rows the column tile
// holds) and its half of the column tile, multicast to both blocks, arrive on its
// "full" one.
__device__ __forceinline__ void stage_item(int it, int rank, const signed char *planar, u32 sbase, u32 full, u32 empty,
                                           int step0, int nsteps, u32 &g, const unsigned *progress)
{
    int cb, ct, pp;
    item_parts(it, cb, ct, pp);
#if RIDE
    wait_turned(progress, cb, nsteps);
#endif
    const signed char *chan = planar + (i64)cb * (i64)(2 * NP) * TPAD;
    const bool diag = pp == ct;
    const int r0 = row_chunk(ct, pp, rank, 0); // used off the diagonal only
    for (int k = 0; k < nsteps; ++k, ++g)
    {
        const u32 s = g % STAGES;
        if (g >= STAGES)
            mbar_wait(empty + 8 * s, ((g / STAGES) & 1) ^ 1);
        const u32 st = sbase + s * STAGE_BYTES;
        const signed char *step = chan + (i64)(step0 + k) * (2 * NP) * KSTEP;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full + 8 * s),
                     "r"(diag ? B_BYTES : STAGE_BYTES)
                     : "memory");
        // On the diagonal the row chunks are the column tile's own rows, staged below (multiply).
        if (!diag)
            bulk_load(st, step + (i64)r0 * CHUNK_BYTES, A_BYTES, full + 8 * s);
        bulk_load_multicast(st + A_BYTES + rank * (B_BYTES / 2), step + (i64)ct * B_BYTES + rank * (B_BYTES / 2),
                            B_BYTES / 2, full + 8 * s, 3);
    }
}


extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(THREADS, 1)
    corr_wgmma(const signed char *src, i64 *__restrict__ acc, int step0, int nsteps, int items,
               unsigned int *__restrict__ next_item, int n
#if FUSED
               ,
               const __grid_constant__ TensorMap chunk
#elif RIDE
               ,
               const uint4 *__restrict__ in, unsigned *__restrict__ progress, int ahead
#endif
    )
{
    // src: the corner turn's tiled planar rows (FUSED: unused; the chunk, of which n batches
    // are read, comes through its tensor map `chunk`; the rest of a group are zeros). RIDE:
    // the launch's turner warps write them from the chunk `in` (n batches) as it runs, counting
    // in `progress` (zeroed before the launch: the next unit, then units done per channel),
    // at most `ahead` items beyond those taken.
    extern __shared__ __align__(1024) unsigned char smem[];
    // Stages' full[s] and empty[s], the item ring's full[q] and taken[q], then (FUSED) the
    // stages' raw[s]: the copier's runs have landed.
    __shared__ __align__(8) u64 bars[(FUSED ? 3 : 2) * STAGES + 2 * RING];
    __shared__ int ring[RING];
    const int warp_all = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rank = cluster_rank();
    // Dynamic shared memory is only 16-byte aligned by contract: round up to 1024 (the same
    // offset in both blocks, which the multicast copies rely on).
    const u32 sbase = ((u32)__cvta_generic_to_shared(smem) + 1023) & ~1023u;
    const u32 staging = sbase + STAGES * STAGE_BYTES;
    const u32 full = (u32)__cvta_generic_to_shared(bars), empty = full + 8 * STAGES;
    const u32 ring_full = empty + 8 * STAGES, ring_taken = ring_full + 8 * RING;
#if FUSED
    const u32 raw = ring_taken + 8 * RING;
#endif
    if (threadIdx.x == 0)
    {
        for (int s = 0; s < STAGES; ++s)
        {
            // FUSED: each splitter warp arrives once its stores are fenced, and only this
            // block's consumers read the stage; otherwise one arrival with the copies' bytes,
            // and both blocks' consumers read it (the multicast half).
#if FUSED
            mbar_init(full + 8 * s, SPLITTERS);
            mbar_init(empty + 8 * s, CONSUMERS / 32);
            mbar_init(raw + 8 * s, 1); // the copier's arrival with the runs' bytes
#else
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 2 * CONSUMERS / 32);
#endif
        }
        for (int q = 0; q < RING; ++q)
        {
            // Taken by every consumer warp of both blocks and by the producers that stage
            // from the ring (FUSED: all producer warps of both; otherwise block 1's).
            mbar_init(ring_full + 8 * q, 1);
            mbar_init(ring_taken + 8 * q, 2 * CONSUMERS / 32 + (FUSED ? 2 * PRODUCERS / 32 : 1));
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // Neither block may multicast into the other's stages, nor write into its item ring, before
    // its mbarriers exist.
    cluster_sync();

    if (threadIdx.x >= CONSUMERS)
    {
#if FUSED
        // The producer warpgroup: block 0's first lane takes the cluster's items from the
        // launch's counter, in order, and publishes each into both blocks' ring (−1 when none
        // are left); every producer warp of both blocks reads them there: warp 0 copies each
        // step's runs into its stage (copy_item), the others de-interleave them (split_item).
        const bool copier = threadIdx.x / 32 == CONSUMERS / 32;
        const bool publisher = rank == 0 && threadIdx.x == CONSUMERS;
        const u32 ring0 = (u32)__cvta_generic_to_shared(ring);
        int next = publisher ? (int)atomicAdd(next_item, 1u) : 0;
        u32 g = 0;
        for (u32 seq = 0;; ++seq)
        {
            if (publisher)
            {
                const int it = next < items ? next : -1;
                publish_item(seq, it, ring0, ring_full, ring_taken);
                if (it >= 0)
                    next = (int)atomicAdd(next_item, 1u);
            }
            const int it = warp_take_item(seq, ring_full, ring_taken, ring);
            if (it < 0)
                break;
            if (copier)
            {
                if (lane == 0)
                    copy_item(it, rank, &chunk, n, sbase, raw, empty, step0, nsteps, g);
                else
                    g += nsteps;
            }
            else
                split_item(it, rank, n, sbase, raw, full, step0, nsteps, g);
        }
        __syncwarp();
        cluster_sync();
        return;
#else
        // The producer warp: lane 0 issues every copy. Block 0's takes the cluster's items from
        // the launch's counter, in order (next_item), and publishes each into both blocks' ring
        // (−1 when none are left) before staging it; block 1's reads them from its ring. RIDE:
        // the producer warpgroup's other warps turn the chunk meanwhile.
#if RIDE
        if (threadIdx.x / 32 != CONSUMERS / 32)
            turn_units(in, reinterpret_cast<uint4 *>(const_cast<signed char *>(src)), n, step0, nsteps,
                       items / PAIRS, progress, next_item, ahead);
        const unsigned *turned = progress;
#else
        const unsigned *turned = nullptr;
#endif
        if (threadIdx.x / 32 == CONSUMERS / 32 && lane == 0)
        {
            u32 g = 0;
            if (rank == 0)
            {
                const u32 ring0 = (u32)__cvta_generic_to_shared(ring);
                int next = (int)atomicAdd(next_item, 1u);
                for (u32 seq = 0;; ++seq)
                {
                    const int it = next < items ? next : -1;
                    publish_item(seq, it, ring0, ring_full, ring_taken);
                    if (it < 0)
                        break;
                    // Taken now, used at the next publication: the atomic's round trip
                    // overlaps this item's copies.
                    next = (int)atomicAdd(next_item, 1u);
                    stage_item(it, rank, src, sbase, full, empty, step0, nsteps, g, turned);
                }
            }
            else
            {
                for (u32 seq = 0;; ++seq)
                {
                    const int it = take_item(seq, ring_full, ring_taken, ring);
                    if (it < 0)
                        break;
                    stage_item(it, rank, src, sbase, full, empty, step0, nsteps, g, turned);
                }
            }
        }
        __syncwarp();
        cluster_sync();
        return;
#endif
    }

    // The consumers.
    const int wg = threadIdx.x / 128, warp = warp_all % 4;
    const int gid = lane >> 2, q = lane & 3;
    const int p1 = gid & 1; // the pol of this thread's row antenna-pol 32·rc + 8·warp + gid
    longlong2 *staged = reinterpret_cast<longlong2 *>(smem + (staging - (u32)__cvta_generic_to_shared(smem)));
    u32 g = 0;
    for (u32 seq = 0;; ++seq)
    {
        const int it = warp_take_item(seq, ring_full, ring_taken, ring);
        if (it < 0)
            break;
        int cb, ct, pp;
        item_parts(it, cb, ct, pp);
        const int rc = row_chunk(ct, pp, rank, wg);
        const int j0 = pp == ct ? rc - 4 * ct : 0;
        int d[128];
#pragma unroll
        for (int i = 0; i < 128; ++i)
            d[i] = 0;
        // j0 is uniform over the warpgroup, as wgmma requires.
        if (j0 == 0)
            multiply<0>(d, sbase, wg, pp == ct, full, empty, nsteps, g);
        else if (j0 == 1)
            multiply<1>(d, sbase, wg, pp == ct, full, empty, nsteps, g);
        else if (j0 == 2)
            multiply<2>(d, sbase, wg, pp == ct, full, empty, nsteps, g);
        else
            multiply<3>(d, sbase, wg, pp == ct, full, empty, nsteps, g);

        // Epilogue, by warpgroup. Warp `warp` of warpgroup `wg` holds planar rows gid (Re) and
        // gid + 8 (Im) of antenna-pol group `warp` of the warpgroup's row chunk rc, i.e. row
        // antennas 16·rc + 4·warp + 0 .. 3 (both pols); n8 chunk j covers column rows 8j .. 8j + 7
        // (Re of group j/2 for even j, Im for odd), columns 2q, 2q + 1. A round takes 8 column
        // antennas: the warpgroup's sums go to its staging buffer in the accumulators' own
        // order, (column antenna, row antenna, product, re/im), contiguous over its 16 row
        // antennas (1 KB) for each column antenna; then lane a (< 8) of its first warp adds column
        // antenna a's run into the int64 accumulators with one bulk asynchronous reduce-add
        // (two's-complement addition is the same for signed values; added one baseline at a
        // time, each thread's read-modify-writes waited a DRAM round trip each,
        // bench/correlator-notes.md). Runs of a warp's 4 row antennas (v7) took four times as
        // many reduce-adds, 512 per block and item. The two buffers alternate: before a round's
        // barrier the adding lanes wait for the previous round's adds to have read their
        // buffer, which the next round writes.
        const u32 wbase = staging + wg * 16384;
        const int a1g = rc * 16; // the warpgroup's first row antenna
        const bool adder = warp == 0 && lane < 8;
#pragma unroll
        for (int round = 0; round < STAGE_A2 / 8; ++round)
        {
            // A trimmed MMA summed column planar rows 64·j0 on into accumulators 0 on, so
            // this round's accumulators hold column round `cr`; the 2·j0 rounds it did not sum
            // are the last ones, and skipping an even number keeps the buffers' alternation.
            const int cr = round + 2 * j0;
            if (cr >= STAGE_A2 / 8)
                continue;
            const u32 buf = wbase + (round & 1) * 8192;
            longlong2 *out = staged + (buf - staging) / 16;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                {
                    const int h = round * 2 + hh;
                    const int a2r = 4 * hh + q, p2 = e; // column antenna-pol h·8 + 2q + e
                    const i64 rr = d[8 * h + e], ir = d[8 * h + 2 + e], ri = d[8 * h + 4 + e], ii = d[8 * h + 6 + e];
                    out[(a2r * 16 + warp * 4 + (gid >> 1)) * 4 + p1 + 2 * p2] = make_longlong2(rr + ii, ir - ri);
                }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            if (adder)
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
            if (adder)
            {
                const int a2 = ct * STAGE_A2 + cr * 8 + lane;
                const int a1hi = min(a1g + 15, a2);
                if (a2 < N_ANTS && a1hi >= a1g)
                {
                    i64 *dst = acc + ((i64)cb * N_BASELINES + a2 * (a2 + 1) / 2 + a1g) * 8;
                    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(dst),
                                 "r"(buf + lane * 1024), "r"((a1hi - a1g + 1) * 64)
                                 : "memory");
                }
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            }
        }
    }
    // The staging buffers must outlive their last reads.
    if (warp == 0 && lane < 8)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    cluster_sync();
}
