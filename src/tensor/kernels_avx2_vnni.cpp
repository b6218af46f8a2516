// The AVX2 kernels with AVX-VNNI's vpdpbusd for their integer dots, chosen at
// run time on CPUs that have AVX-VNNI but not AVX-512 (Intel client CPUs since
// Alder Lake, Sierra Forest): kernels_avx2.cpp built again with
// REPRISE_AVX_VNNI, which defines avx2_vnni_kernels(). The headers come
// first, without the target pragma, so no inline library function is
// compiled for AVX-VNNI (the one the linker keeps could then run anywhere).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "tensor/kernels_impl.h"
#include "tensor/tile_runner.h"

#pragma GCC push_options
#pragma GCC target("avxvnni")
#define REPRISE_AVX_VNNI 1
#include "tensor/kernels_avx2.cpp"
#pragma GCC pop_options
