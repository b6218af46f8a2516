// The AVX-512 Q5_K and Q6_K kernels with GFNI's affine byte transform placing
// their quants' high bits (one operation where shifts and masks took three),
// chosen at run time on CPUs with AVX-512 and GFNI (Ice Lake and later, Zen 4
// and later): kernels_avx512.cpp built again with REPRISE_AVX512_GFNI, which
// defines avx512_gfni_kernels(). The same integers, so the same bits.
#define REPRISE_AVX512_GFNI 1
#include "tensor/kernels_avx512.cpp"
