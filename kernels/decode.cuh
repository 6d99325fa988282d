// Decoding of big-endian bit-packed digitiser samples (seed 000 §Decode), shared by the kernels
// that read them (`kernels/pfb.cu`, `kernels/ddc.cu`): `gpu::compile` puts this file before
// their source. SAMPLE_BITS (2..10, 12, 16) is the kernel's -D constant.

typedef unsigned char u8;

// The sample whose first bit is bit `sh` (0..7) of byte p[0], sign-extended: two bytes, shifted
// left to the top, then arithmetically right. The buffer carries a padding byte so that the
// second byte of the last sample is always readable.
__device__ __forceinline__ int decode_at(const u8 *__restrict__ p, int sh)
{
#if SAMPLE_BITS == 8
    return (int)(signed char)p[0];
#elif SAMPLE_BITS == 2 || SAMPLE_BITS == 4
    return ((int)(signed char)(u8)((unsigned int)p[0] << sh)) >> (8 - SAMPLE_BITS);
#else
    const unsigned int v = ((unsigned int)p[0] << 8) | p[1];
    return ((int)(short)(unsigned short)(v << sh)) >> (16 - SAMPLE_BITS);
#endif
}

