// The beamformer's input staging (`kernels/beamform.cu`, whose header describes the kernel and
// its -D constants): the constants derived from them, the input words, where a lane's slots
// lie, and the `cp.async` ring or register groups that bring the words to the MMAs.
// `gpu::compile` puts this file (after `dither.cuh`) before `beamform.cu`.
#define WARPS (THREADS / 32)
#define SLOTS (BATCHES * SPECTRA)
// Beam tiles and k-steps of the whole table.
#define NT ((N_BEAMS + 3) / 4)
#define NKS ((N_ANTS + 7) / 8)
// u32 pairs per (channel, tile, k-step): 3 digits × 32 lanes.
#define PAIRS (3 * 32)
// A lane's four slots are one batch's consecutive spectra, loaded and stored as one vector.
#define VEC (SPECTRA % 4 == 0)
// Every lane of a warp in the same batch (clip counts summed across the warp).
#define WARP_BATCH (SPECTRA % 32 == 0)
// Where a lane's four slots are consecutive (VEC), its words are staged in shared memory by
// `cp.async`, DEPTH k-steps in flight per warp (a ring of DEPTH × 1 KiB per warp at 8 bits):
// with the words held in registers instead, two k-steps in flight per warp left the kernel
// waiting on loads (long-scoreboard stalls 7.6 of 12.5 cycles per instruction, DRAM 38 % busy).
// DEPTH comes from the host, which sizes the ring.
// Otherwise the words are loaded into registers, UNROLL k-steps (a group) at a time, registers
// holding two groups. Before sm_90 ptxas spilled two groups of two 8-bit k-steps beside two
// tiles' accumulators at some shapes, and one group of 4-bit ones at another.
#if BT == 1
#define UNROLL 4
#elif __CUDA_ARCH__ >= 900 || IN_BITS == 4
#define UNROLL 2
#else
#define UNROLL 1
#endif
// KS ≤ 32: the staged path keeps a presence bit per (k-step, half) in a u64.
#if BT * KS > 40 || BT < 1 || KS < 1 || KS > 32
#error "BT tiles × KS k-steps of digits must fit 30 KiB, and KS ≤ 32"
#endif

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

#if IN_BITS == 8
#define WORD_BYTES 4
// One (antenna, spectrum)'s word: (re0, im0, re1, im1) int8.
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return __ldg(reinterpret_cast<const u32 *>(p));
}
#elif IN_BITS == 4
// One byte per complex value, re in the high nibble: widened to the 8-bit word.
__device__ __forceinline__ u32 widen(u32 v)
{
    const int p0 = (signed char)(v & 0xff), p1 = (signed char)(v >> 8);
    const u32 re0 = (p0 >> 4) & 0xff, im0 = ((signed char)(p0 << 4) >> 4) & 0xff;
    const u32 re1 = (p1 >> 4) & 0xff, im1 = ((signed char)(p1 << 4) >> 4) & 0xff;
    return re0 | im0 << 8 | re1 << 16 | im1 << 24;
}
#define WORD_BYTES 2
// Four consecutive spectra's bytes as words.
__device__ __forceinline__ uint4 as_words(uint2 v)
{
    return make_uint4(widen(v.x & 0xffff), widen(v.x >> 16), widen(v.y & 0xffff), widen(v.y >> 16));
}
__device__ __forceinline__ u32 word_at(const unsigned char *p)
{
    return widen(__ldg(reinterpret_cast<const unsigned short *>(p)));
}
#else
#error "IN_BITS must be 8 or 4"
#endif
// Bytes from one antenna's samples to the next's.
#define ANT_STRIDE ((i64)CHANNELS * SPECTRA * WORD_BYTES)

// Where a lane's four slots of one 32-slot slab lie. Slab k holds slots 32k … 32k + 31 of the
// (batch, spectrum) slots laid end to end; lane g's are 32k + 4g … 32k + 4g + 3.
struct Slab
{
    const unsigned char *in;      // antenna 0's word at the first slot
    const unsigned char *base;    // the input's start (a slab past the end has no word of its own)
    const unsigned char *present; // the first slot's batch's presence flags
#if VEC
    // The four slots are spectra spec … spec + 3 of one batch, all valid or none.
    int batch, spec;
    bool valid;
    __device__ int batch_of(int) const { return batch; }
    __device__ int spec_of(int i) const { return spec + i; }
    __device__ bool valid_at(int) const { return valid; }
#else
    int batch[4], spec[4];
    bool valid[4];
    i64 offset[4]; // each slot's word from `in`
    const unsigned char *present_at[4];
    __device__ int batch_of(int i) const { return batch[i]; }
    __device__ int spec_of(int i) const { return spec[i]; }
    __device__ bool valid_at(int i) const { return valid[i]; }
#endif
};

__device__ __forceinline__ Slab slab_at(const unsigned char *in, const unsigned char *present, int c, int slab, int g)
{
    Slab s;
    s.base = in;
    const int f0 = slab * 32 + 4 * g;
#if VEC
    s.valid = f0 < SLOTS;
    s.batch = s.valid ? f0 / SPECTRA : 0;
    s.spec = f0 - s.batch * SPECTRA;
    s.in = in + (((i64)s.batch * N_ANTS * CHANNELS + c) * SPECTRA + s.spec) * WORD_BYTES;
    s.present = present + (i64)s.batch * N_ANTS;
#else
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        const int f = f0 + i;
        s.valid[i] = f < SLOTS;
        s.batch[i] = s.valid[i] ? f / SPECTRA : 0;
        s.spec[i] = f - s.batch[i] * SPECTRA;
    }
    s.in = in + (((i64)s.batch[0] * N_ANTS * CHANNELS + c) * SPECTRA + s.spec[0]) * WORD_BYTES;
    s.present = present + (i64)s.batch[0] * N_ANTS;
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
        s.offset[i] = (((i64)(s.batch[i] - s.batch[0]) * N_ANTS * CHANNELS) * SPECTRA + s.spec[i] - s.spec[0]) * WORD_BYTES;
        s.present_at[i] = present + (i64)s.batch[i] * N_ANTS;
    }
#endif
    return s;
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// 16 bytes from global to shared memory (`cp.async`, L1 bypassed: the table is read once per
// block).
__device__ __forceinline__ void copy16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

#if VEC
#if IN_BITS == 8
// An antenna's four slots (16 bytes) from global to shared memory (address `dst`), or zeros
// where !keep (`src_bytes` 0: cp.async fills the rest), with a hint that L2 fetch the 256 bytes
// around them: a block's warps read an antenna's consecutive 128-byte runs. On the lent H200
// (bench/xbengine-notes.md, 2026-11-28), at 4 k-steps in flight, this form beat two 8-byte
// copies without the hint by 0–6 % at 8 beams and 8–12 % at 64–256 beams; with the depth it
// took 3–14 % off the kernel as it was (6 k-steps, 8-byte copies). `.ca`: the same copy
// through `.cg` (L1 bypassed) took the loads alone from 57 µs to 88 µs at MeerKAT's shape.
__device__ __forceinline__ void copy_or_zero(u32 dst, const unsigned char *src, bool keep)
{
    asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(keep ? 16 : 0)
                 : "memory");
}
#else
// The same for 4-bit input: 8 bytes, no hint (not timed with one).
__device__ __forceinline__ void copy_or_zero(u32 dst, const unsigned char *src, bool keep)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(keep ? 8 : 0) : "memory");
}
#endif

// A lane's presence bits of one antenna batch (2·KS of them).
#if KS <= 16
typedef u32 Bits;
#else
typedef u64 Bits;
#endif

// Bit 2·ks + h: antenna a0 + 8·ks + 4·h + q exists, is present in the lane's batch, and its
// slots are valid. Once per antenna batch.
__device__ __forceinline__ Bits presence_bits(const Slab &s, int a0, int nks, int q, int lane)
{
    Bits bits = 0;
#if WARP_BATCH
    // The warp's slots are one batch, and bit k of lane q is antenna a0 + 4k + q: lane l loads
    // the flags of antennas a0 + 4l … a0 + 4l + 3, and ballot r gathers, in bit l, the flag of
    // antenna a0 + 4l + r, which is bit l of every lane with q = r. (Gathering lane q's bits
    // one by one from a mask of 32 consecutive antennas took 80 instructions per warp.)
#pragma unroll
    for (int m = 0; m < (2 * KS + 31) / 32; ++m)
    {
        const int k = 32 * m + lane;
        u32 mine = 0;
#pragma unroll
        for (int r = 0; r < 4; ++r)
        {
            const int a = a0 + 4 * k + r;
            const u32 b = __ballot_sync(~0u, k < 2 * nks && a < N_ANTS && s.valid && __ldg(s.present + a));
            mine = r == q ? b : mine;
        }
        bits |= (Bits)mine << (32 * m);
    }
#else
#pragma unroll
    for (int k = 0; k < 2 * KS; ++k)
    {
        const int a = a0 + 8 * (k >> 1) + 4 * (k & 1) + q;
        if ((k >> 1) < nks && a < N_ANTS && s.valid && __ldg(s.present + a))
            bits |= (Bits)1 << k;
    }
#endif
    return bits;
}

// A ring slot: a lane's words of one k-step, each antenna's four slots as they lie (h = 0 for
// antenna q, 1 for q + 4): one 16-byte copy each at 8 bits (8 bytes at 4 bits, widened after
// the read), and the A fragments taken from the two halves (`fragments`: register naming
// only). (Copied as the fragments themselves, in 8-byte pieces, the kernel measured up to
// 12 % slower on the H200: `copy_or_zero`.)
#if IN_BITS == 8
typedef uint4 Slot[2][32];
#else
typedef uint2 Slot[2][32];
#endif

#define LANE_BYTES (sizeof(Slot) / 64)

// A lane's copies still to issue in one antenna batch: the source of the next k-step's antenna
// q (antenna q + 4 lies 4·ANT_STRIDE on), the ring slot it goes to (a shared address, wrapping
// after DEPTH slots), and the presence bits from that k-step on (`presence_bits`, shifted down
// as k-steps are issued). Moving on is pointer and address arithmetic only: the index form (a
// 64-bit product per copy, a modulo by DEPTH per slot) took 61 instructions per k-step
// (ncu source counters, bench/xbengine-notes.md v11).
struct Issuer
{
    const unsigned char *src;
    const unsigned char *readable; // where a zero-filling copy points: it reads nothing
    u32 dst, ring_begin, ring_end;
    Bits bits;
};

__device__ __forceinline__ Issuer issuer_at(Slot *ring, const Slab &s, int a0, Bits bits, int q, int lane)
{
    Issuer is;
    is.src = s.in + (i64)(a0 + q) * ANT_STRIDE;
    is.readable = s.base;
    is.ring_begin = (u32)__cvta_generic_to_shared(ring) + LANE_BYTES * lane;
    is.ring_end = is.ring_begin + DEPTH * sizeof(Slot);
    is.dst = is.ring_begin;
    is.bits = bits;
    return is;
}

// Issue the next k-step's words (antennas q and q + 4 of its eight) into the next ring slot,
// antenna q + 4h's to ring[slot][h][lane].
__device__ __forceinline__ void issue(Issuer &is)
{
#pragma unroll
    for (int h = 0; h < 2; ++h)
    {
        const bool keep = (is.bits >> h) & 1;
        const unsigned char *src = keep ? is.src + 4 * ANT_STRIDE * h : is.readable;
        copy_or_zero(is.dst + 32 * LANE_BYTES * h, src, keep);
    }
    is.src += 8 * ANT_STRIDE;
    is.bits >>= 2;
    is.dst += sizeof(Slot);
    if (is.dst == is.ring_end)
        is.dst = is.ring_begin;
}

// The two A fragments of ring slot `slot`.
__device__ __forceinline__ void fragments(uint4 (&frag)[2], const Slot *ring, int slot, int lane)
{
#if IN_BITS == 8
    const uint4 lo = ring[slot][0][lane], hi = ring[slot][1][lane];
    frag[0] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    frag[1] = make_uint4(lo.z, lo.w, hi.z, hi.w);
#else
    const uint4 lo = as_words(ring[slot][0][lane]), hi = as_words(ring[slot][1][lane]);
    frag[0] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    frag[1] = make_uint4(lo.z, lo.w, hi.z, hi.w);
#endif
}
#else
// Antenna a's words at the lane's four slots (each its own batch and spectrum), zero past the
// last antenna, for an absent antenna and for slots past the end. The presence flags are
// applied after the loads, so that no load waits for another.
__device__ __forceinline__ uint4 load_antenna(const Slab &s, int a)
{
    uint4 r = make_uint4(0, 0, 0, 0);
    if (a < N_ANTS)
    {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = s.valid[i] ? word_at(s.in + (i64)a * ANT_STRIDE + s.offset[i]) : 0u;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] &= s.valid[i] && __ldg(s.present_at[i] + a) ? ~0u : 0u;
        r = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return r;
}

// The lane's words of k-steps ks0 … ks0 + UNROLL − 1 of the antenna batch from a0: antennas
// a0 + 8·ks + q (raw[u][0]) and a0 + 8·ks + 4 + q (raw[u][1]), zero past nks.
__device__ __forceinline__ void load_group(uint4 (&raw)[UNROLL][2], const Slab &s, int a0, int ks0, int nks, int q)
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
    {
        const bool in = ks0 + u < nks;
        const int a = a0 + 8 * (ks0 + u) + q;
        raw[u][0] = in ? load_antenna(s, a) : make_uint4(0, 0, 0, 0);
        raw[u][1] = in ? load_antenna(s, a + 4) : make_uint4(0, 0, 0, 0);
    }
}
#endif
