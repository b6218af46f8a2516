// How attention keys are stored: transposed in groups of positions.
//
// One KV head's keys of the `group` positions g .. g + group - 1 (g a
// multiple of group) are one [head_dim][group] array of f16 values: element
// i of position p is at (start of p's group) + i * group + p % group. With
// groups of 16, decode attention loads dimension i of 16 positions as one
// vector straight from the cache, where rows ([position][head_dim]) had to be
// transposed tile by tile first (most of decode attention's time at depth;
// docs/performance.md). Values stay rows: they are consumed position by
// position.
//
// group is a power of two, at most kKeyGroup: a store whose runs of adjacent
// positions are shorter (cache blocks of 8 positions, say) uses the largest
// group that fits them, and the kernels gather such keys into 16-position
// tiles (correct, and slower; the default block of 32 takes groups of 16).
#pragma once
#include <cstdint>

namespace reprise {

constexpr int64_t kKeyGroup = 16;

// The key group for runs of `run` adjacent positions that start at multiples
// of `run`: the largest power of two dividing run, at most kKeyGroup.
inline int64_t key_group_for(int64_t run) {
  int64_t g = 1;
  while (g < kKeyGroup && run % (2 * g) == 0) g *= 2;
  return g;
}

// Offset of element i of position p from the start of p's group.
inline int64_t key_element_offset(int64_t group, int64_t p, int64_t i) { return i * group + (p & (group - 1)); }

// The stored keys of one KV head: rows[g] + kv_off starts the group of
// positions g .. g + group - 1, for each group start g a reader needs.
struct KeyView {
  const uint16_t* const* rows;
  int64_t kv_off;
  int64_t group;
  int64_t d;

  const uint16_t* group_start(int64_t p) const { return rows[p & ~(group - 1)] + kv_off; }
  uint16_t at(int64_t p, int64_t i) const { return group_start(p)[key_element_offset(group, p, i)]; }
};

// Positions p0 .. p0 + n - 1 of k as rows: out[j * k.d + i] = k.at(p0 + j, i).
void gather_key_rows(const KeyView& k, int64_t p0, int64_t n, uint16_t* out);

// The 16-position tile of k starting at t0 (a multiple of 16) as
// [d][16]: when k.group is 16 the stored group itself, else gathered into
// scratch (16 * d values). Lanes of positions outside [lo, hi) are
// unspecified (a stored group's other positions, or zeros): readers mask
// them. Groups wholly outside [lo, hi) are not read (a tile wholly outside
// is zeros in scratch).
const uint16_t* key_tile16(const KeyView& k, int64_t t0, int64_t lo, int64_t hi, uint16_t* scratch);

// Writes the keys of positions p0 .. p0 + n - 1, all of one group, into the
// group at group_start, converted from f32 (position p0 + r's d values at
// keys + r * key_stride).
void store_keys(uint16_t* group_start, int64_t group, int64_t p0, int64_t n, const float* keys, int64_t key_stride,
                int64_t d);

}  // namespace reprise
