// Fused decode + PFB FIR: the GPU front end of the wideband F-engine (seed 000 §Decode,
// §Polyphase Filter Bank, §Digitiser sample statistics). Mirrors `dsp::samples::unpack` and
// `dsp::pfb::pfb_fir`; `cbf selftest --gpu` compares them.
//
// Compile-time constants (-D): CHANNELS (N, a power of two), TAPS, SAMPLE_BITS (2..10, 12, 16),
// UNZIP (n, dividing N with N/n >= 2), SPECTRA (spectra of the heaps post-processed together:
// the frames buffer holds 2 pols × SPECTRA frames), HEAP_SPECTRA (spectra per heap: slot k
// belongs to heap k / HEAP_SPECTRA of the batch, whose power counter its samples add to).
//
// One launch computes `count` consecutive spectra (batch slots k, k+1, ..., across heaps) of
// one or both polarisations (blockIdx.z), whose windows start at samples start, start + STEP,
// ... of that polarisation's input (a constant coarse delay: the caller splits a run where the
// delay changes). Each thread owns one column i of the STEP-sample frame for
// `section` consecutive spectra and keeps the FIR's sliding window in registers: the loop is
// unrolled by TAPS so that every register index is a compile-time constant.
//
// The output is written in the unzip order of seed 000 §Unzipping the FFT: the frame read as N
// complex values z_i (re = x_2i, im = x_2i+1) with i = q·n + r is stored at r·(N/n) + q, so that
// every z^r is contiguous for one batched C2C cuFFT of N/n points.
//
// Each tap is one fused multiply-add (one rounding), in tap order from 0, as the CPU oracle
// does them, so the two agree bit for bit.

#define STEP (2 * CHANNELS)
#define SUBLEN (CHANNELS / UNZIP)

typedef long long i64;
typedef unsigned long long u64;

// Bytes from one spectrum's window row to the next (a whole number for every width once
// STEP >= 8; smaller frames take the general path).
#define ROW_BITS (STEP * SAMPLE_BITS)
#define ROW_BYTES (ROW_BITS / 8)
#define WHOLE_ROWS (ROW_BITS % 8 == 0)

// decode_at: kernels/decode.cuh, which `gpu::compile` puts before this file.

// Staged path (every block a full 256 columns of whole-byte rows, so that every row of a block
// starts at the same offset from a 16-byte boundary): the block first copies the rows its
// section needs (section + TAPS − 1 of them) into shared memory with 16-byte asynchronous
// copies, all in flight at once, then decodes from there. Loading 1–2 bytes per sample straight
// from global memory left the kernel waiting on its loads (ncu: scoreboard stalls on L1TEX
// were the largest share of its 18 cycles between instructions, at 50 % occupancy).
#define BLOCK 256
#define STAGED (WHOLE_ROWS && STEP % BLOCK == 0)
#define SEG_BYTES (BLOCK * SAMPLE_BITS / 8)
// A staged row: the block's bytes, up to 15 bytes of alignment slop before them, and the
// byte after them that the decode of the last sample reads (`pfb::staged_row_bytes`).
#define SROW ((SEG_BYTES + 17 + 15) / 16 * 16)

__device__ __forceinline__ void copy16_async(void *smem, const void *gmem)
{
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void copies_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `pending` (a constant after unrolling, 0..GROUPS − 1) of this thread's
// committed copy groups are still in flight.
__device__ __forceinline__ void copies_wait(int pending)
{
    switch (pending)
    {
    case 0:
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        break;
    case 1:
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        break;
    case 2:
        asm volatile("cp.async.wait_group 2;\n" ::: "memory");
        break;
    default:
        asm volatile("cp.async.wait_group 3;\n" ::: "memory");
        break;
    }
}

// The staged rows come in GROUPS copy groups, one per part of the section (parts of a multiple
// of TAPS spectra): the block computes part q as soon as its rows are in, while the later parts'
// copies are still in flight, instead of waiting for the whole section first.
#define GROUPS 4

// Sample g of a big-endian bit-packed stream.
__device__ __forceinline__ int decode(const u8 *__restrict__ in, i64 g)
{
    const i64 bit = g * SAMPLE_BITS;
    return decode_at(in + (bit >> 3), (int)(bit & 7));
}

// Digitiser power in 64-bit integers (seed 000): a warp sum, then one atomic per warp where
// the whole warp calls this (`whole_warp`), else one per thread.
__device__ __forceinline__ void add_power(u64 *__restrict__ counter, i64 pw, bool whole_warp)
{
    if (whole_warp)
    {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            pw += __shfl_down_sync(0xffffffffu, pw, off);
        if ((threadIdx.x & 31) == 0 && pw != 0)
            atomicAdd(counter, (u64)pw);
    }
    else if (pw != 0)
        atomicAdd(counter, (u64)pw);
}

extern "C" __global__ void __launch_bounds__(BLOCK) pfb_fir(
    float *__restrict__ out,             // frames: [pol][SPECTRA][STEP]
    const u8 *__restrict__ in,           // input slot: pol p's packed samples at p·pol_stride
    i64 in_len,                          // bytes of the input slot
    const float *__restrict__ weights,   // TAPS × STEP, tap-major
    u64 *__restrict__ power,             // [heap][pol] Σx² accumulators
    i64 start0,                          // first window's first sample, pol 0
    i64 start1,                          // same, pol 1
    i64 pol_stride,
    int first_pol,
    int k,
    int count,
    int section)
{
    const int pol = first_pol + blockIdx.z;
    const i64 in_start = pol ? start1 : start0;
    in += pol * pol_stride;
    const i64 out_start = (i64)(pol * SPECTRA + k) * STEP;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int first = blockIdx.y * section;
    const int n = min(section, count - first);
    // The heap of this block's first spectrum, and the block's spectrum index at which the
    // next heap begins (a block straddles heaps when a launch covers several).
    int heap = (k + first) / HEAP_SPECTRA;
    int next_heap = (heap + 1) * HEAP_SPECTRA - (k + first);
    i64 pw = 0, pw_next = 0; // Σx² of this heap's spectra, and of the next heap's in this group
#if STAGED
    extern __shared__ __align__(16) u8 srows[];
    if (n > 0) // the same for the whole block
    {
        const i64 bit0 = (in_start + (i64)first * STEP + blockIdx.x * BLOCK) * SAMPLE_BITS;
        const i64 abase = (bit0 >> 3) & ~(i64)15;
        const i64 limit = in_len - pol * pol_stride;
        const int chunks = SROW / 16;
        // Part q computes spectra [q·part, (q + 1)·part) and needs rows up to (q + 1)·part +
        // TAPS − 1; its group copies those the earlier parts did not.
        const int part = (n + GROUPS * TAPS - 1) / (GROUPS * TAPS) * TAPS;
#pragma unroll
        for (int q = 0; q < GROUPS; q++)
        {
            const int r0 = q == 0 ? 0 : min(q * part, n) + TAPS - 1;
            const int r1 = min((q + 1) * part, n) + TAPS - 1;
            for (int e = r0 * chunks + threadIdx.x; e < r1 * chunks; e += BLOCK)
            {
                const int r = e / chunks, c = e % chunks;
                const i64 src = abase + (i64)r * ROW_BYTES + c * 16;
                if (src + 16 <= limit)
                    copy16_async(srows + r * SROW + c * 16, in + src);
            }
            copies_commit();
        }
        // This column's first bit within a staged row.
        const int bit = (int)(bit0 - abase * 8) + threadIdx.x * SAMPLE_BITS;
        const u8 *base = srows + (bit >> 3);
        const int sh = bit & 7;
#define SAMPLE(r) decode_at(base + (r) * SROW, sh)
#else
    if (i < STEP && n > 0)
    {
        const i64 g = in_start + (i64)first * STEP + i;
        // Window row r of this column is sample g + r·STEP. With whole-byte rows every row
        // starts at the same bit offset, so one pointer and a fixed stride serve them all.
#if WHOLE_ROWS
        const u8 *base = in + ((g * SAMPLE_BITS) >> 3);
        const int sh = (int)((g * SAMPLE_BITS) & 7);
#define SAMPLE(r) decode_at(base + (i64)(r) * ROW_BYTES, sh)
#else
#define SAMPLE(r) decode(in, g + (i64)(r) * STEP)
#endif
#endif
        float w[TAPS];
#pragma unroll
        for (int t = 0; t < TAPS; t++)
            w[t] = weights[t * STEP + i];
#if STAGED
        // Part 0's rows are in (the weights' loads above overlapped the wait).
        copies_wait(GROUPS - 1);
        __syncthreads();
#endif
        float win[TAPS];
#pragma unroll
        for (int t = 0; t < TAPS - 1; t++)
            win[t] = (float)SAMPLE(t);
        const int zi = i >> 1;
        const int pos = 2 * ((zi % UNZIP) * SUBLEN + zi / UNZIP) + (i & 1);
        float *o = out + out_start + (i64)first * STEP + pos;
        for (int j0 = 0; j0 < n; j0 += TAPS)
        {
#if STAGED
            if (j0 > 0 && j0 % part == 0)
            {
                // Part j0 / part begins: wait for its rows.
                copies_wait(GROUPS - 1 - j0 / part);
                __syncthreads();
            }
#endif
            // The group's TAPS new samples are loaded before any is used (the index is clamped
            // rather than the load guarded, so the loads are unconditional and all in flight
            // at once: bytes per load are few, so parallelism has to come from their number).
            int xs[TAPS];
#pragma unroll
            for (int jj = 0; jj < TAPS; jj++)
                xs[jj] = SAMPLE(min(j0 + jj, n - 1) + TAPS - 1);
#pragma unroll
            for (int jj = 0; jj < TAPS; jj++)
            {
                const int j = j0 + jj;
                if (j < n)
                {
                    // The newest sample is the last step of spectrum j's window: the samples
                    // the digitiser power counts (each input sample once in steady state).
                    const int x = xs[jj];
                    win[(jj + TAPS - 1) % TAPS] = (float)x;
                    const unsigned int x2 = x * x; // |x| <= 2^15: x² fits 32 bits unsigned
                    if (j < next_heap)
                        pw += x2;
                    else
                        pw_next += x2;
                    float acc = 0.0f;
#pragma unroll
                    for (int t = 0; t < TAPS; t++)
                        acc = __fmaf_rn(w[t], win[(jj + t) % TAPS], acc);
                    o[(i64)j * STEP] = acc;
                }
            }
            if (next_heap <= j0 + TAPS && next_heap < n)
            {
                // A heap ended in this group (at most one does: the host lets a run cross
                // heaps only where they have at least TAPS spectra). Uniform over the block.
                add_power(power + 2 * heap + pol, pw, STAGED);
                pw = pw_next;
                pw_next = 0;
                heap++;
                next_heap += HEAP_SPECTRA;
            }
        }
#undef SAMPLE
    }
    add_power(power + 2 * heap + pol, pw, true);
}
