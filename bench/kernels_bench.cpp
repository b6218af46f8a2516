// Google Benchmark micro-benchmarks for the CPU kernels (kernels.h) and the
// thread pool. Shapes are those of the 60M llama (dim 512, ff 1536, head dim
// 64, vocab 32000). REPRISE_ISA=avx2 benchmarks the baseline kernels.
//
//   build-perf/kernels_bench --benchmark_filter=Matmul
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/kernels_impl.h"
#include "tensor/read_probe.h"
#include "tensor/key_layout.h"
#include "tensor/quantize.h"
#include "tensor/ssm_scan.h"

using namespace reprise;

namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

Weights make_weights(DType t, int64_t n_in, int64_t n_out) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  Weights w;
  const size_t rb = dtype_row_bytes(t, n_in);
  w.bytes.resize(rb * n_out);
  std::vector<float> row(n_in);
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : row) v = dist(rng);
    quantize_row(t, row.data(), w.bytes.data() + r * rb, n_in);
  }
  w.view = MatrixView{t, w.bytes.data(), n_in, n_out, rb};
  return w;
}

std::vector<float> make_x(int64_t n) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

// New types go at the end: benchmark names carry the index.
const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,  DType::Q4_1, DType::Q5_0,
                        DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q3_K, DType::IQ4_NL,
                        DType::IQ4_XS, DType::Q2_K};
constexpr int kFirstNewType = 5;  // the types below carry only a few shapes

// Args: dtype index, n_in, n_out, n_tokens, threads.
void BM_Matmul(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t n_in = state.range(1), n_out = state.range(2), n_tokens = state.range(3);
  ThreadPool pool(static_cast<int>(state.range(4)));
  Weights w = make_weights(t, n_in, n_out);
  PackedMatrix pm(w.view);
  std::vector<float> x = make_x(n_in * n_tokens), y(n_out * n_tokens);
  for (auto _ : state) {
    matmul(pm, x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)) + " " + kernel_isa_name(kernel_isa()));
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n_in * n_out * n_tokens, benchmark::Counter::kIsIterationInvariantRate,
                                                benchmark::Counter::kIs1000);
  state.counters["weight_GBps"] =
      benchmark::Counter(static_cast<double>(pm.packed_bytes()), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void MatmulArgs(benchmark::internal::Benchmark* b) {
  for (int t = 0; t < 5; ++t) {
    for (int threads : {1, 2}) {
      b->Args({t, 512, 1536, 1, threads});      // decode, gate/up shape
      b->Args({t, 512, 32000, 1, threads});     // decode, output projection
      b->Args({t, 512, 1536, 2, threads});      // two sequences decoding in one pass
      b->Args({t, 512, 1536, 4, threads});      // four
      b->Args({t, 512, 512, 512, threads});     // prefill, attention projection
      b->Args({t, 1536, 512, 512, threads});    // prefill, FFN down
      b->Args({t, 1536, 16, 512, threads});     // prefill, few rows: converting the activations dominates
    }
  }
  for (int t = kFirstNewType; t < static_cast<int>(std::size(kTypes)); ++t) {
    b->Args({t, 512, 1536, 1, 2});
    b->Args({t, 512, 32000, 1, 2});
    b->Args({t, 1536, 512, 512, 2});
    // One thread: what scripts/ab_kernels.py can compare (two builds at once).
    b->Args({t, 512, 1536, 1, 1});
    b->Args({t, 1536, 512, 512, 1});
  }
  // Small batches (several sequences decoding together) against 72-144 MB of
  // weights, which they read from memory once per call, as decode does.
  for (int t : {1, 3})
    for (int n_tokens : {1, 2, 4, 8}) b->Args({t, 4096, 16384, n_tokens, 2});
  // One thread's decode from L3 (4096 x 4096: 9-19 MB) and from memory, for
  // Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K: against BM_ReadPacked, how far
  // each type's kernel is from reading its bytes.
  for (int t : {3, 4, 8, 9, 10, 11, 14})
    for (int n_out : {4096, 16384}) b->Args({t, 4096, n_out, 1, 1});
  // Decode from memory for the 2-6-bit types (Q4_0, Q4_K, Q5_K, Q6_K, Q3_K,
  // Q2_K).
  for (int t : {4, 8, 9, 10, 11, 14}) b->Args({t, 4096, 16384, 1, 2});
  // Small batches from L2 (a 60M layer's gate/up shape, one thread): the
  // kernels' compute per token, batch size by batch size, for Q8_0, Q4_0,
  // Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS and Q2_K (the prompt tile from 12 tokens
  // on). The sizes registered above (one token for all; 2 and 4 for Q8_0
  // and Q4_0) are skipped.
  for (int t : {3, 4, 8, 9, 10, 11, 13, 14})
    for (int n_tokens = 2; n_tokens <= 12; ++n_tokens)
      if (t >= kFirstNewType || (n_tokens != 2 && n_tokens != 4)) b->Args({t, 512, 1536, n_tokens, 1});
  // The K types' decode compute at n_in 4096 (256 rows: in L2, one thread),
  // against their from-memory rates above.
  for (int t : {8, 9, 10}) b->Args({t, 4096, 256, 1, 1});
  // Few rows for the K types too: their Q8_K activation quantizing dominates.
  for (int t : {8, 10}) b->Args({t, 1536, 16, 512, 1});
}
BENCHMARK(BM_Matmul)->Apply(MatmulArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Load-time repacking of a 4096 x 4096 matrix (a 7B model's attention
// projection), on one thread per core; bytes are the file's.
void BM_PackMatrix(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  Weights w = make_weights(t, 4096, 4096);
  for (auto _ : state) {
    PackedMatrix pm(w.view);
    benchmark::DoNotOptimize(pm.groups());
  }
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)));
  state.counters["file_GBps"] = benchmark::Counter(static_cast<double>(w.bytes.size()),
                                                   benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PackMatrix)->DenseRange(0, std::size(kTypes) - 1)->UseRealTime()->Unit(benchmark::kMillisecond);

// Unpacked views pack the rows they need per call (other model families).
void BM_MatmulUnpacked(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  ThreadPool pool(2);
  Weights w = make_weights(t, 512, 1536);
  std::vector<float> x = make_x(512 * state.range(1)), y(1536 * state.range(1));
  for (auto _ : state) {
    matmul(w.view, x.data(), state.range(1), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)));
}
BENCHMARK(BM_MatmulUnpacked)->ArgsProduct({{1, 3}, {1, 64}})->UseRealTime()->Unit(benchmark::kMicrosecond);

// Args: n_queries, context length, threads, head size, query heads per KV
// head. 8 query heads.
void BM_Attention(benchmark::State& state) {
  const int64_t n_q = state.range(0), n_ctx = state.range(1), n_head = 8, hd = state.range(3);
  const int64_t n_head_kv = n_head / state.range(4);
  ThreadPool pool(static_cast<int>(state.range(2)));
  std::vector<uint16_t> k(n_ctx * n_head_kv * hd), v(n_ctx * n_head_kv * hd);
  std::vector<float> kf = make_x(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = v[k.size() - 1 - i] = f32_to_f16(kf[i]);
  // Laid out as FlatMemory does: each KV head's state adjacent, keys in
  // groups of 16 positions (every context here is a multiple of 16).
  std::vector<const uint16_t*> kr(n_ctx), vr(n_ctx);
  for (int64_t p = 0; p < n_ctx; ++p) {
    kr[p] = k.data() + p * hd;
    vr[p] = v.data() + p * hd;
  }
  std::vector<float> q = make_x(n_q * n_head * hd), out(q.size());
  std::vector<int64_t> first(n_q, 0), end(n_q);
  for (int64_t t = 0; t < n_q; ++t) end[t] = n_ctx - n_q + t + 1;
  AttentionBatch a;
  a.q = q.data();
  a.n_tokens = n_q;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.first = first.data();
  a.end = end.data();
  a.key_rows = kr.data();
  a.value_rows = vr.data();
  a.kv_head_stride = n_ctx * hd;
  a.key_group = kKeyGroup;
  a.out = out.data();
  int64_t pairs = 0;
  for (int64_t t = 0; t < n_q; ++t) pairs += end[t] * n_head;
  for (auto _ : state) {
    attention(a, pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["query_key_pairs_per_s"] =
      benchmark::Counter(static_cast<double>(pairs), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)
    ->Args({512, 512, 1, 64, 1})
    ->Args({512, 512, 2, 64, 1})
    ->Args({512, 4608, 1, 64, 1})  // a 512-token prompt at depth 4096
    ->Args({512, 512, 1, 128, 1})
    ->Args({512, 4608, 1, 128, 1})
    ->Args({512, 2048, 1, 256, 1})
    ->Args({512, 512, 1, 16, 1})  // the small fixtures' head sizes (double-precision scores)
    ->Args({512, 512, 1, 8, 1})
    ->Args({1, 128, 1, 64, 1})
    ->Args({1, 48, 2, 64, 1})  // short decode contexts: the per-key numerics (<= 64 keys)
    ->Args({1, 64, 2, 64, 1})
    ->Args({1, 128, 2, 64, 1})
    ->Args({1, 256, 2, 64, 1})
    ->Args({1, 256, 1, 64, 1})  // decode's compute alone: 512 KB of K/V, in L2
    ->Args({1, 2048, 1, 64, 1})
    ->Args({1, 2048, 2, 64, 1})
    ->Args({1, 32768, 2, 64, 1})  // 64 MB of K/V: from memory, not L3
    ->Args({1, 2048, 1, 64, 4})  // decode with grouped-query attention
    ->Args({1, 2048, 1, 128, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Decode attention at depth as a token meets it: one query over the K/V of
// enough distinct layers (~96 MB in all, more than the L3) taken in turn, so
// every layer's K/V comes from memory. Args: context length, threads, query
// heads per KV head. 8 query heads of 64, FlatMemory's layout. Bytes per
// second against BM_ReadPacked's.
void BM_AttentionLayers(benchmark::State& state) {
  const int64_t n_ctx = state.range(0), n_head = 8, hd = 64, n_head_kv = n_head / state.range(2);
  ThreadPool pool(static_cast<int>(state.range(1)));
  const int64_t layer_halfs = 2 * n_ctx * n_head_kv * hd;
  const int64_t n_layers = std::max<int64_t>(1, (int64_t{96} << 20) / (layer_halfs * 2));
  struct Layer {
    std::vector<uint16_t> kv;
    std::vector<const uint16_t*> kr, vr;
  };
  std::vector<Layer> layers(n_layers);
  const std::vector<float> kf = make_x(layer_halfs);
  for (Layer& l : layers) {
    l.kv.resize(layer_halfs);
    for (int64_t i = 0; i < layer_halfs; ++i) l.kv[i] = f32_to_f16(kf[i]);
    l.kr.resize(n_ctx);
    l.vr.resize(n_ctx);
    for (int64_t p = 0; p < n_ctx; ++p) {
      l.kr[p] = l.kv.data() + p * hd;
      l.vr[p] = l.kv.data() + n_ctx * n_head_kv * hd + p * hd;
    }
  }
  std::vector<float> q = make_x(n_head * hd), out(q.size());
  int64_t first = 0, end = n_ctx;
  AttentionBatch a;
  a.q = q.data();
  a.n_tokens = 1;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = hd;
  a.scale = 0.125f;
  a.first = &first;
  a.end = &end;
  a.kv_head_stride = n_ctx * hd;
  a.key_group = kKeyGroup;
  a.out = out.data();
  for (auto _ : state) {
    for (const Layer& l : layers) {
      a.key_rows = l.kr.data();
      a.value_rows = l.vr.data();
      attention(a, pool);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(n_layers * layer_halfs * 2),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionLayers)
    ->Args({4096, 2, 1})
    ->Args({4096, 1, 1})
    ->Args({32768, 2, 1})
    ->Args({4096, 1, 4})  // grouped-query attention
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_RmsNorm(benchmark::State& state) {
  std::vector<float> x = make_x(512), w = make_x(512), out(512);
  for (auto _ : state) {
    rms_norm(x.data(), w.data(), 1e-5f, 512, out.data());
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_RmsNorm);

void BM_Rope(benchmark::State& state) {
  std::vector<float> x = make_x(512), c(32), s(32);
  rope_table(64, 100, 10000.0f, 1.0f, nullptr, c.data(), s.data());
  for (auto _ : state) {
    rope_apply(x.data(), 8, 64, 64, c.data(), s.data(), RopeStyle::Normal);
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_Rope);

void BM_RopeTable(benchmark::State& state) {
  std::vector<float> c(32), s(32);
  int64_t pos = 0;
  for (auto _ : state) {
    rope_table(64, pos++, 10000.0f, 1.0f, nullptr, c.data(), s.data());
    benchmark::DoNotOptimize(c.data());
  }
}
BENCHMARK(BM_RopeTable);

void BM_SiluMul(benchmark::State& state) {
  std::vector<float> g0 = make_x(1536), g = g0, u = make_x(1536);
  for (auto _ : state) {
    g = g0;
    silu_mul(g.data(), u.data(), 1536);
    benchmark::DoNotOptimize(g.data());
  }
  state.SetItemsProcessed(state.iterations() * 1536);
}
BENCHMARK(BM_SiluMul);

// A prompt's activations quantized for Q8_0 (arg 0) or K-type (1) weights
// as pack_activations does, one thread: n_tokens rows of n_in floats into
// token tiles. Args: kind, n_in, n_tokens.
void BM_QuantizeActivations(benchmark::State& state) {
  const bool q8k = state.range(0) != 0;
  const int64_t n_in = state.range(1), n_tokens = state.range(2);
  const kernels::IsaKernels& isa = kernels::isa_kernels();
  std::vector<float> x = make_x(n_in * n_tokens);
  const int64_t tile = kernels::kTokenTile, n_tiles = (n_tokens + tile - 1) / tile;
  std::vector<kernels::XBlock> out(static_cast<size_t>(n_in / 32 * tile * n_tiles));
  for (auto _ : state) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      kernels::XBlock* dst = out.data() + (t / tile) * tile * (n_in / 32) + t % tile;
      if (q8k) isa.quantize_q8_k(x.data() + t * n_in, n_in / 256, dst, tile);
      else isa.quantize_q8(x.data() + t * n_in, n_in / 32, dst, tile);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * n_in * n_tokens * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_QuantizeActivations)->ArgsProduct({{0, 1}, {512, 1536}, {12, 512}});

void BM_Exp(benchmark::State& state) {
  std::vector<float> x = make_x(1024), y(1024);
  for (auto _ : state) {
    expf_vec(x.data(), y.data(), 1024);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * 1024);
}
BENCHMARK(BM_Exp);

// Mamba-1's selective scan over one 16-channel block: arg 0 tokens (1 is a
// decode step), arg 1 d_state. Items are state elements times tokens.
void BM_Mamba1Scan(benchmark::State& state) {
  const int64_t n = state.range(0), ds = state.range(1), stride = 512, nc = kernels::kScanBlock;
  std::vector<float> dt = make_x(n * stride), x = make_x(n * stride), y(n * stride), bc = make_x(n * 2 * ds);
  std::vector<float> a = make_x(nc * ds), st(nc * ds, 0.0f);
  for (float& v : dt) v = std::log1p(std::exp(v));
  for (float& v : a) v = -std::exp(v);
  kernels::Mamba1Scan s;
  s.n_tokens = n;
  s.channels = nc;
  s.d_state = ds;
  s.dt = dt.data();
  s.x = x.data();
  s.y = y.data();
  s.row_stride = stride;
  s.bc = bc.data();
  s.bc_stride = 2 * ds;
  s.A = a.data();
  s.state = st.data();
  for (auto _ : state) {
    kernels::mamba1_scan(s);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n * nc * ds);
}
BENCHMARK(BM_Mamba1Scan)->ArgsProduct({{1, 512}, {16}});

// Mamba-2's scan over one head of 64 rows: arg 0 tokens, arg 1 d_state.
void BM_Mamba2Scan(benchmark::State& state) {
  const int64_t n = state.range(0), ds = state.range(1), rows = 64, stride = 512;
  std::vector<float> sp = make_x(n), dA(n), x = make_x(n * stride), y(n * stride), bc = make_x(n * 2 * ds);
  std::vector<float> st(rows * ds, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    sp[t] = std::log1p(std::exp(sp[t]));
    dA[t] = std::exp(-sp[t]);
  }
  kernels::Mamba2Scan s;
  s.n_tokens = n;
  s.channels = rows;
  s.d_state = ds;
  s.sp = sp.data();
  s.dA = dA.data();
  s.x = x.data();
  s.x_stride = stride;
  s.y = y.data();
  s.y_stride = stride;
  s.b = bc.data();
  s.c = bc.data() + ds;
  s.bc_stride = 2 * ds;
  s.state = st.data();
  for (auto _ : state) {
    kernels::mamba2_scan(s);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n * rows * ds);
}
BENCHMARK(BM_Mamba2Scan)->ArgsProduct({{1, 512}, {128}});

// Dispatch cost of one parallel_for with one trivial task per thread.
void BM_ParallelFor(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::vector<int64_t> sink(64);
  for (auto _ : state) {
    pool.parallel_for(pool.size(), [&](int64_t t) { sink[t * 8] += 1; });
  }
  benchmark::DoNotOptimize(sink.data());
}
BENCHMARK(BM_ParallelFor)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace

namespace {
// Machine read bandwidth for working sets around the 60M model sizes.
void BM_ReadBandwidth(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(1)));
  double bw = 0;
  for (auto _ : state) bw = measure_read_bandwidth(static_cast<size_t>(state.range(0)) << 20, pool, 3);
  state.counters["GBps"] = bw / 1e9;
}

// A pure read of a packed 4096 x 16384 matrix (the bytes BM_Matmul's
// decode of that shape reads, in their order), one stream per thread. Args:
// dtype index, threads.
void BM_ReadPacked(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  ThreadPool pool(static_cast<int>(state.range(1)));
  Weights w = make_weights(t, 4096, 16384);
  PackedMatrix pm(w.view);
  const std::span<const uint8_t> region(pm.groups(), pm.packed_bytes());
  ReadProbe probe(std::span<const std::span<const uint8_t>>(&region, 1), pool);
  double seconds = 0;
  for (auto _ : state) seconds += probe.pass(1);
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)));
  state.counters["GBps"] = static_cast<double>(state.iterations()) * static_cast<double>(probe.bytes()) / seconds / 1e9;
}
BENCHMARK(BM_ReadPacked)->ArgsProduct({{3, 4, 8, 9, 10, 11, 14}, {1, 2}})->UseRealTime();

// Packed copies of w, each its own memory, until they hold ~96 MB:
// multiplied one after another, each is read from memory.
std::vector<PackedMatrix> distinct_copies(const Weights& w) {
  std::vector<PackedMatrix> copies;
  for (size_t bytes = 0; bytes < (size_t{96} << 20); bytes += copies.back().packed_bytes()) copies.emplace_back(w.view);
  return copies;
}

// Decode's products one after another, as a token runs them: enough distinct
// packed copies of one 512-input matrix (~96 MB in all, more than the L3) to
// be read from memory, each product once per iteration. Each product costs
// its bytes at the read rate plus a fixed part (activation quantizing, the
// dispatch, the first lines' latency, the last tile's tail); comparing
// n_out 512 (0.28 MB of Q8_0, the 60M model's O) with 32000 (17 MB, its
// output) shows that part. Args: dtype index, n_out, threads.
void BM_DecodeSequence(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t n_in = 512, n_out = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Weights w = make_weights(t, n_in, n_out);
  const std::vector<PackedMatrix> copies = distinct_copies(w);
  const size_t bytes = copies.size() * copies[0].packed_bytes();
  std::vector<float> x = make_x(n_in), y(n_out);
  for (auto _ : state) {
    for (const PackedMatrix& pm : copies) matmul(pm, x.data(), 1, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)) + " " + std::to_string(copies.size()) + " products");
  state.counters["weight_GBps"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
  state.counters["us_per_product"] = benchmark::Counter(
      static_cast<double>(copies.size()) * 1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeSequence)
    ->ArgsProduct({{1, 3}, {512, 1536, 32000}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Prompt-sized products as a pass runs them: distinct packed copies of one
// 512-input matrix (~96 MB in all, so each is read from memory), each
// multiplied with n_tokens activations in turn; or (last arg 1) one copy
// every time, from cache. The gap between the two is what a prompt chunk or
// a large decode batch pays for weights that come from memory: a call reads
// each group once in its first token tile, and the later ones find it in
// cache (prefetch_next_groups requests the next tile's groups while a tile
// computes). Args: dtype index, n_out, threads, n_tokens, cached.
void BM_PromptSequence(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const int64_t n_in = 512, n_out = state.range(1), n_tokens = state.range(3);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Weights w = make_weights(t, n_in, n_out);
  const std::vector<PackedMatrix> copies = distinct_copies(w);
  const size_t used = state.range(4) ? 1 : copies.size();
  std::vector<float> x = make_x(n_in * n_tokens), y(n_out * n_tokens);
  for (auto _ : state) {
    for (size_t i = 0; i < copies.size(); ++i) matmul(copies[i % used], x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(dtype_name(static_cast<uint32_t>(t)) + (state.range(4) ? " cached" : " from memory"));
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * n_in * n_out * n_tokens * static_cast<double>(copies.size()),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PromptSequence)
    ->ArgsProduct({{1, 3, 8}, {1536}, {2}, {16, 32, 64}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The read pattern alone of a 60M Q8_0 token: its 33 products' bytes (8
// layers of QKV, O, gate+up and down, then the output matrix) read in order
// by two threads of their own, each half of each product, meeting at a spin
// barrier after every product; or (second arg 1) the same bytes as one
// product. Copies > 1 chains that many tokens' worth of distinct bytes, so
// nothing stays in the L3 between passes. It bounds what any split of the
// products can read on this host: on the 2-vCPU VM the 33 products read at
// 77-81 GB/s against 86-92 as one product, and one token's 46 MB 1.2-1.4x
// faster than three tokens' distinct 139 MB, part of it from L3 (session
// 27). Args: copies, one product.
void BM_ReadTokenPattern(benchmark::State& state) {
  const int copies = static_cast<int>(state.range(0));
  const bool one = state.range(1) != 0;
  auto q8 = [](int64_t n_in, int64_t n_out) { return packed_matrix_bytes(DType::Q8_0, n_in, n_out); };
  const size_t layer[] = {q8(512, 3 * 512), q8(512, 512), q8(512, 2 * 1536), q8(1536, 512)};
  std::vector<size_t> sizes;
  for (int c = 0; c < copies; ++c) {
    for (int l = 0; l < 8; ++l) sizes.insert(sizes.end(), std::begin(layer), std::end(layer));
    sizes.push_back(q8(512, 32000));
  }
  size_t total = 0;
  for (size_t s : sizes) total += s;
  if (one) sizes.assign(1, total);
  std::vector<size_t> offsets;
  for (size_t s = 0, o = 0; s < sizes.size(); o += sizes[s++]) offsets.push_back(o);
  const size_t lines = total / 64 + 1;
  // Whole lines: the buffer's first line-aligned word onward.
  std::vector<uint64_t> buf(lines * 8 + 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
  const auto* bytes = reinterpret_cast<const uint8_t*>(buf.data());
  bytes += (64 - reinterpret_cast<uintptr_t>(bytes) % 64) % 64;
  struct alignas(64) Arrival {
    std::atomic<int64_t> epoch{0};
  };
  Arrival arrived[2];
  std::atomic<bool> stop{false};
  std::atomic<int64_t> passes{0};
  // Sums 64-bit words of [p, p + n) (whole lines).
  auto read = [](const uint8_t* p, size_t n) {
    uint64_t s0 = 0, s1 = 0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
      const auto* w = reinterpret_cast<const uint64_t*>(p + i);
      s0 += w[0];
      s1 += w[4];
    }
    return s0 + s1;
  };
  // One pass: every product's half, then the barrier.
  auto pass = [&](int me, int64_t& epoch) {
    uint64_t sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t half = sizes[i] / 2 / 64 * 64;
      sum += me == 0 ? read(bytes + offsets[i], half) : read(bytes + offsets[i] + half, sizes[i] - half);
      ++epoch;
      arrived[me].epoch.store(epoch, std::memory_order_release);
      while (arrived[1 - me].epoch.load(std::memory_order_acquire) < epoch) _mm_pause();
    }
    benchmark::DoNotOptimize(sum);
  };
  std::thread helper([&] {
    int64_t epoch = 0;
    for (int64_t done = 0;; ++done) {
      while (passes.load(std::memory_order_acquire) <= done)
        if (stop.load(std::memory_order_acquire)) return;
      pass(1, epoch);
    }
  });
  int64_t epoch = 0;
  for (auto _ : state) {
    passes.fetch_add(1, std::memory_order_release);
    pass(0, epoch);
  }
  stop.store(true, std::memory_order_release);
  helper.join();
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ReadTokenPattern)->ArgsProduct({{1, 3}, {0, 1}})->UseRealTime()->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_ReadBandwidth)->ArgsProduct({{4, 36, 64, 120, 512}, {1, 2}})->Iterations(1)->UseRealTime();
}  // namespace
