// The project's counter-based generator (`dsp::random`) for the kernels that dither
// (`kernels/postproc.cu`, `kernels/beamform.cu`): `gpu::compile` puts this file before their
// source, so that both take the oracles' bits from one definition.

// The top 32 bits of `dsp::random::mix(seed, stream, index)`: SplitMix64's finaliser over a
// linear key, three 64-bit multiplies. Used once per key, never per value.
__device__ __forceinline__ unsigned int mix_key(unsigned long long seed, unsigned long long stream,
                                                unsigned long long index)
{
    unsigned long long z = seed + stream * 0xd1b54a32d192ed03ull + index * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned int)((z ^ (z >> 31)) >> 32);
}

// `dsp::random::dither_pair16(hash32(x))`: a 32-bit hash (two 32-bit multiplies), bits 31..16
// for the real part and 15..0 for the imaginary, each uniform in [−½, ½). b·2⁻¹⁶ − ½ has both
// steps exact, so one fused multiply-add gives the oracle's value.
__device__ __forceinline__ float2 dither_pair(unsigned int x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    const float scale = 1.0f / 65536.0f;
    return make_float2(__fmaf_rn((float)(x >> 16), scale, -0.5f), __fmaf_rn((float)(x & 0xffffu), scale, -0.5f));
}
