#include "model/mamba.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "model/for_tokens.h"
#include "model/output_head.h"
#include "model/pass_segments.h"
#include "model/team_step.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/scratch_allocator.h"
#include "tensor/ssm_scan.h"
#include "util/error.h"

namespace reprise {
namespace {

// ------------------------------------------------------------ numerics

// ggml_compute_softplus_f32: the time step's softplus, as the scan computes it.
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// ------------------------------------------------------------ shared steps

// The most conv taps a file may declare (ssm.conv_kernel; 4 in the models
// seen): conv_silu keeps a pointer per tap on the stack.
constexpr int64_t kMaxConvTaps = 256;

// fn(block) for block in [0, n_blocks), in tasks of consecutive blocks of
// about kTaskWork units each (block_work per block, roughly operations):
// a decode step's small element-wise passes run inline or in a few tasks
// rather than as one task per block, each a claim on a line the other
// threads share (a step's SSM conv: 24 claims for ~1 us of work).
template <typename Fn>
void for_blocks(ThreadPool& pool, int64_t n_blocks, int64_t block_work, Fn&& fn) {
  constexpr int64_t kTaskWork = int64_t(1) << 15;
  const int64_t per_task = std::max<int64_t>(1, kTaskWork / std::max<int64_t>(1, block_work));
  const int64_t n_tasks = (n_blocks + per_task - 1) / per_task;
  pool.parallel_for(n_tasks, [&](int64_t task) {
    for (int64_t b = task * per_task; b < std::min(n_blocks, (task + 1) * per_task); ++b) fn(b);
  });
}

// Passes of at most this many rows scan on the calling thread (mamba1_mix).
constexpr int64_t kInlineScanRows = 2;

// Requests [p, p + bytes) into the cache ahead of its use (for writing too:
// the scans update their state in place).
void request_lines(const float* p, int64_t bytes, bool for_write) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) {
    if (for_write) __builtin_prefetch(c + off, 1);
    else __builtin_prefetch(c + off, 0);
  }
}

int64_t rows_of(std::span<const RecurrentRun> runs) { return runs.empty() ? 0 : runs.back().row0 + runs.back().n; }

// ggml_ssm_conv + bias + SiLU over `channels` channels for every run's rows.
// src: token-major inputs (row stride src_stride); w: the taps by tap
// ([j][channels], tap_major); each run's conv_state: the K-1 inputs before
// it, oldest first, by input ([i][channels], mamba.h), updated to its last
// K-1 inputs; dst: token-major (row stride dst_stride).
//
// Each output is ((0 + x[t-K+1] w[0]) + x[t-K+2] w[1]) + ... in fused
// multiply-adds, the order of ggml's row-wise sum, whatever the batch; then
// the bias, and SiLU as x / (1 + e^-x) with the kernels' vector exp (ggml's
// vector expf, as ggml's vectorized SiLU: silu_in_place). Vectors run
// across channels, reading every input in place; blocks of kBlock channels
// are independent (run in parallel, or split between a team's members),
// each run's tokens in order.
struct ConvPass {
  static constexpr int64_t kBlock = 64;
  const float* src;
  int64_t src_stride;
  int64_t channels;
  std::span<const RecurrentRun> runs;
  int64_t K;
  const float* w;
  const float* b;
  float* dst;
  int64_t dst_stride;

  int64_t n_blocks() const { return (channels + kBlock - 1) / kBlock; }
  // Block blk's outputs, then its channels' states advanced.
  void run_block(int64_t blk) const {
    outputs(blk);
    advance_states(blk);
  }
  // Block blk's outputs for every run's rows; reads the states only.
  void outputs(int64_t blk) const;
  // Each run's state of block blk's channels becomes its last K-1 inputs.
  void advance_states(int64_t blk) const;

 private:
  // Run r's input of channels from c0 at relative time tau (tau < 0:
  // before the run, from its state).
  const float* input(const RecurrentRun& run, int64_t c0, int64_t tau) const {
    return tau >= 0 ? src + (run.row0 + tau) * src_stride + c0 : run.conv_state + (K - 1 + tau) * channels + c0;
  }
};

void ConvPass::outputs(int64_t blk) const {
  const int64_t c0 = blk * kBlock, nc = std::min(channels, c0 + kBlock) - c0;
  const float* in[kMaxConvTaps];
  for (const RecurrentRun& run : runs) {
    for (int64_t t = 0; t < run.n; ++t) {
      float* out = dst + (run.row0 + t) * dst_stride + c0;
      for (int64_t j = 0; j < K; ++j) in[j] = input(run, c0, t + j - (K - 1));
      int64_t c = 0;
      for (; c + 8 <= nc; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < K; ++j)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(in[j] + c), _mm256_loadu_ps(w + j * channels + c0 + c), acc);
        _mm256_storeu_ps(out + c, _mm256_add_ps(acc, _mm256_loadu_ps(b + c0 + c)));
      }
      for (; c < nc; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc = std::fma(in[j][c], w[j * channels + c0 + c], acc);
        out[c] = acc + b[c0 + c];
      }
      silu_in_place(out, nc);
    }
  }
}

void ConvPass::advance_states(int64_t blk) const {
  const int64_t c0 = blk * kBlock, nc = std::min(channels, c0 + kBlock) - c0;
  // Row i takes the input at n + i - (K-1), from the prompt or from a later
  // row of the old state (n >= 1), so rows are overwritten in order.
  for (const RecurrentRun& run : runs)
    for (int64_t i = 0; i + 1 < K; ++i)
      std::memmove(run.conv_state + i * channels + c0, input(run, c0, run.n + i - (K - 1)), nc * sizeof(float));
}

void conv_silu(const ConvPass& conv, ThreadPool& pool) {
  for_blocks(pool, conv.n_blocks(), rows_of(conv.runs) * ConvPass::kBlock * (conv.K + 8),
             [&](int64_t blk) { conv.run_block(blk); });
}

// A team member's part of n_items independent items split evenly and
// always alike (no claims): each member's items, and the state they
// update, stay in its own cache from step to step.
struct MemberItems {
  int64_t begin, end;
};
MemberItems member_items(const DecodeTeam::Member& m, int64_t n_items) {
  return {n_items * m.index() / m.size(), n_items * (m.index() + 1) / m.size()};
}

// out[c] = silu(z[c]) * (y[c] + x[c] * D[c / d_channels]) for channels
// [c0, c1) of one row: the mixers' gate (the D skip, then SiLU of z), the
// same operations for every split of a row (silu_mul's elements do not
// depend on where they fall). `sum` is scratch of c1 - c0 floats.
void gate_channels(float* out, const float* y, const float* x, const float* z, const float* D, int64_t d_channels,
                   int64_t c0, int64_t c1, float* sum) {
  if (d_channels == 1) {
    for (int64_t c = c0; c < c1; ++c) sum[c - c0] = std::fma(x[c], D[c], y[c]);
  } else {
    for (int64_t c = c0; c < c1;) {
      const float d = D[c / d_channels];
      for (const int64_t end = std::min(c1, (c / d_channels + 1) * d_channels); c < end; ++c)
        sum[c - c0] = std::fma(x[c], d, y[c]);
    }
  }
  std::memcpy(out + c0, z + c0, (c1 - c0) * sizeof(float));
  silu_mul(out + c0, sum, c1 - c0);
}

// A conv's taps as stored ([channel][j], ggml's {K, channels}) by tap
// ([j][channel]), as conv_silu reads them.
std::vector<float> tap_major(const std::vector<float>& per_channel, int64_t K, int64_t channels) {
  std::vector<float> out(per_channel.size());
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t j = 0; j < K; ++j) out[j * channels + c] = per_channel[c * K + j];
  return out;
}

}  // namespace

// ------------------------------------------------------------ Mamba-1 mixer

bool is_mamba_arch(const std::string& arch) { return arch == "mamba" || arch == "mamba2"; }

namespace {

int64_t require_positive(const gguf::File& file, const std::string& key, int64_t max) {
  const int64_t v = file.require_int(key);
  if (v <= 0 || v > max)
    file.fail("metadata " + key + " = " + std::to_string(v) + " is out of range (1.." +
              std::to_string(max) + ")");
  return v;
}

}  // namespace

Mamba1Dims read_mamba1_dims(const gguf::File& file, const std::string& arch, int64_t n_embd) {
  Mamba1Dims d;
  const std::string p = arch + ".ssm.";
  d.n_embd = n_embd;
  d.d_conv = require_positive(file, p + "conv_kernel", kMaxConvTaps);
  d.d_inner = require_positive(file, p + "inner_size", int64_t(1) << 20);
  d.d_state = require_positive(file, p + "state_size", 4096);
  d.dt_rank = require_positive(file, p + "time_step_rank", int64_t(1) << 20);
  if (d.dt_rank > d.d_inner)
    file.fail(p + "time_step_rank (" + std::to_string(d.dt_rank) + ") exceeds " + p + "inner_size (" +
              std::to_string(d.d_inner) + ")");
  d.eps = static_cast<float>(
      file.get_float(arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  d.dt_b_c_rms = file.get_bool(p + "dt_b_c_rms").value_or(false);
  return d;
}

namespace {

// A per channel ([c][k], as stored) to the scan's layout (mamba.h).
std::vector<float> by_scan_blocks(const std::vector<float>& per_channel, int64_t channels, int64_t d_state) {
  std::vector<float> out(per_channel.size());
  for (int64_t c0 = 0; c0 < channels; c0 += kernels::kScanBlock) {
    const int64_t nc = std::min(kernels::kScanBlock, channels - c0);
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t k = 0; k < d_state; ++k) out[c0 * d_state + k * nc + c] = per_channel[(c0 + c) * d_state + k];
  }
  return out;
}

}  // namespace

Mamba1Layer load_mamba1_layer(const WeightLoader& w, int64_t il, const Mamba1Dims& d,
                              bool with_bc_norms) {
  const std::string p = "blk." + std::to_string(il) + ".";
  Mamba1Layer L;
  L.in = PackedMatrix(w.matrix(p + "ssm_in.weight", d.n_embd, 2 * d.d_inner));
  L.conv_w = tap_major(w.dense(p + "ssm_conv1d.weight", {d.d_conv, d.d_inner}), d.d_conv, d.d_inner);
  L.conv_b = w.vector(p + "ssm_conv1d.bias", d.d_inner);
  L.x_proj = PackedMatrix(w.matrix(p + "ssm_x.weight", d.d_inner, d.dt_rank + 2 * d.d_state));
  L.dt_proj = PackedMatrix(w.matrix(p + "ssm_dt.weight", d.dt_rank, d.d_inner));
  L.dt_b = w.vector(p + "ssm_dt.bias", d.d_inner);
  L.A = by_scan_blocks(w.dense(p + "ssm_a", {d.d_state, d.d_inner}), d.d_inner, d.d_state);
  L.D = w.vector(p + "ssm_d", d.d_inner);
  L.out = PackedMatrix(w.matrix(p + "ssm_out.weight", d.d_inner, d.n_embd));
  if (with_bc_norms) {
    L.dt_norm = w.vector(p + "ssm_dt_norm.weight", d.dt_rank);
    L.b_norm = w.vector(p + "ssm_b_norm.weight", d.d_state);
    L.c_norm = w.vector(p + "ssm_c_norm.weight", d.d_state);
  }
  return L;
}

std::vector<RecurrentRun> recurrent_runs(std::span<const PassSegment> segments, int layer,
                                         const LayerStateSpec& spec) {
  std::vector<RecurrentRun> runs(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    SequenceMemory& memory = *segments[i].memory;
    runs[i] = {segments[i].row0, static_cast<int64_t>(segments[i].batch.tokens.size()), memory.conv_state(layer),
               memory.ssm_state(layer)};
    if (!runs[i].ssm_state || (!runs[i].conv_state && spec.conv_state_floats > 0))
      throw Error("sequence memory provides no recurrent state for layer " + std::to_string(layer));
  }
  return runs;
}

namespace {
// A mixer's scratch, once per pool (ThreadPool::caller_local): fresh
// vectors per layer were mapped and faulted in anew on every prompt chunk.
// Every element is written before it is read; large ones are huge pages
// (scratch_allocator.h). (A team step's shared buffers are
// Mamba1TeamBuffers and Mamba2TeamBuffers.)
struct Mamba1Scratch {
  ScratchVector<float> xz, xc, xdb, dt, y, dt_low;
};
struct Mamba2Scratch {
  ScratchVector<float> zxbcdt, xbc, y;
};
// What a Mamba-2 mixer's decode team shares between its members (the
// products' outputs, the scan's y, the gated rows), as Mamba1TeamBuffers.
struct Mamba2TeamBuffers {
  std::vector<float> zxbcdt, y, gated;
};
struct MambaPassScratch {
  ScratchVector<float> x, h, mix;
};

// Mamba-1's selective scan (kernels::mamba1_scan) over blocks of
// kernels::kScanBlock channels, each run's tokens in order within a block.
struct Mamba1ScanPass {
  const Mamba1Layer& L;
  const Mamba1Dims& d;
  const float* dt;  // rows of d_inner
  const float* xc;  // rows of d_inner
  float* y;         // rows of d_inner
  const float* bc;  // each row's B then C
  int64_t bc_stride;
  std::span<const RecurrentRun> runs;

  int64_t n_blocks() const { return (d.d_inner + kernels::kScanBlock - 1) / kernels::kScanBlock; }
  void run_block(int64_t blk) const {
    const int64_t di = d.d_inner, ds = d.d_state;
    const int64_t c0 = blk * kernels::kScanBlock, c1 = std::min(di, c0 + kernels::kScanBlock);
    for (const RecurrentRun& run : runs) {
      kernels::Mamba1Scan s;
      s.n_tokens = run.n;
      s.channels = c1 - c0;
      s.d_state = ds;
      s.dt = dt + run.row0 * di + c0;
      s.x = xc + run.row0 * di + c0;
      s.y = y + run.row0 * di + c0;
      s.row_stride = di;
      s.bc = bc + run.row0 * bc_stride;
      s.bc_stride = bc_stride;
      s.A = L.A.data() + c0 * ds;
      s.state = run.ssm_state + c0 * ds;
      kernels::mamba1_scan(s);
    }
  }
  // Blocks [b0, b1) on this thread, requesting the next block's state and
  // A while it scans one. In a decode step they come from memory (the
  // weights streamed since evicted them), a block too short for the
  // hardware prefetcher.
  void run_blocks_requesting(int64_t b0, int64_t b1) const {
    const int64_t di = d.d_inner, ds = d.d_state;
    constexpr int64_t kBlock = kernels::kScanBlock;
    for (int64_t blk = b0; blk < b1; ++blk) {
      if (blk + 1 < b1) {
        const int64_t next = (blk + 1) * kBlock * ds;
        const int64_t bytes = std::min(kBlock, di - (blk + 1) * kBlock) * ds * int64_t(sizeof(float));
        for (const RecurrentRun& run : runs) request_lines(run.ssm_state + next, bytes, true);
        request_lines(L.A.data() + next, bytes, false);
      }
      run_block(blk);
    }
  }
};

// RMS norms on a Mamba-1 x_db row's dt, B and C where the model has them.
void norm_dt_b_c(const Mamba1Layer& L, const Mamba1Dims& d, float* row) {
  const bool weighted = !L.dt_norm.empty();
  if (!weighted && !d.dt_b_c_rms) return;
  const int64_t R = d.dt_rank, ds = d.d_state;
  rms_norm(row, weighted ? L.dt_norm.data() : nullptr, d.eps, R, row);
  rms_norm(row + R, weighted ? L.b_norm.data() : nullptr, d.eps, ds, row + R);
  rms_norm(row + R + ds, weighted ? L.c_norm.data() : nullptr, d.eps, ds, row + R + ds);
}

// Channels [c0, c1) of row t: dt += its bias.
void add_dt_bias(const Mamba1Layer& L, int64_t di, float* dt, int64_t t, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) dt[t * di + c] += L.dt_b[c];
}
}  // namespace

void mamba1_mix(const Mamba1Layer& L, const Mamba1Dims& d, const float* in, std::span<const RecurrentRun> runs,
                float* out, ThreadPool& pool, int64_t out_first) {
  const int64_t n = rows_of(runs);
  const int64_t di = d.d_inner, R = d.dt_rank, n_xdb = R + 2 * d.d_state;
  auto& [xz, xc, xdb, dt, y, dt_low] = pool.caller_local<Mamba1Scratch>();
  xz.resize(n * 2 * di);
  xc.resize(n * di);
  xdb.resize(n * n_xdb);
  dt.resize(n * di);
  y.resize(n * di);

  // {n_embd} -> x (first d_inner) and z (gate, second d_inner) per token.
  matmul(L.in, in, n, xz.data(), pool);
  conv_silu({xz.data(), 2 * di, di, runs, d.d_conv, L.conv_w.data(), L.conv_b.data(), xc.data(), di}, pool);

  // x -> dt (dt_rank), B (d_state), C (d_state).
  matmul(L.x_proj, xc.data(), n, xdb.data(), pool);
  dt_low.resize(n * R);
  for_tokens(n, pool, [&](int64_t t) {
    float* row = xdb.data() + t * n_xdb;
    norm_dt_b_c(L, d, row);
    // The dt rows are the first R of each x_db row: gathered contiguous.
    std::memcpy(dt_low.data() + t * R, row, R * sizeof(float));
  });
  matmul(L.dt_proj, dt_low.data(), n, dt.data(), pool);
  for_tokens(n, pool, [&](int64_t t) { add_dt_bias(L, di, dt.data(), t, 0, di); });

  const Mamba1ScanPass scan{L, d, dt.data(), xc.data(), y.data(), xdb.data() + R, n_xdb, runs};
  // A decode step scans on the calling thread: split across the pool, each
  // block's state also moved between the threads' caches from step to
  // step (tasks are claimed, not dealt): 1.6x slower than one thread. (A
  // team splits them evenly, always alike: mamba1_team_mix.)
  if (n <= kInlineScanRows)
    scan.run_blocks_requesting(0, scan.n_blocks());
  else
    for_blocks(pool, scan.n_blocks(), n * kernels::kScanBlock * d.d_state * 24,
               [&](int64_t blk) { scan.run_block(blk); });
  // y = (y + x * D) * silu(z), row by row.
  pool.parallel_for(n - out_first, [&](int64_t r) {
    const int64_t t = out_first + r;
    thread_local std::vector<float> sum;
    sum.resize(di);
    gate_channels(y.data() + t * di, y.data() + t * di, xc.data() + t * di, xz.data() + t * 2 * di + di, L.D.data(), 1,
                  0, di, sum.data());
  });
  if (out_first < n) matmul(L.out, y.data() + out_first * di, n - out_first, out + out_first * d.n_embd, pool);
}

void Mamba1TeamBuffers::size_for_team(const Mamba1Dims& d, int64_t n) {
  xz.resize(n * 2 * d.d_inner);
  xdb.resize(n * (d.dt_rank + 2 * d.d_state));
  dt.resize(n * d.d_inner);
  y.resize(n * d.d_inner);
}

// The team's scan and gate are split by channel blocks, evenly and always
// alike, so a member's SSM state stays in its cache. Each member computes
// the whole conv into its own buffer (a few microseconds of work, where a
// barrier and reading the other member's half from the other vCPU's cache
// cost as much), and advances its blocks' conv states after the x_proj
// barrier, once no member reads them.
void mamba1_team_mix(const Mamba1Layer& L, const Mamba1Dims& d, const float* in, std::span<const RecurrentRun> runs,
                     float* out, Mamba1TeamBuffers& shared, DecodeTeam::Member& m, TeamStepPlan& plan, int& product) {
  const int64_t n = rows_of(runs);
  const int64_t di = d.d_inner, R = d.dt_rank, n_xdb = R + 2 * d.d_state;
  std::vector<float>&xz = shared.xz, &xdb = shared.xdb, &dt = shared.dt, &y = shared.y;
  const MatmulOutput in_proj[] = {{&L.in, xz.data()}};
  team_matmul_many(in_proj, in, m, plan, product++);

  thread_local std::vector<float> xc, own_xdb, dt_low, sum;
  xc.resize(n * di);
  const ConvPass conv{xz.data(), 2 * di, di, runs, d.d_conv, L.conv_w.data(), L.conv_b.data(), xc.data(), di};
  for (int64_t blk = 0; blk < conv.n_blocks(); ++blk) conv.outputs(blk);

  const MatmulOutput x_proj[] = {{&L.x_proj, xdb.data()}};
  team_matmul_many(x_proj, xc.data(), m, plan, product++);
  const MemberItems conv_blocks = member_items(m, conv.n_blocks());
  for (int64_t blk = conv_blocks.begin; blk < conv_blocks.end; ++blk) conv.advance_states(blk);
  // Each member norms its own copy of every row (the shared rows stay as
  // the product left them).
  own_xdb.assign(xdb.begin(), xdb.begin() + n * n_xdb);
  dt_low.resize(n * R);
  for (int64_t t = 0; t < n; ++t) {
    norm_dt_b_c(L, d, own_xdb.data() + t * n_xdb);
    std::memcpy(dt_low.data() + t * R, own_xdb.data() + t * n_xdb, R * sizeof(float));
  }
  const MatmulOutput dt_proj[] = {{&L.dt_proj, dt.data()}};
  team_matmul_many(dt_proj, dt_low.data(), m, plan, product++);

  const Mamba1ScanPass scan{L, d, dt.data(), xc.data(), y.data(), own_xdb.data() + R, n_xdb, runs};
  const MemberItems blocks = member_items(m, scan.n_blocks());
  const int64_t c0 = blocks.begin * kernels::kScanBlock, c1 = std::min(di, blocks.end * kernels::kScanBlock);
  for (int64_t t = 0; t < n; ++t) add_dt_bias(L, di, dt.data(), t, c0, c1);
  scan.run_blocks_requesting(blocks.begin, blocks.end);
  sum.resize(di);
  for (int64_t t = 0; t < n; ++t)
    gate_channels(y.data() + t * di, y.data() + t * di, xc.data() + t * di, xz.data() + t * 2 * di + di, L.D.data(), 1,
                  c0, c1, sum.data());
  team_barrier(m, plan);

  const MatmulOutput out_proj[] = {{&L.out, out}};
  team_matmul_many(out_proj, y.data(), m, plan, product++);
}

// ------------------------------------------------------------ models

namespace {

struct Mamba2Layer {
  PackedMatrix in, out;
  std::vector<float> conv_w, conv_b, dt_b, A, D, norm;
};

class Mamba final : public SegmentedModel {
 public:
  explicit Mamba(const gguf::File& file);
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return spec_; }

 private:
  void mamba2_mix(const Mamba2Layer& L, const float* in, std::span<const RecurrentRun> runs, float* out,
                  ThreadPool& pool, int64_t out_first) const;
  // mamba2_mix for a decode step run by a team, member m's part (as
  // mamba1_team_mix): heads split evenly and always alike. Same bits.
  void mamba2_team_mix(const Mamba2Layer& L, const float* in, std::span<const RecurrentRun> runs, float* out,
                       Mamba2TeamBuffers& shared, DecodeTeam::Member& m, TeamStepPlan& plan, int& product) const;
  // Head h's scan over every run (its time steps from the dt column first).
  void mamba2_scan_head(const Mamba2Layer& L, int64_t h, const float* zxbcdt, const float* xbc, float* y,
                        std::span<const RecurrentRun> runs) const;
  // The grouped RMS norm of one gated row.
  void mamba2_norm_row(const Mamba2Layer& L, const float* gated, float* out) const;
  void run(std::span<const PassSegment> segments, ThreadPool& pool) override;
  // A decode step (decode_team_may_run) by every thread of the pool inside
  // one dispatch (tensor/decode_team.h): the same operations as run, the
  // same bits, without a dispatch per product and pass.
  bool team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const;
  void run_team_step(std::span<const PassSegment> segments, ThreadPool& pool);

  bool v2_ = false;
  ModelInfo info_;
  StateSpec spec_;
  Mamba1Dims d_;  // Mamba-2 uses n_embd, d_inner, d_state, d_conv, eps
  int64_t n_head_ = 0, n_group_ = 0, head_dim_ = 0;
  MatrixView token_embd_;  // row lookups
  PackedMatrix output_;
  std::vector<float> output_norm_;
  std::vector<std::vector<float>> attn_norm_;
  std::vector<Mamba1Layer> layers1_;
  std::vector<Mamba2Layer> layers2_;
};

Mamba::Mamba(const gguf::File& file) {
  const std::string arch = file.require_string("general.architecture");
  if (!is_mamba_arch(arch)) file.fail("not a mamba architecture: '" + arch + "'");
  v2_ = arch == "mamba2";
  const int64_t n_embd = require_positive(file, arch + ".embedding_length", int64_t(1) << 20);
  const int64_t n_layer = require_positive(file, arch + ".block_count", 1024);
  d_ = read_mamba1_dims(file, arch, n_embd);
  if (v2_) {
    // Mamba-2 stores its head count as time_step_rank.
    n_head_ = d_.dt_rank;
    n_group_ = require_positive(file, arch + ".ssm.group_count", d_.d_inner);
    if (d_.d_inner % n_head_ != 0)
      file.fail(arch + ".ssm.inner_size (" + std::to_string(d_.d_inner) +
                ") is not a multiple of the head count (ssm.time_step_rank = " + std::to_string(n_head_) + ")");
    if (n_head_ % n_group_ != 0)
      file.fail("head count (" + std::to_string(n_head_) + ") is not a multiple of " + arch +
                ".ssm.group_count (" + std::to_string(n_group_) + ")");
    head_dim_ = d_.d_inner / n_head_;
  }

  auto fingerprint = fingerprint_weights_async(
      file, "mamba/v1/" + arch + "/" + std::to_string(n_embd) + "/" + std::to_string(n_layer) + "/" +
                std::to_string(d_.d_inner) + "/" + std::to_string(d_.d_state) + "/" + std::to_string(d_.d_conv) +
                "/" + std::to_string(d_.dt_rank) + "/" + std::to_string(n_group_) + "/" + std::to_string(d_.eps) +
                "/" + std::to_string(d_.dt_b_c_rms));

  WeightLoader w(file);
  const int64_t n_vocab = load_embedding_and_head(w, n_embd, token_embd_, output_, output_norm_);

  const int64_t di = d_.d_inner, ds = d_.d_state;
  const int64_t conv_ch = v2_ ? di + 2 * n_group_ * ds : di;
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    attn_norm_.push_back(w.vector(p + "attn_norm.weight", n_embd));
    if (v2_) {
      Mamba2Layer L;
      L.in = PackedMatrix(w.matrix(p + "ssm_in.weight", n_embd, 2 * di + 2 * n_group_ * ds + n_head_));
      L.conv_w = tap_major(w.dense(p + "ssm_conv1d.weight", {d_.d_conv, conv_ch}), d_.d_conv, conv_ch);
      L.conv_b = w.vector(p + "ssm_conv1d.bias", conv_ch);
      L.dt_b = w.vector(p + "ssm_dt.bias", n_head_);
      L.A = w.dense(p + "ssm_a", {1, n_head_});
      L.D = w.dense(p + "ssm_d", {1, n_head_});
      L.norm = w.dense(p + "ssm_norm.weight", {di / n_group_, n_group_});
      L.out = PackedMatrix(w.matrix(p + "ssm_out.weight", di, n_embd));
      layers2_.push_back(std::move(L));
    } else {
      layers1_.push_back(load_mamba1_layer(w, il, d_, false));
    }
    LayerStateSpec s;
    s.kind = LayerStateKind::Recurrent;
    s.conv_state_floats = (d_.d_conv - 1) * conv_ch;
    s.ssm_state_floats = ds * di;
    spec_.layers.push_back(s);
  }

  info_.arch = arch;
  info_.name = file.get_string("general.name").value_or("");
  info_.n_vocab = n_vocab;
  info_.n_ctx_train = file.get_int(arch + ".context_length").value_or(1048576);
  info_.n_embd = n_embd;
  info_.n_layer = n_layer;
  for (const auto& t : file.tensors()) {
    info_.n_params += static_cast<int64_t>(t.n_elements());
    info_.weight_bytes += t.n_bytes;
  }
  w.refuse_unknown_tensors();
  info_.fingerprint = fingerprint.get();
}

void Mamba::mamba2_scan_head(const Mamba2Layer& L, int64_t h, const float* zxbcdt, const float* xbc, float* y,
                             std::span<const RecurrentRun> runs) const {
  const int64_t n = rows_of(runs);
  const int64_t di = d_.d_inner, ds = d_.d_state, ng = n_group_, hd = head_dim_;
  const int64_t conv_ch = di + 2 * ng * ds, n_proj = 2 * di + 2 * ng * ds + n_head_;
  const int64_t g = h / (n_head_ / ng), c0 = h * hd;
  thread_local std::vector<float> sp, dA;
  sp.resize(n);
  dA.resize(n);
  for (int64_t t = 0; t < n; ++t) {
    sp[t] = softplus(zxbcdt[t * n_proj + 2 * di + 2 * ng * ds + h] + L.dt_b[h]);
    dA[t] = std::exp(sp[t] * L.A[h]);
  }
  for (const RecurrentRun& run : runs) {
    kernels::Mamba2Scan s;
    s.n_tokens = run.n;
    s.channels = hd;
    s.d_state = ds;
    s.sp = sp.data() + run.row0;
    s.dA = dA.data() + run.row0;
    s.x = xbc + run.row0 * conv_ch + c0;
    s.x_stride = conv_ch;
    s.y = y + run.row0 * di + c0;
    s.y_stride = di;
    s.b = xbc + run.row0 * conv_ch + di + g * ds;
    s.c = xbc + run.row0 * conv_ch + di + ng * ds + g * ds;
    s.bc_stride = conv_ch;
    s.state = run.ssm_state + c0 * ds;
    kernels::mamba2_scan(s);
  }
}

void Mamba::mamba2_norm_row(const Mamba2Layer& L, const float* gated, float* out) const {
  const int64_t gs = d_.d_inner / n_group_;
  for (int64_t gi = 0; gi < n_group_; ++gi)
    rms_norm(gated + gi * gs, L.norm.data() + gi * gs, d_.eps, gs, out + gi * gs);
}

void Mamba::mamba2_mix(const Mamba2Layer& L, const float* in, std::span<const RecurrentRun> runs, float* out,
                       ThreadPool& pool, int64_t out_first) const {
  const int64_t n = rows_of(runs);
  const int64_t di = d_.d_inner, ds = d_.d_state, ng = n_group_, nh = n_head_, hd = head_dim_;
  const int64_t conv_ch = di + 2 * ng * ds;
  const int64_t n_proj = 2 * di + 2 * ng * ds + nh;  // z | x B C | dt
  Mamba2Scratch& scratch = pool.caller_local<Mamba2Scratch>();
  ScratchVector<float>&zxbcdt = scratch.zxbcdt, &xbc = scratch.xbc, &y = scratch.y;
  zxbcdt.resize(n * n_proj);
  xbc.resize(n * conv_ch);
  y.resize(n * di);

  matmul(L.in, in, n, zxbcdt.data(), pool);
  conv_silu({zxbcdt.data() + di, n_proj, conv_ch, runs, d_.d_conv, L.conv_w.data(), L.conv_b.data(), xbc.data(),
             conv_ch},
            pool);

  // Scan (kernels::mamba2_scan): heads in parallel (for_blocks' tasks),
  // each run's tokens in order within a head.
  for_blocks(pool, nh, n * hd * ds * 4,
             [&](int64_t h) { mamba2_scan_head(L, h, zxbcdt.data(), xbc.data(), y.data(), runs); });
  // y = (y + x * D) * silu(z), then the grouped RMS norm over d_inner / n_group.
  pool.parallel_for(n - out_first, [&](int64_t r) {
    const int64_t t = out_first + r;
    thread_local std::vector<float> g, sum;
    g.resize(di);
    sum.resize(di);
    gate_channels(g.data(), y.data() + t * di, xbc.data() + t * conv_ch, zxbcdt.data() + t * n_proj, L.D.data(), hd, 0,
                  di, sum.data());
    mamba2_norm_row(L, g.data(), y.data() + t * di);
  });
  if (out_first < n) matmul(L.out, y.data() + out_first * di, n - out_first, out + out_first * d_.n_embd, pool);
}

void Mamba::mamba2_team_mix(const Mamba2Layer& L, const float* in, std::span<const RecurrentRun> runs, float* out,
                            Mamba2TeamBuffers& shared, DecodeTeam::Member& m, TeamStepPlan& plan,
                            int& product) const {
  const int64_t n = rows_of(runs);
  const int64_t di = d_.d_inner, ds = d_.d_state, ng = n_group_, hd = head_dim_;
  const int64_t conv_ch = di + 2 * ng * ds, n_proj = 2 * di + 2 * ng * ds + n_head_;
  std::vector<float>&zxbcdt = shared.zxbcdt, &y = shared.y, &gated = shared.gated;
  const MatmulOutput in_proj[] = {{&L.in, zxbcdt.data()}};
  team_matmul_many(in_proj, in, m, plan, product++);

  // The conv outputs the member's heads read (their x, and every group's
  // B and C) into its own buffer, as mamba1_team_mix computes its conv;
  // the states advance after the scan's barrier.
  const MemberItems heads = member_items(m, n_head_);
  thread_local std::vector<float> xbc, sum, normed;
  xbc.resize(n * conv_ch);
  const ConvPass conv{zxbcdt.data() + di, n_proj, conv_ch, runs, d_.d_conv, L.conv_w.data(), L.conv_b.data(),
                      xbc.data(), conv_ch};
  const int64_t x_begin = heads.begin * hd / ConvPass::kBlock;
  const int64_t x_end = (heads.end * hd + ConvPass::kBlock - 1) / ConvPass::kBlock;
  for (int64_t blk = x_begin; blk < x_end; ++blk) conv.outputs(blk);
  for (int64_t blk = std::max(x_end, di / ConvPass::kBlock); blk < conv.n_blocks(); ++blk) conv.outputs(blk);

  // The member's heads: scanned, then gated (the grouped norm needs every
  // head of a group: after the barrier).
  for (int64_t h = heads.begin; h < heads.end; ++h) mamba2_scan_head(L, h, zxbcdt.data(), xbc.data(), y.data(), runs);
  sum.resize(di);
  for (int64_t t = 0; t < n; ++t)
    gate_channels(gated.data() + t * di, y.data() + t * di, xbc.data() + t * conv_ch, zxbcdt.data() + t * n_proj,
                  L.D.data(), hd, heads.begin * hd, heads.end * hd, sum.data());
  team_barrier(m, plan);
  const MemberItems conv_blocks = member_items(m, conv.n_blocks());
  for (int64_t blk = conv_blocks.begin; blk < conv_blocks.end; ++blk) conv.advance_states(blk);
  normed.resize(n * di);
  for (int64_t t = 0; t < n; ++t) mamba2_norm_row(L, gated.data() + t * di, normed.data() + t * di);
  const MatmulOutput out_proj[] = {{&L.out, out}};
  team_matmul_many(out_proj, normed.data(), m, plan, product++);
}

bool Mamba::team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const {
  if (!decode_team_may_run(segments, pool)) return false;
  return pool.caller_local<TeamStepState>().ready();
}

void Mamba::run_team_step(std::span<const PassSegment> segments, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(segments.size());  // one token (row) per sequence
  const int64_t n_embd = d_.n_embd, n_vocab = info_.n_vocab;
  const int n_layer = static_cast<int>(info_.n_layer);
  std::vector<std::vector<RecurrentRun>> runs(n_layer);
  for (int il = 0; il < n_layer; ++il) runs[il] = recurrent_runs(segments, il, spec_.layers[il]);

  TeamStepState& st = pool.caller_local<TeamStepState>();
  st.firsts.clear();
  for (const Mamba1Layer& L : layers1_) st.firsts.insert(st.firsts.end(), {&L.in, &L.x_proj, &L.dt_proj, &L.out});
  for (const Mamba2Layer& L : layers2_) st.firsts.insert(st.firsts.end(), {&L.in, &L.out});
  st.firsts.push_back(&output_);
  std::vector<float>& logits = st.begin(segments, n_vocab, pool);

  // The products' outputs, which every member reads.
  Mamba1TeamBuffers& shared1 = pool.caller_local<Mamba1TeamBuffers>();
  Mamba2TeamBuffers& shared2 = pool.caller_local<Mamba2TeamBuffers>();
  const int64_t di = d_.d_inner;
  if (v2_) {
    const int64_t ng = n_group_, ds = d_.d_state;
    shared2.zxbcdt.resize(n * (2 * di + 2 * ng * ds + n_head_));
    shared2.y.resize(n * di);
    shared2.gated.resize(n * di);
  } else {
    shared1.size_for_team(d_, n);
  }
  ScratchVector<float>& mix = pool.caller_local<MambaPassScratch>().mix;
  mix.resize(n * n_embd);

  st.team->run([&](DecodeTeam::Member& m) {
    // This member's residual stream and norms: every member computes them
    // all (the same bits), so reading them needs no barrier.
    thread_local std::vector<float> x, h;
    x.resize(n * n_embd);
    h.resize(n * n_embd);
    for (int64_t r = 0; r < n; ++r) dequantize_row(token_embd_, segments[r].batch.tokens[0], x.data() + r * n_embd);
    int product = 0;
    for (int il = 0; il < n_layer; ++il) {
      for (int64_t t = 0; t < n; ++t)
        rms_norm(x.data() + t * n_embd, attn_norm_[il].data(), d_.eps, n_embd, h.data() + t * n_embd);
      if (v2_)
        mamba2_team_mix(layers2_[il], h.data(), runs[il], mix.data(), shared2, m, st.plan, product);
      else
        mamba1_team_mix(layers1_[il], d_, h.data(), runs[il], mix.data(), shared1, m, st.plan, product);
      for (int64_t i = 0; i < n * n_embd; ++i) x[i] += mix[i];
    }
    for (int64_t t = 0; t < n; ++t)
      rms_norm(x.data() + t * n_embd, output_norm_.data(), d_.eps, n_embd, h.data() + t * n_embd);
    const MatmulOutput out[] = {{&output_, logits.data()}};
    team_matmul_many(out, h.data(), m, st.plan, product++);
  });
  st.end(segments, n_vocab, pool);
}

void Mamba::run(std::span<const PassSegment> segments, ThreadPool& pool) {
  if (team_step_takes(segments, pool)) return run_team_step(segments, pool);
  const int64_t n = pass_rows(segments);
  const int64_t n_embd = d_.n_embd;

  auto& [x, h, mix] = pool.caller_local<MambaPassScratch>();
  x.resize(n * n_embd);
  h.resize(n * n_embd);
  mix.resize(n * n_embd);
  for (const PassSegment& seg : segments)
    for (size_t i = 0; i < seg.batch.tokens.size(); ++i) {
      const int32_t tok = seg.batch.tokens[i];
      dequantize_row(token_embd_, tok, x.data() + (seg.row0 + static_cast<int64_t>(i)) * n_embd);
    }

  const int n_layer = static_cast<int>(info_.n_layer);
  // Every layer's state is looked up before any advances: a pass that fails
  // leaves all of it as it was.
  std::vector<std::vector<RecurrentRun>> runs(n_layer);
  for (int il = 0; il < n_layer; ++il) runs[il] = recurrent_runs(segments, il, spec_.layers[il]);
  for (int il = 0; il < n_layer; ++il) {
    for_tokens(n, pool, [&](int64_t t) {
      rms_norm(x.data() + t * n_embd, attn_norm_[il].data(), d_.eps, n_embd, h.data() + t * n_embd);
    });
    const int64_t r0 = il + 1 == n_layer ? last_layer_first_row(segments) : 0;
    if (v2_)
      mamba2_mix(layers2_[il], h.data(), runs[il], mix.data(), pool, r0);
    else
      mamba1_mix(layers1_[il], d_, h.data(), runs[il], mix.data(), pool, r0);
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      for (int64_t i = t * n_embd; i < (t + 1) * n_embd; ++i) x[i] += mix[i];
    });
  }

  output_logits(x.data(), segments, n_embd, output_norm_, d_.eps, output_, info_.n_vocab, h.data(), pool);
}

}  // namespace

std::unique_ptr<Model> load_mamba(const gguf::File& file) { return std::make_unique<Mamba>(file); }

}  // namespace reprise
