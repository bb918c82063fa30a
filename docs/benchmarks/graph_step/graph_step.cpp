// A prototype, not part of the engine: the C++ host step (a2ats_engine/cache/native_step.cpp) as
// an MLX primitive, so that a retrieval layer's step runs inside MLX's graph on its CPU stream
// instead of after a host sync of its own. Built and timed by run.py (docs/BENCHMARKS.md, "The
// step inside MLX's graph: a prototype"). CPU only; the layer's sink logits and the
// missed-attention estimate are left out (run.py turns the estimate off); a NaN score leaves the
// output as the step left it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "../../../a2ats_engine/cache/native_step.cpp"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

struct Params {
  int m, n, n_sinks, window_start, k, cand, has_bucket;
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
    const Params p = p_;
    enc.dispatch([=, qp = q.data<float>(), tp = to_far.data<float>(), cp = codes.data<uint16_t>(),
                  kp = keys.data<float>(), vp = values.data<float>(), ep = cent.data<float>(),
                  bp = p.has_bucket ? in[6].data<int32_t>() : nullptr, op = out[0].data<float>(),
                  pp = out[1].data<int32_t>(), rp = out[2].data<bool>()]() {
      a2ats_native_step(B, n_kv, G, d, p.m, S, C, qp, tp, ld, ep, cp, bp, kp, vp, nullptr, cap,
                        p.n, p.n_sinks, p.window_start, p.k, p.cand, p.scale, op, pp,
                        reinterpret_cast<uint8_t*>(rp));
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("graph step prototype: CPU only");
  }

  const char* name() const override { return "A2ATSGraphStep"; }

 private:
  Params p_;
};

// queries float32 [B, n_q, 1, d], to_far [d, >= m * d], codes uint16 [B, n_kv, cap, S], keys /
// values float32 [B, n_kv, cap, d], centroids [n_kv, S, C, d / S], bucket int32 [F] or None ->
// (out [B, n_q, 1, d], positions int32, repeat bool [B, n_kv, M]), lazily.
std::vector<mx::array> graph_step(const mx::array& q, const mx::array& to_far,
                                  const mx::array& codes, const mx::array& keys,
                                  const mx::array& values, const mx::array& cent,
                                  std::optional<mx::array> bucket, int m, int n, int n_sinks,
                                  int window_start, int k, int cand, float scale) {
  auto s = mx::default_stream(mx::Device::cpu);
  auto c = [&](const mx::array& a) { return mx::contiguous(a, false, s); };
  const int B = codes.shape(0), n_kv = codes.shape(1), n_q = q.shape(1), d = q.shape(3);
  const int M = n_sinks + (n_q / n_kv) * k + (n - window_start);
  std::vector<mx::array> ins = {c(q), c(to_far), c(codes), c(keys), c(values), c(cent)};
  if (bucket) ins.push_back(c(*bucket));
  Params p{m, n, n_sinks, window_start, k, cand, bucket ? 1 : 0, scale};
  return mx::array::make_arrays({{B, n_q, 1, d}, {B, n_kv, M}, {B, n_kv, M}},
                                {mx::float32, mx::int32, mx::bool_},
                                std::make_shared<GraphStep>(s, p), ins);
}

}  // namespace

NB_MODULE(_graph_step, m) { m.def("graph_step", &graph_step); }
