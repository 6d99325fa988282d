// The coherent beamformer (seed 003; `dsp::beamform` is its oracle): for every batch, channel c,
// spectrum t and single-polarisation beam b,
//
//   y = Σ_{a present} W_abc · x[a][c][t][pol_b],   W_abc = w_ab · e^{jπ·c·d_ab}
//
// then dithered (`dsp::beamform::beam_dither`, the project's counter-based generator, bit for
// bit: a 32-bit key per (beam, channel), then one 32-bit hash per complex value) and quantised to int8 with ±127 saturation, counting per (batch, beam) the complex values
// with a saturated part.
//
// Layouts: input (batch, antenna, channel, spectrum, pol, re/im), int8 pairs (IN_BITS 8) or one
// byte per complex value with the real part in the high nibble (IN_BITS 4); output (batch, beam,
// channel, spectrum, re/im) int8; clips (batch, beam) u64, added to (the op zeroes them first).
//
// **Why int8 tensor cores.** Seed 003's kernel multiplies on the CUDA cores (four FMAs per
// antenna, beam and sample); on the H100 it reached 22 % of the copy bandwidth at MeerKAT's 8
// beams, issue-bound. An fp16 `mma.sync` version reached 46–49 %, still issue-bound: each input
// word cost byte permutes and subtractions to become fp16, and each block generated its own
// coefficients (bench/xbengine-notes.md). Here a channel's beamforming is an exact integer GEMM
// on int8 `mma.sync` m16n8k32, which takes the input words as they lie in memory, with the input
// staged DEPTH k-steps ahead by `cp.async` (v14 in blocks of 4 warps, then with 6 k-steps in
// flight and 8-byte copies: 72 % of copy
// at MeerKAT's 8 beams and 80 antennas on the lent H100, timed behind other work as the engine
// runs it; the same kernel without its dither-quantise-store epilogue reaches 91 %, with the
// loads alone 94 %, so the epilogue is what is left: bench/xbengine-notes.md, v9–v14. On the
// lent H200, whose copy is 1.4× the H100's, the kernel takes about the same time: 60 % of
// its copy with the 16-byte copies of 2026-11-28, its loads alone 69–76 %):
//
//   D (16 times × 8 columns, s32) += A (16 times × 32 k, s8) · B (32 k × 8 columns, s8)
//
// - k (one "k-step"): 8 antennas × 2 pols × (re, im). Lane (g, q) = (lane / 4, lane % 4) holds,
//   in A, k = 4q … 4q+3 (antenna q's word: re0, im0, re1, im1) and k = 16+4q … 16+4q+3 (antenna
//   q+4's word): input words with no conversion at all, −128 included (exact).
// - Rows: a warp takes 32 consecutive (batch, spectrum) slots as two m16 tiles; lane g's rows
//   g and g+8 of tile j are slots 4g+2j and 4g+2j+1, so a lane's four slots are consecutive and
//   its k-step is two 16-byte loads (4-bit input: 8 bytes each).
// - Columns: 4 beams × (re, im). B holds (Wr, −Wi) in a beam's re column and (Wi, Wr) in its im
//   column, in the rows of the beam's polarisation, zeros in the other's. Lane (g, q)'s D values
//   are beam q's re and im at its four slots: one 8-byte store.
// - **Weights as three int8 digits.** Each beam's weights are scaled by a power of two
//   (`scales`: max |w|·2^s ≤ 126·2¹⁶), rounded to integers v (|v| < 2²³: 22 bits or more at the
//   beam's largest weight) and written in balanced base 256, v = d₀·2¹⁶ + d₁·2⁸ + d₂, every
//   digit an int8. One MMA per digit gives S_d = Σ x·d exactly in int32 (|S_d| ≤ 2·N_ANTS·128²
//   < 2³¹ up to 4096 antennas), so y = (S₀·2¹⁶ + S₁·2⁸ + S₂)·2^−s is the exact sum over the
//   rounded weights, taken to float with about one rounding (`combine`). Against the oracle's
//   double sums the weights' rounding (≤ 2^−s/2 each, ≤ 2⁻²³ of the largest) and the float
//   sine and cosine of the phase remain: a value whose sum lies that close to a quantisation
//   boundary may round the other way, ±1 LSB, rarely and unbiased (the self-test bounds count
//   and bias).
//
// The digits depend only on (channel, antenna, beam) and the steering version, so they are made
// once per version by `beam_coeffs` into a table already in the B-fragment order (a u32 pair per
// lane, channel, beam tile, k-step and digit), not per block: generating W per block took a
// fifth of the fp16 kernel's instructions. A block copies its channel's part of the table into
// shared memory per antenna batch (KS k-steps) and beam batch (BT tiles of 4 beams), and reads
// it conflict-free. Beams beyond a batch are taken in an outer loop (seed 003 §Higher beam
// counts); the input is then read again.
//
// Missing antennas: the presence flag (batch, antenna) zeroes the lane's input words, so absent
// antennas add exact zeros.
//
// Compile-time constants (-D): N_ANTS, CHANNELS, SPECTRA, BATCHES, N_BEAMS, IN_BITS (8 or 4),
// THREADS (a multiple of 32: one warp per 32-slot slab), BT, KS, DEPTH, MIN_BLOCKS (blocks per
// SM, the register budget) (the host picks them, `BeamformConfig::defines`: BT·KS ≤ 40, at most
// 30 KiB of digits per block). `gpu::compile` puts `dither.cuh` and `beamform_input.cuh` (the
// constants derived from these and the input staging) before this file.

// `dsp::postproc::quantise` with qmax 127: round half to even after clamping.
__device__ __forceinline__ int quantise(float v, float u, bool *clipped)
{
    const float x = __fadd_rn(v, u);
    *clipped = !(fabsf(x) <= 127.0f);
    return (int)rintf(fminf(fmaxf(x, -127.0f), 127.0f));
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint4 &a, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// v (|v| ≤ 127·2¹⁶ − 128·2⁸ − 128 after the clamp) in balanced base 256: v = d₀·2¹⁶ + d₁·2⁸ + d₂,
// each an int8 (|d₀| ≤ 127), returned as three ints.
__device__ __forceinline__ void digits(float x, int (&d)[3])
{
    const int v = (int)rintf(fminf(fmaxf(x, -8290176.0f), 8290176.0f));
    d[2] = (signed char)(v & 0xff);
    const int v1 = (v - d[2]) >> 8;
    d[1] = (signed char)(v1 & 0xff);
    d[0] = (v1 - d[1]) >> 8;
}

// The digit table of one steering version: thread (c, t, ks, lane) writes lane (g, q)'s B
// fragments of beam tile t (beams 4t … 4t+3), k-step ks (antennas 8ks … 8ks+7) and channel c,
// for the three digits: table[(((c·NT + t)·NKS + ks)·3 + digit)·32 + lane] = (b0, b1), where b0
// covers antenna 8ks + q and b1 antenna 8ks + 4 + q, column g (beam 4t + g/2, re or im).
// weights: (beam, antenna) complex double; delays: (beam, antenna) double; pols and scales
// (2^s, see the header): per beam. The phase π·c·d is reduced modulo 2π in double (c·d may be
// hundreds of turns), the sine and cosine taken in float.
extern "C" __global__ void __launch_bounds__(256) beam_coeffs(
    const double2 *__restrict__ weights, const double *__restrict__ delays, const int *__restrict__ pols,
    const float *__restrict__ scales, uint2 *__restrict__ table)
{
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)CHANNELS * NT * NKS * 32)
        return;
    const int lane = (int)(i % 32), ks = (int)(i / 32 % NKS), t = (int)(i / (32 * NKS) % NT);
    const int c = (int)(i / (32 * NKS * NT));
    const int g = lane >> 2, q = lane & 3;
    const int b = 4 * t + (g >> 1);
    u32 frag[3][2] = {{0, 0}, {0, 0}, {0, 0}};
#pragma unroll
    for (int h = 0; h < 2; ++h)
    {
        const int a = 8 * ks + 4 * h + q;
        if (a >= N_ANTS || b >= N_BEAMS)
            continue;
        const double2 wab = weights[(i64)b * N_ANTS + a];
        double x = (double)c * delays[(i64)b * N_ANTS + a];
        x -= 2.0 * rint(0.5 * x); // e^{jπx} has period 2 in x
        float s, co;
        sincospif((float)x, &s, &co);
        const float sc = scales[b];
        const float vr = (float)wab.x * sc, vi = (float)wab.y * sc;
        const float wr = vr * co - vi * s, wi = vr * s + vi * co;
        // Column re takes (Wr, −Wi) of (xr, xi), column im (Wi, Wr).
        int dr[3], di[3];
        digits((g & 1) ? wi : wr, dr);
        digits((g & 1) ? wr : -wi, di);
        const int shift = pols[b] ? 16 : 0;
#pragma unroll
        for (int k = 0; k < 3; ++k)
            frag[k][h] = ((u32)(dr[k] & 0xff) | (u32)(di[k] & 0xff) << 8) << shift;
    }
#pragma unroll
    for (int k = 0; k < 3; ++k)
        table[((((i64)c * NT + t) * NKS + ks) * 3 + k) * 32 + lane] = make_uint2(frag[k][0], frag[k][1]);
}

// The digits of k-steps ks0 … ks0 + nks − 1 and beam tiles t0 … t0 + BT − 1 of channel c into
// shared memory, as coeff[t][ks][digit·32 + lane] (tiles past the last beam are left alone:
// `multiply` stops before them): one `cp.async` group, waited for by the caller. A tile's
// k-steps lie together in both the table and coeff, so each tile is one linear copy.
__device__ __forceinline__ void stage(uint2 (&coeff)[BT][KS][PAIRS], const uint2 *__restrict__ table, int c, int t0,
                                      int ks0, int nks)
{
    // 16-byte pieces: PAIRS / 2 per (tile, k-step).
    const int nt = min(BT, NT - t0), pieces = nks * (PAIRS / 2);
    for (int t = 0; t < nt; ++t)
    {
        const uint4 *src = reinterpret_cast<const uint4 *>(table + (((i64)c * NT + t0 + t) * NKS + ks0) * PAIRS);
        uint4 *dst = reinterpret_cast<uint4 *>(coeff[t][0]);
        for (int i = threadIdx.x; i < pieces; i += THREADS)
            copy16(dst + i, src + i);
    }
    commit();
}

// One k-step: the lane's words are its A fragments (`fragments`; frag[j] for m16 tile j: antenna
// q at slots 4g+2j and 4g+2j+1, antenna q+4 at the same); three MMAs (one per digit) per beam
// tile and m16 tile.
__device__ __forceinline__ void multiply(int (&acc)[BT][3][2][4], const uint4 (&frag)[2],
                                        const uint2 (&coeff)[BT][KS][PAIRS], int ks, int t0, int lane)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        if (t0 + t >= NT)
            break;
#pragma unroll
        for (int k = 0; k < 3; ++k)
        {
            const uint2 bq = coeff[t][ks][k * 32 + lane];
#pragma unroll
            for (int j = 0; j < 2; ++j)
                mma_s8(acc[t][k][j], frag[j], bq.x, bq.y);
        }
    }
}

// Undo the digits and the scale: y = (S₀·2¹⁶ + S₁·2⁸ + S₂)·2^−s, the low part rounded once in
// float (about 2⁻⁸ of y where the larger weights dominate; all of it where only small weights,
// d₀ = 0, contribute) and S₀ exact below 512 antennas, so y carries one or two float roundings,
// about 2⁻²³ of it, as the oracle's own conversion of its double sum does. All tiles first, so
// that the int32 accumulators are dead before the dither needs registers.
__device__ __forceinline__ void combine(float (&v)[BT][2][4], const int (&acc)[BT][3][2][4], int t0, int q,
                                        const float *__restrict__ scales)
{
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        const int b = 4 * (t0 + t) + q;
        // 2^−s, and the digits' weights 2¹⁶ and 2⁸ folded in: powers of two, so exact. The
        // scale is 2^s with |s| ≤ 100 (`gpu::beamform::beam_scale`), so its inverse is its
        // exponent negated: 254 − (s + 127) = 127 − s, one integer subtraction on the bits (a
        // division took a reciprocal, its refinement and a branch to a slow path).
        const float inv = b < N_BEAMS ? __int_as_float(0x7f000000 - __float_as_int(scales[b])) : 0.0f;
        const float w0 = inv * 65536.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int p = 0; p < 4; ++p)
            {
#if N_ANTS < 256
                // |S₁| ≤ 2¹⁵·N_ANTS, so S₁·2⁸ + S₂ is exact in int32: one conversion fewer.
                const float low = (float)(acc[t][1][j][p] * 256 + acc[t][2][j][p]) * inv;
#else
                const float low = fmaf((float)acc[t][1][j][p], inv * 256.0f, (float)acc[t][2][j][p] * inv);
#endif
                v[t][j][p] = fmaf((float)acc[t][0][j][p], w0, low);
            }
    }
}

// Lane (g, q) holds beam 4(t0 + t) + q at its four slots: slot 4g + 2j + r is (v[t][j][2r],
// v[t][j][2r + 1]). Dither, quantise, store, count clips. The dither (`dsp::beamform::
// beam_dither`) is one hash per value of the (beam, channel) key plus the slot's spectrum word,
// the words made once here for every tile.
__device__ __forceinline__ void finish(const float (&v)[BT][2][4], const Slab &sl, int t0, int c, int g, int q,
                                       const u64 *__restrict__ seeds, const int *__restrict__ dithered,
                                       signed char *__restrict__ out, u64 *__restrict__ clips, i64 first,
                                       i64 batch_step, i64 spectrum_step)
{
    // `dsp::beamform::spectrum_word`: low 32 bits of the timestamp + high 32 bits·0x9e3779b9.
    // Where the four slots are consecutive spectra of one batch (VEC), each timestamp is the
    // last one plus spectrum_step.
    u32 word[4];
    u64 ts = (u64)(first + sl.batch_of(0) * batch_step + (i64)sl.spec_of(0) * spectrum_step);
#pragma unroll
    for (int i = 0; i < 4; ++i)
    {
#if VEC
        if (i > 0)
            ts += (u64)spectrum_step;
#else
        ts = (u64)(first + sl.batch_of(i) * batch_step + (i64)sl.spec_of(i) * spectrum_step);
#endif
        word[i] = (u32)ts + (u32)(ts >> 32) * 0x9e3779b9u;
    }
#pragma unroll
    for (int t = 0; t < BT; ++t)
    {
        if (t0 + t >= NT)
            break;
        const int b = 4 * (t0 + t) + q;
        const bool beam = b < N_BEAMS;
        const bool dither = beam && dithered[b];
        // `dsp::beamform::beam_dither_key`: the seed already carries + b.
        const u32 key = dither ? mix_key(seeds[b], (u64)c, 0) : 0u;
        u32 packed[2] = {0, 0};
        int clipped[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
        {
            const int j = i >> 1, r = i & 1;
            // The hash whether or not the value is dithered, then a select: a branch here
            // diverged between a warp's beams (lanes of different q) and cost its
            // reconvergence per value.
            const float2 h = dither_pair(key + word[i]);
            const bool on = dither && sl.valid_at(i);
            const float2 u = make_float2(on ? h.x : 0.0f, on ? h.y : 0.0f);
            bool c0, c1;
            const int re = quantise(v[t][j][2 * r], u.x, &c0);
            const int im = quantise(v[t][j][2 * r + 1], u.y, &c1);
            clipped[i] = beam && sl.valid_at(i) && (c0 || c1);
            packed[i >> 1] |= ((u32)(re & 0xff) | (u32)(im & 0xff) << 8) << (16 * (i & 1));
        }
        if (beam)
        {
#if VEC
            if (sl.valid)
                *reinterpret_cast<uint2 *>(out + 2 * ((((i64)sl.batch * N_BEAMS + b) * CHANNELS + c) * SPECTRA + sl.spec)) =
                    make_uint2(packed[0], packed[1]);
#else
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (sl.valid[i])
                    *reinterpret_cast<unsigned short *>(out + 2 * ((((i64)sl.batch[i] * N_BEAMS + b) * CHANNELS + c) * SPECTRA + sl.spec[i])) =
                        (unsigned short)(packed[i >> 1] >> (16 * (i & 1)));
#endif
        }
#if WARP_BATCH
        // The warp's 32 slots are one batch: the 8 lanes of beam q sum their counts.
        int n = clipped[0] + clipped[1] + clipped[2] + clipped[3];
        n += __shfl_xor_sync(0xffffffffu, n, 4);
        n += __shfl_xor_sync(0xffffffffu, n, 8);
        n += __shfl_xor_sync(0xffffffffu, n, 16);
        if (g == 0 && n)
            atomicAdd(&clips[(i64)sl.batch_of(0) * N_BEAMS + b], (u64)n);
#else
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (clipped[i])
                atomicAdd(&clips[(i64)sl.batch_of(i) * N_BEAMS + b], 1ull);
#endif
    }
}

// Accumulate the antenna batch from k-step ks0 (nks k-steps) into acc, with the digits staged
// first (the previous batch's are no longer read once every warp has passed the first barrier).
__device__ __forceinline__ void accumulate(int (&acc)[BT][3][2][4], uint2 (&coeff)[BT][KS][PAIRS],
                                           const uint2 *__restrict__ table, const Slab &slab, int c, int t0,
                                           int ks0, int nks, int q, int lane, void *ring_mem)
{
    const int a0 = 8 * ks0;
#if VEC
    Slot *ring = reinterpret_cast<Slot *>(ring_mem) + (threadIdx.x >> 5) * DEPTH;
    const Bits bits = presence_bits(slab, a0, nks, q, lane);
    __syncthreads();
    stage(coeff, table, c, t0, ks0, nks);
    // DEPTH − 1 k-steps in flight before the first is used; one group committed per k-step
    // (empty past nks), so that `wait_group DEPTH − 1` always means "k-step k has landed" and,
    // before the loop, "the digits have landed".
    Issuer is = issuer_at(ring, slab, a0, bits, q, lane);
#pragma unroll
    for (int k = 0; k < DEPTH - 1; ++k)
    {
        if (k < nks)
            issue(is);
        commit();
    }
    int slot = 0;
    for (int k = 0; k < nks; ++k)
    {
        if (k + DEPTH - 1 < nks)
            issue(is);
        commit();
        asm volatile("cp.async.wait_group %0;\n" ::"n"(DEPTH - 1) : "memory");
        if (k == 0)
            __syncthreads(); // every thread's part of the digits has landed
        uint4 frag[2];
        fragments(frag, ring, slot, lane);
        multiply(acc, frag, coeff, k, t0, lane);
        if (++slot == DEPTH)
            slot = 0;
    }
#else
    uint4 raw[UNROLL][2];
    load_group(raw, slab, a0, 0, nks, q);
    __syncthreads();
    stage(coeff, table, c, t0, ks0, nks);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    for (int k0 = 0; k0 < nks; k0 += UNROLL)
    {
        uint4 now[UNROLL][2];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
        {
            now[u][0] = raw[u][0];
            now[u][1] = raw[u][1];
        }
        if (k0 + UNROLL < nks)
            load_group(raw, slab, a0, k0 + UNROLL, nks, q);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (k0 + u < nks)
            {
                const uint4 frag[2] = {make_uint4(now[u][0].x, now[u][0].y, now[u][1].x, now[u][1].y),
                                       make_uint4(now[u][0].z, now[u][0].w, now[u][1].z, now[u][1].w)};
                multiply(acc, frag, coeff, k0 + u, t0, lane);
            }
    }
#endif
}

// table: `beam_coeffs`'s digits; scales (2^s): per beam. present: (batch, antenna) u8. seeds:
// per beam, the dither seed + beam index; dithered: per beam, 1 to dither. Spectrum t of batch
// i has timestamp first + i·batch_step + t·spectrum_step. Dynamic shared memory: the ring,
// WARPS × DEPTH Slots where VEC, none otherwise.
//
// A block takes channel blockIdx.y and WARPS slabs, a warp one.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) beamform(
    const unsigned char *__restrict__ in, const uint2 *__restrict__ table, const float *__restrict__ scales,
    const unsigned char *__restrict__ present, const u64 *__restrict__ seeds, const int *__restrict__ dithered,
    signed char *__restrict__ out, u64 *__restrict__ clips, i64 first, i64 batch_step, i64 spectrum_step)
{
    __shared__ __align__(16) uint2 coeff[BT][KS][PAIRS];
    extern __shared__ __align__(16) unsigned char ring_mem[];
    const int c = blockIdx.y;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const Slab slab = slab_at(in, present, c, blockIdx.x * WARPS + (threadIdx.x >> 5), g);

    for (int t0 = 0; t0 < NT; t0 += BT)
    {
        int acc[BT][3][2][4];
#pragma unroll
        for (int t = 0; t < BT; ++t)
#pragma unroll
            for (int k = 0; k < 3; ++k)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int p = 0; p < 4; ++p)
                        acc[t][k][j][p] = 0;
        for (int ks0 = 0; ks0 < NKS; ks0 += KS)
            accumulate(acc, coeff, table, slab, c, t0, ks0, min(KS, NKS - ks0), q, lane, ring_mem);
        float v[BT][2][4];
        combine(v, acc, t0, q, scales);
        finish(v, slab, t0, c, g, q, seeds, dithered, out, clips, first, batch_step, spectrum_step);
    }
}
