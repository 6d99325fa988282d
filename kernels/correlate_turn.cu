// The correlator's corner turn (issue 12 "a pre-pass"): the X-engine chunk's int8 (or packed
// 4-bit) samples, laid out (batch, antenna, channel, spectrum, pol, re/im) as the F heaps arrive
// (`dsp::correlate`), become the planar, time-major rows the tensor cores read
// (correlator_hopper.md "A planar alternative"):
//
//   planar[batch][channel][g][plane][r][TPAD]   plane 0 = Re, 1 = Im; antenna-pol i = 8·g + r
//
// with antenna-pol i = 2·antenna + pol (for the mma kernel; the wgmma kernel's rows are the same
// but cut into steps of 128 times and swizzled, see `word`). Rows of antenna-pols at or beyond 2·N_ANTS and times at
// or beyond SPECTRA are written as zeros, so the correlator may read whole tiles without
// bounds checks and the buffer needs no clearing. Both operands of the integer tensor-core
// instructions must be K-major (time contiguous), and nothing is negated (Im = IR − RI is formed
// after the products), so −128 stays −128 and is correlated exactly. 4-bit input (one byte per
// complex value, real in the high nibble) is sign-extended to int8 here: Hopper has no int4
// tensor cores.
//
// Short heaps are merged in time: GROUP consecutive batches become one planar row set of
// GROUP·SPECTRA times (batch b·GROUP + k's spectrum s at time k·SPECTRA + s), which the correlator
// sums into one accumulator, so that heaps of few spectra (katgpucbf's default 32 at 32768
// channels) are not each padded to the correlator's time step. The launch's z index is the
// group; batches at or beyond the launch's `n` are zeros (a range may end inside a group).
//
// Compile-time constants (-D): N_ANTS, CHANNELS, SPECTRA (T), GROUP, TPAD (GROUP·T rounded up to
// the correlator's time step), NP (antenna-pols rounded up to the correlator's tile), IN_BITS
// (8 or 4), TILED (0: rows of TPAD times, for the mma kernel; 1: the wgmma kernel's tiled,
// pre-swizzled order, see `word`; TPAD a multiple of 128).
//
// Mapping: a block of 256 threads takes one group of 8 antenna-pols (4 antennas) of one
// channel and 256 consecutive times; a thread takes one antenna and 4 consecutive times, reads
// its 4 samples (both pols) and writes 4 bytes to each of its 4 rows (Re and Im of each pol).
// Consecutive threads write consecutive words of a row. The alternative, a shared-memory
// transpose with 16-byte stores, was not taken: this pass moves ~2 bytes per input byte and is
// a small part of the correlation's time at the antenna counts where speed matters.

#define THREADS 256
#define TIMES_PER_THREAD 4
#define TIMES_PER_BLOCK ((THREADS / 4) * TIMES_PER_THREAD)
#define T_TILES ((TPAD + TIMES_PER_BLOCK - 1) / TIMES_PER_BLOCK)

typedef unsigned int u32;

// One complex sample of one pol as (re, im).
__device__ __forceinline__ char2 sample(const unsigned char *__restrict__ in, long long idx, int pol)
{
#if IN_BITS == 8
    const char2 *p = reinterpret_cast<const char2 *>(in);
    return p[idx * 2 + pol];
#elif IN_BITS == 4
    signed char b = (signed char)in[idx * 2 + pol];
    return make_char2((signed char)(b >> 4), (signed char)((signed char)(b << 4) >> 4));
#else
#error "IN_BITS must be 8 or 4"
#endif
}

// The 4-byte word of planar row `row` (g·16 + plane·8 + r) holding times t .. t + 3 (t a
// multiple of 4) of group b, channel c.
__device__ __forceinline__ long long word(int b, int c, int row, int t)
{
    const long long chan = (long long)b * CHANNELS + c;
#if TILED
    // (group, channel, step of 128 times, row, 128 bytes) with the row's 16-byte chunks in the
    // 128-byte swizzle, so that one step of a tile's rows is one contiguous block in exactly
    // the layout wgmma reads from shared memory: the correlator stages it with a single bulk
    // copy (kernels/correlate_wgmma.cu).
    const long long byte = ((chan * (TPAD / 128) + t / 128) * (2 * NP) + row) * 128 +
                           ((((t % 128) >> 4) ^ (row & 7)) << 4) + (t & 15);
    return byte / 4;
#else
    return (chan * NP * 2 + row) * (TPAD / 4) + t / 4;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS) corr_turn(const unsigned char *__restrict__ in,
                                                               u32 *__restrict__ planar, int n)
{
    const int tile = blockIdx.x % T_TILES;
    const int g = blockIdx.x / T_TILES;
    const int c = blockIdx.y;
    const int b = blockIdx.z;
    const int local = threadIdx.x / (THREADS / 4); // antenna within the group
    const int t0 = tile * TIMES_PER_BLOCK + (threadIdx.x % (THREADS / 4)) * TIMES_PER_THREAD;
    if (t0 >= TPAD)
        return;
    const int ant = 4 * g + local;
    u32 re[2] = {0, 0}, im[2] = {0, 0};
    if (ant < N_ANTS)
    {
#pragma unroll
        for (int k = 0; k < TIMES_PER_THREAD; ++k)
        {
            const int t = t0 + k;
            const int sub = t / SPECTRA;
            const int batch = b * GROUP + sub;
            if (sub < GROUP && batch < n)
            {
                const long long idx =
                    (((long long)batch * N_ANTS + ant) * CHANNELS + c) * SPECTRA + (t - sub * SPECTRA);
#pragma unroll
                for (int pol = 0; pol < 2; ++pol)
                {
                    char2 s = sample(in, idx, pol);
                    re[pol] |= (u32)(unsigned char)s.x << (8 * k);
                    im[pol] |= (u32)(unsigned char)s.y << (8 * k);
                }
            }
        }
    }
#pragma unroll
    for (int pol = 0; pol < 2; ++pol)
    {
        const int r = 2 * local + pol;
        planar[word(b, c, g * 16 + r, t0)] = re[pol];
        planar[word(b, c, g * 16 + 8 + r, t0)] = im[pol];
    }
}
