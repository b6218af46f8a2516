// Attention with ggml's tiled flash-attention numerics: the path llama.cpp's
// CPU backend takes for prompts (64 or more query rows), with an f32 query
// and an f32 value accumulator. Per query row:
//
//   keys are taken in tiles of 64 positions aligned at multiples of 64;
//   per tile: each score is an FMA chain over the head dimension in order,
//   starting from +0, times `scale`; the tile's maximum m; when m exceeds
//   the running maximum M, the accumulator and the sum S are multiplied by
//   expf(M - m) (the C library's expf) and M = m; each weight is ggml's
//   AVX-512 vector expf of (score - M); per 16-position block of the tile
//   the weights are summed by a fixed 16-lane tree, the block sums are added
//   in double and S = float(double(S) + that sum); then for each key in
//   order acc[d] = fma(weight, v[d], acc[d]);
//   finally out = acc * (1 / S).
//
// Keys outside the row's [first, end) take no part (ggml adds them with
// weight 0), so a row's result depends only on its query and its keys,
// never on the rows it is computed with.
#pragma once
#include <cstdint>
#include <span>

namespace reprise::kernels {

// Which numerics a query row takes, from the row alone: the tiled numerics
// when its keys reach past the first 64-position tile and the head size is
// a multiple of 16 (at most 256), which is when llama.cpp's AVX-512 build
// runs its tiled kernel for a prompt; otherwise the per-key numerics with an
// f16 accumulator (llama.cpp's path for short batches and decode), so short
// prompts and their continuations match llama.cpp exactly.
inline bool takes_tiled_attention(int64_t head_dim, int64_t end) {
  return head_dim % 16 == 0 && head_dim <= 256 && end > 64;
}

// K and V of one KV head widened to f32: K transposed in blocks of 16
// positions (block i, positions base + 16 i .. +15, at kt + i * d * 16 as
// [d][16]) and V rows (position p at v + (p - base) * d). base is a multiple
// of 16. Only blocks holding some query's keys are read.
struct TiledKv {
  const float* kt;
  const float* v;
  int64_t base;
  int64_t d;
};

// Up to kMaxTiledQueries query rows that attend to one KV head: query i
// (q[i], d floats, not rounded) attends to positions [first[i], end[i]) and
// writes d floats to out[i].
constexpr int kMaxTiledQueries = 4;
struct TiledQueries {
  int n = 0;
  const float* q[kMaxTiledQueries];
  int64_t first[kMaxTiledQueries];
  int64_t end[kMaxTiledQueries];
  float* out[kMaxTiledQueries];
};

// The same for queries that read K and V as f16 in place (decode), in up
// to kMaxTiledGroups groups of queries that share a KV head; group g's keys
// are KeyView{key_rows, kv_off, key_group, d} (tensor/key_layout.h) and its
// values start at value_rows[p] + kv_off.
constexpr int kMaxTiledGroups = 4;
// Groups of one KV head that take each tile together (a prompt task's run).
constexpr int kMaxWalkGroups = 32;
struct TiledGroup {
  int64_t kv_off = 0;
  TiledQueries queries;
};
void attend_tiled_rows(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                       int64_t key_group, std::span<const TiledGroup> groups, float scale);

// Groups of queries that all read one KV head's widened K/V (kv; the
// groups' kv_off is not used), tiles outside and groups inside, so the
// groups take a tile's K and V while they are in L1. Per query, the same
// bits as a group alone.
void attend_tiled(const TiledKv& kv, std::span<const TiledGroup> groups, float scale);

// The numerics written plainly, one query, for tests.
void attend_tiled_reference(const float* q, const uint16_t* const* key_rows, const uint16_t* const* value_rows,
                            int64_t kv_off, int64_t key_group, int64_t first, int64_t end, int64_t d, float scale,
                            float* out);

}  // namespace reprise::kernels
