// Post-processing of one F heap: the last Cooley–Tukey round of the unzipped FFT, the
// real-to-complex fix-up, gains, fine delay and phase, dither, saturating quantisation with
// clip counts, the partial transpose to (channel, spectrum, pol, re/im) and the polarisation
// interleave (seed 000 §FFT "Unzipping the FFT", §Postprocessing). Mirrors
// `dsp::pfb::ChannelFft` + `dsp::postproc::postproc_heap`; `cbf selftest --gpu` compares them.
//
// Compile-time constants (-D): CHANNELS (N), UNZIP (n), SPECTRA (spectra per launch: a batch of
// SPECTRA / HEAP_SPECTRA heaps, post-processed together so that heaps of few spectra still
// fill the GPU), HEAP_SPECTRA (spectra per heap),
// OUT_BITS (8, or 4 for packed nibbles), DITHER (0 or 1), STILE (values of s per block: 32,
// or 8 to give a heap of few spectra enough blocks), SPECTRUM_SAMPLES (digitiser samples from
// one spectrum to the next: 2·CHANNELS for wideband). A narrowband module (`postproc_nb`, at
// the end) also takes FFT_LEN, and CHANNELS is then the channels kept.
//
// Input: per polarisation and spectrum, the n C2C transforms Z^r (m = N/n points each) that
// cuFFT made of the unzipped frames: Z^r_s at [(pol·SPECTRA + spectrum)·N + r·m + s].
// With k = p·m + s, A_r = e^{−2πj·rs/N}·Z^r_s and B_r = e^{−2πj·rs/N}·conj(Z^r_{−s}):
//   Z_k = Σ_r e^{−2πj·rp/n}·A_r,  conj(Z_{−k}) = Σ_r e^{−2πj·rp/n}·B_r,
//   U = (Z_k + conj(Z_{−k}))/2,  V = (Z_k − conj(Z_{−k}))/2j,
//   X_k = U + e^{−πjk/N}·V,  X_{N−k} = conj(U − e^{−πjk/N}·V).
// A thread takes one s in [0, m/2) and all p, and X_{N−k} is dropped for s = 0 (it is the
// Nyquist bin or another p's X_k); s = m/2, whose X_{N−k} are also other p's X_k, is the
// grid's last column (mid_column). So every channel is produced exactly once.
//
// A block of 256 threads covers STILE values of s × 32 spectra; the results go through shared
// memory so that each warp writes one channel's 32 spectra (128 contiguous bytes at 8 bits).

#define SUBLEN (CHANNELS / UNZIP)
#define TILE 32
#define THREADS 256

typedef long long i64;
typedef unsigned long long u64;

// e^{−2πj·e/n}·z for e in [0, n): quarter turns only, since n divides 4 (exact).
__device__ __forceinline__ float2 turn(float2 z, int e)
{
    switch ((e * (4 / UNZIP)) & 3)
    {
    case 0:
        return z;
    case 1:
        return make_float2(z.y, -z.x);
    case 2:
        return make_float2(-z.x, -z.y);
    default:
        return make_float2(-z.y, z.x);
    }
}

__device__ __forceinline__ float2 cmul(float2 a, float2 b)
{
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

// e^{jπx}
__device__ __forceinline__ float2 expjpi(float x)
{
    float s, c;
    sincospif(x, &s, &c);
    return make_float2(c, s);
}

// `dsp::postproc::dither` (from `dither.cuh`): a 32-bit key per (spectrum, pol), computed once
// per row and pol; then per value one 32-bit hash of key + channel·0x9e3779b9.
__device__ __forceinline__ unsigned int dither_key(u64 seed, i64 ts, int pol)
{
    return mix_key(seed, ((u64)ts << 1) | (u64)pol, 0);
}

__device__ __forceinline__ float2 dither(unsigned int key, unsigned int channel_key)
{
    return dither_pair(key + channel_key);
}

#if OUT_BITS == 8
#define QMAX 127.0f
#else
#define QMAX 7.0f
#endif

// Saturating round-half-even quantisation (`dsp::postproc::quantise`); sets *clipped.
__device__ __forceinline__ int quantise(float v, float u, bool *clipped)
{
    const float x = __fadd_rn(v, u);
    *clipped |= !(fabsf(x) <= QMAX);
    return __float2int_rn(fminf(fmaxf(x, -QMAX), QMAX));
}

// The dither key of spectrum `sp` (of the launch) and `pol`: its timestamp is its heap's first
// plus sp·SPECTRUM_SAMPLES within the heap. 0 without dither.
__device__ __forceinline__ unsigned int spectrum_key(u64 seed, const i64 *__restrict__ ts0, int sp, int pol)
{
#if DITHER
    return dither_key(seed, ts0[sp / HEAP_SPECTRA] + (i64)(sp % HEAP_SPECTRA) * SPECTRUM_SAMPLES, pol);
#else
    return 0;
#endif
}

// Y plus the dither of (key, channel) where DITHER, quantised into (qr, qi); returns whether
// either part clipped.
__device__ __forceinline__ bool quantise_value(float2 y, unsigned int key, int ch, int &qr, int &qi)
{
#if DITHER
    const float2 d = dither(key, (unsigned int)ch * 0x9e3779b9u);
#else
    const float2 d = make_float2(0.0f, 0.0f);
#endif
    bool c = false;
    qr = quantise(y.x, d.x, &c);
    qi = quantise(y.y, d.y, &c);
    return c;
}

// One polarisation's (re, im) of a (channel, spectrum) into its place in the tile word that
// holds both, as the wire has them: 8-bit (re, im) bytes per pol, or one byte of packed
// nibbles (re high) per pol, pol 0 first. Written as soon as it is known, so that no thread
// holds a row's values for both polarisations in registers.
__device__ __forceinline__ void put(int *word, int pol, int re, int im)
{
#if OUT_BITS == 8
    reinterpret_cast<unsigned short *>(word)[pol] = (unsigned short)((re & 0xff) | ((im & 0xff) << 8));
#else
    reinterpret_cast<unsigned char *>(word)[pol] = (unsigned char)(((re & 0xf) << 4) | (im & 0xf));
#endif
}

// The same bits as `put` writes, in place in the word (for a word held in a register).
__device__ __forceinline__ int pol_bits(int pol, int re, int im)
{
#if OUT_BITS == 8
    return ((re & 0xff) | ((im & 0xff) << 8)) << (16 * pol);
#else
    return (((re & 0xf) << 4) | (im & 0xf)) << (8 * pol);
#endif
}

// The front end's power sums of the launch's heaps, moved into the stats (done by one block).
__device__ __forceinline__ void move_power(u64 *__restrict__ stats, u64 *__restrict__ power, int t)
{
    for (int h = t; h < 2 * (SPECTRA / HEAP_SPECTRA); h += THREADS)
    {
        stats[(h / 2) * 4 + 2 + h % 2] = power[h];
        power[h] = 0;
    }
}

// One (channel, spectrum) tile word (both pols) to its place in its heap: (channel, spectrum,
// pol, re/im).
__device__ __forceinline__ void store_word(unsigned char *__restrict__ out, int ch, int sp, int word)
{
    const int hp = sp / HEAP_SPECTRA;
    const i64 at = (i64)hp * CHANNELS * HEAP_SPECTRA + (i64)ch * HEAP_SPECTRA + sp % HEAP_SPECTRA;
#if OUT_BITS == 8
    reinterpret_cast<int *>(out)[at] = word;
#else
    reinterpret_cast<unsigned short *>(out)[at] = (unsigned short)word;
#endif
}

// Clip counts: per spectrum in shared memory, then one atomic per spectrum and pol into its
// heap's counter (threads 0 .. 2·TILE − 1, after a barrier).
__device__ __forceinline__ void flush_clips(u64 *__restrict__ stats, const unsigned int (*sclip)[2], int sp0, int t)
{
    if (t < 2 * TILE)
    {
        const int r = t >> 1, pol = t & 1;
        const int sp = sp0 + r;
        if (sp < SPECTRA && sclip[r][pol])
            atomicAdd(stats + (sp / HEAP_SPECTRA) * 4 + pol, (u64)sclip[r][pol]);
    }
}

// The batch's delay terms and first timestamps, moved from mapped host memory into device
// memory once per launch. Read by every block straight from the host, they cost a PCIe round
// trip per block and, for a large batch (17 × 1024 blocks at 4096 channels), megabytes of
// host reads queued with the chunk copies.
extern "C" __global__ void __launch_bounds__(THREADS) postproc_params(
    float2 *__restrict__ dphase,         // [pol][spectrum], device
    i64 *__restrict__ dts0,              // [heap], device
    const float2 *__restrict__ phase,    // the same, mapped host memory
    const i64 *__restrict__ ts0)
{
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i < 2 * SPECTRA)
        dphase[i] = phase[i];
    if (i < SPECTRA / HEAP_SPECTRA)
        dts0[i] = ts0[i];
}

// The per-(spectrum, pol) terms every value of a row shares, computed once per block into
// shared memory (seed 000 §Postprocessing; fengine_delay_convention.md §3): with θ_k/π =
// ph.x·k + ph.y, e^{jθ_k} for k = p·m + s is e^{jθ_s}·step^p with step = e^{jπ·ph.x·m}, and
// e^{jθ_{N−k}} = wn·conj(e^{jθ_k}) with wn = e^{jπ(ph.x·N + 2·ph.y)}; the dither key.
struct RowTerms
{
    float2 ph, step, wn;
    unsigned int key;
};

// The twiddles of one s, the rest derived from them per use (so that a thread holds 4
// registers of twiddles, not 4·UNZIP, and three blocks of 256 fit an SM): e^{−2πj·rs/N} =
// tw1^r, and e^{−πjk/N} for k = p·m + s is et0·e^{−πj·p/n}, p·4/n eighth turns.
struct Twiddles
{
    float2 tw1, et0;
};

__device__ __forceinline__ Twiddles twiddles(int s)
{
    return {expjpi(-2.0f * (float)s / (float)CHANNELS), expjpi(-(float)s / (float)CHANNELS)};
}

// e^{−πj·e/4}·z for e in [0, 4).
__device__ __forceinline__ float2 eighth_turns(float2 z, int e)
{
    const float h = 0.70710678118654752f; // √½
    switch (e & 3)
    {
    case 0:
        return z;
    case 1: // (1 − j)/√2
        return make_float2(h * (z.x + z.y), h * (z.y - z.x));
    case 2: // −j
        return make_float2(z.y, -z.x);
    default: // (−1 − j)/√2
        return make_float2(h * (z.y - z.x), -h * (z.x + z.y));
    }
}

// One (spectrum, pol) of the thread's s: the UNZIP values of Z^r_s and Z^r_{m−s}, the last
// Cooley–Tukey round, the real-to-complex fix-up, gains, delay phase, dither and quantisation.
// emit(p, h, ch, re, im) places each value (h = 1: X_{N−k}, only when `mirror`); returns the
// values clipped.
template <typename Emit>
__device__ __forceinline__ unsigned int channelise(const float2 *__restrict__ z, const float2 *__restrict__ g, int s,
                                                   const Twiddles &t, const RowTerms &rt, bool mirror, Emit emit)
{
    const int sm = (SUBLEN - s) % SUBLEN;
    float2 a[UNZIP], b[UNZIP];
    float2 tw = t.tw1;
#pragma unroll
    for (int r = 0; r < UNZIP; r++)
    {
        const float2 zs = z[r * SUBLEN + s];
        const float2 zm = z[r * SUBLEN + sm];
        const float2 zc = make_float2(zm.x, -zm.y);
        // e^{−2πj·rs/N} = tw1^r (r = 0: no rotation)
        a[r] = r == 0 ? zs : cmul(tw, zs);
        b[r] = r == 0 ? zc : cmul(tw, zc);
        if (r > 0 && r + 1 < UNZIP)
            tw = cmul(tw, t.tw1);
    }
    // Z_k and conj(Z_{−k}) for k = p·m + s: Σ_r e^{−2πj·rp/n}·A_r (and B_r). For n = 4 as a
    // radix-4 butterfly (16 additions per array instead of 32).
    float2 zk[UNZIP], zc[UNZIP];
#if UNZIP == 4
    {
        const float2 *v[2] = {a, b};
#pragma unroll
        for (int w = 0; w < 2; w++)
        {
            const float2 *x = v[w];
            float2 *o = w ? zc : zk;
            const float2 s0 = make_float2(x[0].x + x[2].x, x[0].y + x[2].y);
            const float2 d0 = make_float2(x[0].x - x[2].x, x[0].y - x[2].y);
            const float2 s1 = make_float2(x[1].x + x[3].x, x[1].y + x[3].y);
            const float2 d1 = turn(make_float2(x[1].x - x[3].x, x[1].y - x[3].y), 1); // −j·(x1 − x3)
            o[0] = make_float2(s0.x + s1.x, s0.y + s1.y);
            o[1] = make_float2(d0.x + d1.x, d0.y + d1.y);
            o[2] = make_float2(s0.x - s1.x, s0.y - s1.y);
            o[3] = make_float2(d0.x - d1.x, d0.y - d1.y);
        }
    }
#else
#pragma unroll
    for (int p = 0; p < UNZIP; p++)
    {
        zk[p] = make_float2(0.0f, 0.0f);
        zc[p] = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int r = 0; r < UNZIP; r++)
        {
            const float2 ta = turn(a[r], (r * p) % UNZIP);
            const float2 tb = turn(b[r], (r * p) % UNZIP);
            zk[p].x += ta.x;
            zk[p].y += ta.y;
            zc[p].x += tb.x;
            zc[p].y += tb.y;
        }
    }
#endif
    float2 rot = expjpi(rt.ph.x * (float)s + rt.ph.y);
    unsigned int nclip = 0;
#pragma unroll
    for (int p = 0; p < UNZIP; p++)
    {
        const float2 u = make_float2(0.5f * (zk[p].x + zc[p].x), 0.5f * (zk[p].y + zc[p].y));
        // (Z − conj Z')/2j
        const float2 v = make_float2(0.5f * (zk[p].y - zc[p].y), -0.5f * (zk[p].x - zc[p].x));
        const int k = p * SUBLEN + s;
        const float2 ev = cmul(eighth_turns(t.et0, p * (4 / UNZIP)), v);
#pragma unroll
        for (int h = 0; h < 2; h++)
        {
            if (h == 1 && !mirror)
                break;
            const int ch = h ? CHANNELS - k : k;
            const float2 x = h ? make_float2(u.x - ev.x, -(u.y - ev.y)) : make_float2(u.x + ev.x, u.y + ev.y);
            // Y = (g·e^{jθ})·X
            const float2 r = h ? cmul(rt.wn, make_float2(rot.x, -rot.y)) : rot;
            const float2 y = cmul(cmul(g[ch & (CHANNELS - 1)], r), x);
            int qr, qi;
            nclip += quantise_value(y, rt.key, ch, qr, qi);
            emit(p, h, ch, qr, qi);
        }
        if (p + 1 < UNZIP)
            rot = cmul(rot, rt.step);
    }
    return nclip;
}

__device__ __forceinline__ RowTerms row_terms(const float2 *__restrict__ phase, const i64 *__restrict__ ts0, u64 seed,
                                              int sp, int pol)
{
    RowTerms rt;
    rt.ph = phase[pol * SPECTRA + sp];
    rt.step = expjpi(rt.ph.x * (float)SUBLEN);
    rt.wn = expjpi(rt.ph.x * (float)CHANNELS + 2.0f * rt.ph.y);
    rt.key = spectrum_key(seed, ts0, sp, pol);
    return rt;
}

// s = m/2, whose X_{N−k} are other p's X_k, as X_0's are for s = 0: a column of its own (the
// grid's last), so that the blocks of the other values of s are whole. One thread per spectrum
// (TILE·THREADS/32 spectra per block, the rest of the column's blocks idle), both pols, each
// word stored straight to its heap (consecutive spectra: coalesced); clips counted per value.
// Not inlined: inlined beside the tiled path it made ptxas spill 8 bytes at 40 registers on
// sm_80 for n = 2 shapes (the compile check refuses spills).
__device__ __noinline__ void mid_column(unsigned char *__restrict__ out, const float2 *__restrict__ in,
                                           const float2 *__restrict__ gains, const float2 *__restrict__ phase,
                                           const i64 *__restrict__ ts0, u64 seed, u64 *__restrict__ stats)
{
    const int sp = blockIdx.y * THREADS + threadIdx.x;
    if (sp >= SPECTRA)
        return;
    const int s = SUBLEN / 2, hp = sp / HEAP_SPECTRA;
    const Twiddles t = twiddles(s);
    int words[UNZIP] = {};
#pragma unroll
    for (int pol = 0; pol < 2; pol++)
    {
        const RowTerms rt = row_terms(phase, ts0, seed, sp, pol);
        const unsigned int c = channelise(in + (i64)(pol * SPECTRA + sp) * CHANNELS, gains + (hp * 2 + pol) * CHANNELS,
                                          s, t, rt, false,
                                          [&](int p, int, int, int re, int im) { words[p] |= pol_bits(pol, re, im); });
        if (c)
            atomicAdd(stats + hp * 4 + pol, (u64)c);
    }
#pragma unroll
    for (int p = 0; p < UNZIP; p++)
        store_word(out, p * SUBLEN + s, sp, words[p]);
}

extern "C" __global__ void __launch_bounds__(THREADS) postproc(
    unsigned char *__restrict__ out,     // [heap] CHANNELS × HEAP_SPECTRA × 2 pols × (re, im)
    const float2 *__restrict__ in,       // cuFFT output (see above)
    const float2 *__restrict__ gains,    // [heap][pol][channel]
    const float2 *__restrict__ phase,    // [pol][spectrum]: θ_k/π = x·k + y (postproc_params)
    const i64 *__restrict__ ts0,         // [heap] first spectrum's timestamp (postproc_params);
                                         // a heap's spectra are consecutive: ts0 + sp·2N
    u64 seed,
    u64 *__restrict__ power,             // [heap][pol] the front end's Σx²: moved out
    u64 *__restrict__ stats)             // [heap][clips pol 0, clips pol 1, power 0, power 1];
                                         // clip counts accumulate (the host takes differences)
{
    if (blockIdx.x == 0 && blockIdx.y == 0)
        move_power(stats, power, threadIdx.x);
    if (blockIdx.x == gridDim.x - 1)
    {
        mid_column(out, in, gains, phase, ts0, seed, stats);
        return;
    }
    __shared__ int tile[2 * UNZIP][STILE][TILE + 1];
    __shared__ RowTerms srow[2][TILE];
    __shared__ unsigned int sclip[TILE][2];      // clipped values per spectrum and pol
    const int lin = threadIdx.x, lane = lin & 31, warp = lin >> 5;
    const int sp0 = blockIdx.y * TILE;
    if (lin < 2 * TILE)
    {
        const int pol = lin / TILE, r = lin % TILE;
        if (sp0 + r < SPECTRA)
            srow[pol][r] = row_terms(phase, ts0, seed, sp0 + r, pol);
        sclip[r][pol] = 0;
    }
    __syncthreads();
    const int sx = lin % STILE;
    const int s = blockIdx.x * STILE + sx;
    if (s < SUBLEN / 2)
    {
        const Twiddles t = twiddles(s);
        for (int row = lin / STILE; row < TILE; row += THREADS / STILE)
        {
            const int sp = sp0 + row;
            if (sp >= SPECTRA)
                break;
            const int hp = sp / HEAP_SPECTRA;
#pragma unroll 1
            for (int pol = 0; pol < 2; pol++)
            {
                const unsigned int c = channelise(
                    in + (i64)(pol * SPECTRA + sp) * CHANNELS, gains + (hp * 2 + pol) * CHANNELS, s, t,
                    srow[pol][row], s != 0,
                    [&](int p, int h, int, int re, int im) { put(&tile[h * UNZIP + p][sx][row], pol, re, im); });
                if (c)
                    atomicAdd(&sclip[row][pol], c);
            }
        }
    }
    __syncthreads();
    // Each warp writes whole rows: one channel, TILE spectra.
    for (int rowid = warp; rowid < 2 * UNZIP * STILE; rowid += THREADS / 32)
    {
        const int h = rowid / STILE, sr = rowid % STILE;
        const int ss = blockIdx.x * STILE + sr;
        if (ss >= SUBLEN / 2 || (h >= UNZIP && ss == 0))
            continue;
        const int ch = h < UNZIP ? h * SUBLEN + ss : CHANNELS - ((h - UNZIP) * SUBLEN + ss);
        const int sp = sp0 + lane;
        if (sp < SPECTRA)
            store_word(out, ch, sp, tile[h][sr][lane]);
    }
    __syncthreads();
    flush_clips(stats, sclip, sp0, lin);
}

#ifdef FFT_LEN
// Narrowband post-processing (seed 000 §Narrowband; `dsp::postproc::postproc_heap_as` with
// `PhaseConvention::Narrowband`): the input is the C2C cuFFT of FFT_LEN points per
// (pol, spectrum) at [(pol·SPECTRA + spectrum)·FFT_LEN + bin]; output channel j is bin
// (j − CHANNELS/2) mod FFT_LEN (DC at the centre; discard mode drops the outer half). The
// phase pairs (x, y) give θ_j/π = x·j + y with the narrowband convention's terms (the host
// writes them), and the dither is keyed on j. A block covers 32 channels × 32 spectra (threads
// 32 × 8, four rows each); the words go through shared memory so that each warp writes one
// channel's 32 spectra, as the wideband kernel does.
extern "C" __global__ void __launch_bounds__(THREADS) postproc_nb(
    unsigned char *__restrict__ out,
    const float2 *__restrict__ in,
    const float2 *__restrict__ gains,    // [heap][pol][channel]
    const float2 *__restrict__ phase,    // [pol][spectrum]
    const i64 *__restrict__ ts0,         // [heap]
    u64 seed,
    u64 *__restrict__ power,             // [heap][pol]: moved out (zero: no narrowband power)
    u64 *__restrict__ stats)             // [heap][clips 0, clips 1, power 0, power 1]
{
    __shared__ int tile[TILE][TILE + 1];
    __shared__ unsigned int sclip[TILE][2];
    const int t = threadIdx.x;
    const int lane = t & 31, ty = t >> 5;
    const int j = blockIdx.x * TILE + lane;
    const int sp0 = blockIdx.y * TILE;
    if (t < 2 * TILE)
        sclip[t >> 1][t & 1] = 0;
    if (blockIdx.x == 0 && blockIdx.y == 0)
        move_power(stats, power, t);
    __syncthreads();
    if (j < CHANNELS)
    {
        const int bin = (j + FFT_LEN - CHANNELS / 2) % FFT_LEN;
        for (int row = ty; row < TILE; row += THREADS / 32)
        {
            const int sp = sp0 + row;
            if (sp >= SPECTRA)
                break;
            const int hp = sp / HEAP_SPECTRA;
#pragma unroll
            for (int pol = 0; pol < 2; pol++)
            {
                const float2 x = in[(i64)(pol * SPECTRA + sp) * FFT_LEN + bin];
                const float2 ph = phase[pol * SPECTRA + sp];
                const float2 rot = expjpi(ph.x * (float)j + ph.y);
                const float2 g = gains[(hp * 2 + pol) * CHANNELS + j];
                const float2 y = cmul(cmul(g, rot), x);
                int qr, qi;
                if (quantise_value(y, spectrum_key(seed, ts0, sp, pol), j, qr, qi))
                    atomicAdd(&sclip[row][pol], 1u);
                put(&tile[lane][row], pol, qr, qi);
            }
        }
    }
    __syncthreads();
    for (int c = ty; c < TILE; c += THREADS / 32)
    {
        const int ch = blockIdx.x * TILE + c;
        const int sp = sp0 + lane;
        if (ch < CHANNELS && sp < SPECTRA)
            store_word(out, ch, sp, tile[c][lane]);
    }
    __syncthreads();
    flush_clips(stats, sclip, sp0, t);
}
#endif
