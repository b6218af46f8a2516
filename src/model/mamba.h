// State-space models: mamba (Mamba-1 selective scan) and mamba2 (SSD with
// heads and groups, gated RMS norm), following llama.cpp's graphs
// (build_mamba_layer / build_mamba2_layer, ggml_ssm_conv, ggml_ssm_scan).
//
// Per recurrent layer the sequence state holds what llama.cpp keeps, laid
// out for reprise's kernels (the cache copies it whole; only the mixers
// read it):
//   conv_state: the last d_conv - 1 inputs of every conv channel, oldest
//               first, input by input ([i][channels]: ggml keeps them
//               channel by channel), so a decode step's conv reads them as
//               vectors in place;
//   ssm_state:  d_state floats per channel (Mamba-1: channels = d_inner;
//               Mamba-2: head h, row i of head_dim => channel h * head_dim + i),
//               in the scans' blocks (tensor/ssm_scan.h) rather than
//               channel by channel: blocks of kernels::kScanBlock channels
//               (Mamba-2: of one head's rows), the last one of d_inner (of a
//               head) shorter where needed; the block from channel c0 is at
//               c0 * d_state, element k of its nc channels at
//               + k * nc + (c - c0). Mamba-1's A is laid out alike.
// Everything a forward pass needs from earlier positions lives there, so the
// cache can snapshot and restore it; nothing is kept in the model.
//
// Determinism: each token's values depend only on the state before it and its
// own inputs (the scan is sequential per channel; matmuls are per row), so a
// run of tokens gives bit-identical logits and state whether it is processed
// as one batch or split into several, and on any thread count.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/pass_segments.h"
#include "model/state_spec.h"
#include "model/weights.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/matrix.h"

namespace reprise {

bool is_mamba_arch(const std::string& arch);  // mamba, mamba2
std::unique_ptr<Model> load_mamba(const gguf::File& file);

// The Mamba-1 mixer, shared with jamba's recurrent layers.
struct Mamba1Dims {
  int64_t n_embd = 0;
  int64_t d_inner = 0;
  int64_t d_state = 0;
  int64_t d_conv = 0;
  int64_t dt_rank = 0;
  float eps = 1e-5f;
  // RMS norms on dt, B and C before the dt projection: weighted (jamba, from
  // ssm_{dt,b,c}_norm tensors) or unweighted (falcon-mamba's ssm.dt_b_c_rms).
  bool dt_b_c_rms = false;

  int64_t conv_state_floats() const { return (d_conv - 1) * d_inner; }
  int64_t ssm_state_floats() const { return d_state * d_inner; }
};

// Reads and checks the SSM hyper-parameters `<arch>.ssm.*` (and the RMS eps);
// throws reprise::Error (via file.fail) naming what is wrong.
Mamba1Dims read_mamba1_dims(const gguf::File& file, const std::string& arch, int64_t n_embd);

struct Mamba1Layer {
  PackedMatrix in, x_proj, dt_proj, out;
  std::vector<float> conv_w, conv_b, dt_b, D;
  std::vector<float> A;  // in the scan's blocks, as the state (above)
  std::vector<float> dt_norm, b_norm, c_norm;  // empty unless weighted dt/B/C norms
};

// Loads blk.<il>.ssm_* (with_bc_norms: also ssm_{dt,b,c}_norm.weight, required).
Mamba1Layer load_mamba1_layer(const WeightLoader& w, int64_t il, const Mamba1Dims& d,
                              bool with_bc_norms);

// Rows [row0, row0 + n) of a pass that belong to one sequence, and that
// sequence's state for the layer being run (see the layout above).
struct RecurrentRun {
  int64_t row0 = 0;
  int64_t n = 0;
  float* conv_state = nullptr;
  float* ssm_state = nullptr;
};

// Each segment's rows and recurrent state for layer `layer`. Throws
// reprise::Error when a segment's memory holds no state for the layer.
std::vector<RecurrentRun> recurrent_runs(std::span<const PassSegment> segments, int layer,
                                         const LayerStateSpec& spec);

// Runs the mixer over the rows of `runs` (consecutive, from row 0; one run
// per sequence, each advancing its own state in token order): `in` holds the
// normalized hidden states (rows x n_embd), `out` receives the mixer's output
// before the residual, for rows [out_first, rows) only (the states always
// advance over every row). A row's result depends only on its own sequence.
void mamba1_mix(const Mamba1Layer& L, const Mamba1Dims& d, const float* in, std::span<const RecurrentRun> runs,
                float* out, ThreadPool& pool, int64_t out_first = 0);

// What a Mamba-1 mixer's decode team shares between its members (the
// products' outputs and the scan's y), one per pool: size_for_team readies
// it for a step of n rows before DecodeTeam::run.
struct Mamba1TeamBuffers {
  std::vector<float> xz, xdb, dt, y;
  void size_for_team(const Mamba1Dims& d, int64_t n);
};

// mamba1_mix for a decode step run by a team (every run one token, every
// row's output wanted), member m's part; `product` is the step's index of
// the mixer's first product (in_proj, then x_proj, dt_proj, out_proj:
// advanced past them). The same operations as mamba1_mix, the same bits.
void mamba1_team_mix(const Mamba1Layer& L, const Mamba1Dims& d, const float* in, std::span<const RecurrentRun> runs,
                     float* out, Mamba1TeamBuffers& shared, DecodeTeam::Member& m, TeamStepPlan& plan, int& product);

}  // namespace reprise
