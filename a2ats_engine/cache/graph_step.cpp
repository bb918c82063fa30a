// The C++ host step (native_step.cpp) as an MLX primitive: a retrieval layer's step is a node of
// the model's graph, run on MLX's CPU stream when the decode step is evaluated, instead of after a
// host sync of its own (one `mx.eval` a layer, then the step on the main thread). A decode step is
// then evaluated once, as with mlx-lm's KVCache (docs/BENCHMARKS.md, "The step inside MLX's
// graph"). Loaded by a2ats_engine/cache/graph_step.py; built by a2ats_engine/cache/graph_build.py
// against the MLX wheel installed (its headers and libmlx) with nanobind, whose ABI MLX's Python
// arrays use: the build records MLX's version, and the loader refuses a build for another.
//
// The primitive computes what `_native_step.step` computes (the same C function, the same
// selection and attention), CPU only. Its inputs are checked here when the node is made (dtype,
// rank, shape, ranges: std::invalid_argument, a ValueError in Python); the distance buckets'
// values, known only when the node runs, are checked there. A NaN score (a NaN or infinite
// query) or a bucket out of range leaves the step undone: the output is NaN, the selection the
// first rows, and `retrieved` -1 (the caller counts it; the NumPy step's fallback is not
// available inside the graph).
#define A2ATS_STEP_CORE_ONLY
#include "native_step.cpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#ifndef A2ATS_MLX_VERSION
#error "graph_build.py defines A2ATS_MLX_VERSION, the MLX version this is built against"
#endif

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

struct Params {
  int m, n, n_sinks, window_start, k, cand;
  bool has_bucket, has_sinks;
  float scale;
};

class GraphStep : public mx::Primitive {
 public:
  GraphStep(mx::Stream s, Params p) : mx::Primitive(s), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    for (auto& o : out) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : in) enc.set_input_array(a);
    for (auto& o : out) enc.set_output_array(o);
    const auto &q = in[0], &to_far = in[1], &codes = in[2], &keys = in[3], &values = in[4],
               &cent = in[5];
    const int B = codes.shape(0), n_kv = codes.shape(1), cap = codes.shape(2),
              S = codes.shape(3), d = keys.shape(3), G = q.shape(1) / n_kv, C = cent.shape(2),
              ld = to_far.shape(1);
    size_t at = 6;
    const int32_t* bp = p_.has_bucket ? in[at++].data<int32_t>() : nullptr;
    const float* sp = p_.has_sinks ? in[at++].data<float>() : nullptr;
    const Params p = p_;
    const size_t n_out = out[0].size(), n_sel = out[1].size();
    enc.dispatch([=, qp = q.data<float>(), tp = to_far.data<float>(), cp = codes.data<uint16_t>(),
                  kp = keys.data<float>(), vp = values.data<float>(), ep = cent.data<float>(),
                  op = out[0].data<float>(), pp = out[1].data<int32_t>(),
                  rp = out[2].data<bool>(), np_ = out[3].data<int32_t>()]() {
      const int F = p.window_start - p.n_sinks;
      bool ok = true;
      for (int t = 0; bp && ok && t < F; ++t) ok = bp[t] >= 0 && bp[t] < p.m;
      const long got =
          ok ? a2ats_native_step(B, n_kv, G, d, p.m, S, C, qp, tp, ld, ep, cp, bp, kp, vp, sp,
                                 cap, p.n, p.n_sinks, p.window_start, p.k, p.cand, p.scale, op,
                                 pp, reinterpret_cast<uint8_t*>(rp))
             : -1;
      if (got < 0) {  // the step undone: NaN out, the first rows as its selection
        std::fill(op, op + n_out, std::numeric_limits<float>::quiet_NaN());
        const size_t M = n_sel / ((size_t)B * n_kv);
        for (size_t j = 0; j < n_sel; ++j) {
          pp[j] = (int32_t)((j % M) % (size_t)p.n);
          rp[j] = (j % M) >= (size_t)p.n;
        }
      }
      *np_ = got < 0 ? -1 : (int32_t)std::min<long>(got, std::numeric_limits<int32_t>::max());
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("A2ATS graph step: CPU only (the GPU takes the synced step)");
  }

  const char* name() const override { return "A2ATSGraphStep"; }

 private:
  Params p_;
};

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("A2ATS graph step: ") + what);
}

void typed(const mx::array& a, mx::Dtype t, int ndim, const char* name) {
  need(a.dtype() == t && a.ndim() == ndim,
       (std::string(name) + " has the wrong dtype or rank").c_str());
}

bool fits(int64_t x) { return x >= 0 && x <= (int64_t(1) << 30); }

// q float32 [B, n_q, 1, d]; to_far float32 [d, >= m * d]; codes uint16 [B, n_kv, cap, S];
// keys / values float32 [B, n_kv, cap, d]; centroids float32 [n_kv, S, C, d / S]; bucket int32
// [F] or None (m == 1); sink_logits float32 [n_q] or None -> (out float32 [B, n_q, 1, d],
// positions int32 and repeat bool [B, n_kv, M], retrieved int32 [1]), lazily, on the CPU stream.
std::vector<mx::array> graph_step(const mx::array& q, const mx::array& to_far,
                                  const mx::array& codes, const mx::array& keys,
                                  const mx::array& values, const mx::array& cent,
                                  std::optional<mx::array> bucket,
                                  std::optional<mx::array> sink_logits, int m, int n, int n_sinks,
                                  int window_start, int k, int cand, float scale) {
  typed(q, mx::float32, 4, "queries");
  typed(to_far, mx::float32, 2, "rotations");
  typed(codes, mx::uint16, 4, "codes");
  typed(keys, mx::float32, 4, "keys");
  typed(values, mx::float32, 4, "values");
  typed(cent, mx::float32, 4, "centroids");
  const int64_t B = codes.shape(0), n_kv = codes.shape(1), cap = codes.shape(2),
                S = codes.shape(3), d = keys.shape(3), n_q = q.shape(1), C = cent.shape(2);
  const int64_t G = n_kv > 0 ? n_q / n_kv : 0, F = int64_t(window_start) - n_sinks;
  const int64_t M = n_sinks + G * k + (int64_t(n) - window_start);
  need(B > 0 && n_kv > 0 && G > 0 && S > 0 && d > 0 && C > 0 && C <= 65536 && n_q == n_kv * G &&
           d % S == 0 && fits(cap) && fits(n_q) && fits(d) && q.shape(0) == B &&
           q.shape(2) == 1 && q.shape(3) == d && keys.shape() == values.shape() &&
           keys.shape(0) == B && keys.shape(1) == n_kv && keys.shape(2) == cap &&
           cent.shape(0) == n_kv && cent.shape(1) == S && cent.shape(3) == d / S,
       "queries, codes, keys, values and centroids do not share batch, KV heads, capacity and "
       "head dim");
  need(m >= 1 && m <= 4096 && to_far.shape(0) == d && to_far.shape(1) >= m * d &&
           fits(to_far.shape(1)) && fits(G * m * S * C),
       "rotations do not fit the buckets used");
  need(n_sinks >= 0 && window_start >= n_sinks && n >= window_start && n <= cap && k >= 1 &&
           k <= F && cand >= 0 && cand <= F && fits(M),
       "context, sinks, window or budget out of range");
  if (bucket) {
    typed(*bucket, mx::int32, 1, "distance buckets");
    need(bucket->shape(0) == F, "distance buckets are not one per far token");
  } else {
    need(m == 1, "several buckets used but no distance buckets");
  }
  if (sink_logits) {
    typed(*sink_logits, mx::float32, 1, "sink logits");
    need(sink_logits->shape(0) == n_q, "sink logits are not one per query head");
  }
  auto s = mx::default_stream(mx::Device::cpu);
  auto c = [&](const mx::array& a) { return mx::contiguous(a, false, s); };
  std::vector<mx::array> ins = {c(q), c(to_far), c(codes), c(keys), c(values), c(cent)};
  if (bucket) ins.push_back(c(*bucket));
  if (sink_logits) ins.push_back(c(*sink_logits));
  Params p{m, n, n_sinks, window_start, k, cand, bool(bucket), bool(sink_logits), scale};
  const int Bi = (int)B, hq = (int)n_q, hk = (int)n_kv, di = (int)d, Mi = (int)M;
  return mx::array::make_arrays({{Bi, hq, 1, di}, {Bi, hk, Mi}, {Bi, hk, Mi}, {1}},
                                {mx::float32, mx::int32, mx::bool_, mx::int32},
                                std::make_shared<GraphStep>(s, p), ins);
}

}  // namespace

NB_MODULE(_graph_step, mod) {
  mod.def("step", &graph_step);
  mod.attr("mlx_version") = A2ATS_MLX_VERSION;
}
