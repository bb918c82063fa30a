// The C++ host step (native_step.cpp) as an MLX primitive: a retrieval layer's step is a node of
// the model's graph, run on MLX's CPU stream when the decode step is evaluated, instead of after a
// host sync of its own (one `mx.eval` a layer, then the step on the main thread). A decode step is
// then evaluated once, as with mlx-lm's KVCache (docs/BENCHMARKS.md, "The step inside MLX's
// graph"). Loaded by a2ats_engine/cache/graph_step.py; built by a2ats_engine/cache/graph_build.py
// against the MLX wheel installed (its headers and libmlx) with nanobind, whose ABI MLX's Python
// arrays use: the build records MLX's version, and the loader refuses a build for another.
//
// The primitive computes what `_native_step.step` computes (the same C function, the same
// selection and attention), CPU only. With the missed-attention estimate the same primitive,
// given the layer's slot sums (SlotSums, held here across steps; the node A2ATSGraphEstimate),
// selects, moves the sums and attends with them (`_native_step.estimate`'s C function). Its
// inputs are checked here when the node is made (dtype, rank, shape, ranges:
// std::invalid_argument, a ValueError in Python); the distance buckets'
// values, known only when the node runs, are checked there. A NaN score (a NaN or infinite
// query) or a bucket out of range leaves the step undone: the output is NaN, the selection the
// first rows, and `retrieved` -1 (the caller counts it; the NumPy step's fallback is not
// available inside the graph).
#define A2ATS_STEP_CORE_ONLY
#include "native_step.cpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <memory>
#include <mutex>
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

// The missed-attention estimate's per-slot sums of one layer, held in C++ across decode steps
// (host_step's SlotRows, which the synced step moves in NumPy): each (batch, KV head) gives a
// row to a slot (a (distance bucket, first code) pair) the first time a far token enters it,
// in position order; a row holds the count, value sum and key sum of the slot's far tokens, and
// each far position the row of its slot (`row_at`, what the estimate's attention looks its
// retrieved tokens up in). The A2ATSGraphEstimate node that reads them moves them first: by the
// step's few moves (`retrieval.slot_moves`) where they describe the context one token before,
// else rebuilt from the codes and rows. A lock guards them: the node runs on MLX's CPU stream,
// `nbytes` / `dense` are read from Python.
class SlotSums {
 public:
  SlotSums(int n_slots, int n_centroids, std::vector<int> edges)
      : n_slots_(n_slots), C_(n_centroids), edges_(std::move(edges)) {
    if (n_centroids < 1 || n_centroids > 65536 || n_slots < n_centroids ||
        n_slots > (1 << 24) || edges_.size() > 4096)
      throw std::invalid_argument("A2ATS graph step: slot sums of an impossible size");
    std::sort(edges_.begin(), edges_.end());
  }

  // Bring the sums to context n (far region [n_sinks, window_start)): moves (position,
  // bucket, weight) where they describe context n - 1 of these shapes, else a rebuild. codes
  // uint16 [BH, cap, S], keys / values float32 [BH, cap, d]. False where a code's slot is out
  // of range (nothing kept: the next step rebuilds).
  bool advance(int BH, int cap, int S, int d, const uint16_t* codes, const float* keys,
               const float* values, int n, int n_sinks, int window_start,
               const std::vector<int>& mpos, const std::vector<int>& mbucket,
               const std::vector<float>& mw) {
    const bool moves = n_done_ >= 0 && n_done_ == n - 1 && BH == BH_ && d == d_;
    n_done_ = -1;
    if (!moves) {
      ++rebuilds_;
      BH_ = BH, d_ = d, rows_ = 0;
      row_of_.assign((size_t)BH * n_slots_, -1);
      used_.assign((size_t)BH, 0);
      counts_.clear(), vs_.clear(), ks_.clear(), slot_of_.clear(), row_at_.clear();
      P_ = 0;
      grow_rows(16);
    }
    grow_positions(window_start);
    for (int bh = 0; bh < BH; ++bh) {
      const uint16_t* ch = codes + (size_t)bh * cap * S;
      const float* kh = keys + (size_t)bh * cap * d;
      const float* vh = values + (size_t)bh * cap * d;
      auto add = [&](int p, int bucket, float w) {
        const long slot = (long)ch[(size_t)p * S] + (long)C_ * bucket;
        if (bucket < 0 || slot >= n_slots_) return false;
        const int row = row_for(bh, (int)slot);
        const size_t at = (size_t)bh * rows_ + row;
        counts_[at] += w;
        float* v = vs_.data() + at * d;
        float* k = ks_.data() + at * d;
        const float* pv = vh + (size_t)p * d;
        const float* pk = kh + (size_t)p * d;
        for (int j = 0; j < d; ++j) v[j] += w * pv[j], k[j] += w * pk[j];
        if (w > 0.f) row_at_[(size_t)bh * P_ + p] = row;
        return true;
      };
      if (moves) {
        for (size_t i = 0; i < mpos.size(); ++i)
          if (!add(mpos[i], mbucket[i], mw[i])) return false;
      } else {
        for (int p = n_sinks; p < window_start; ++p)
          if (!add(p, bucket_of(n, p), 1.f)) return false;
      }
    }
    n_done_ = n;
    return true;
  }

  int bucket_of(int n, int p) const {  // the estimate's distance bucket of position p
    const int dist = (n - 1) - p;
    return (int)(std::upper_bound(edges_.begin(), edges_.end(), dist) - edges_.begin());
  }

  int rows_read() const {  // R: the most rows a head uses, + the empty last row
    int r = 0;
    for (int u : used_) r = std::max(r, u);
    return r + 1;
  }

  size_t nbytes() const {
    return (row_of_.size() + slot_of_.size() + row_at_.size() + counts_.size()) * 4 +
           (vs_.size() + ks_.size()) * 4 + used_.size() * sizeof(int);
  }

  std::mutex mu;
  int BH_ = 0, d_ = 0, rows_ = 0, P_ = 0, n_slots_, C_;
  long n_done_ = -1, rebuilds_ = 0;
  std::vector<int> edges_, used_;
  std::vector<int32_t> row_of_, slot_of_, row_at_;
  std::vector<float> counts_, vs_, ks_;

 private:
  int row_for(int bh, int slot) {
    int32_t& r = row_of_[(size_t)bh * n_slots_ + slot];
    if (r < 0) {
      if (used_[bh] + 1 >= rows_) grow_rows(2 * rows_);  // one row past the last kept empty
      r = used_[bh]++;
      slot_of_[(size_t)bh * rows_ + r] = slot;
    }
    return r;
  }

  void grow_rows(int rows) {  // each head's rows re-laid to `rows`, the rows in use kept
    const int old = rows_;
    std::vector<float> counts((size_t)BH_ * rows, 0.f), vs((size_t)BH_ * rows * d_, 0.f);
    std::vector<float> ks(vs.size(), 0.f);
    std::vector<int32_t> slot_of((size_t)BH_ * rows, 0);
    for (int bh = 0; bh < BH_ && old; ++bh) {
      std::copy_n(counts_.data() + (size_t)bh * old, old, counts.data() + (size_t)bh * rows);
      std::copy_n(slot_of_.data() + (size_t)bh * old, old, slot_of.data() + (size_t)bh * rows);
      std::copy_n(vs_.data() + (size_t)bh * old * d_, (size_t)old * d_,
                  vs.data() + (size_t)bh * rows * d_);
      std::copy_n(ks_.data() + (size_t)bh * old * d_, (size_t)old * d_,
                  ks.data() + (size_t)bh * rows * d_);
    }
    counts_.swap(counts), vs_.swap(vs), ks_.swap(ks), slot_of_.swap(slot_of);
    rows_ = rows;
  }

  void grow_positions(int top) {
    if (top <= P_) return;
    const int P = std::max(top, 2 * P_);
    std::vector<int32_t> at((size_t)BH_ * P, 0);
    for (int bh = 0; bh < BH_ && P_; ++bh)
      std::copy_n(row_at_.data() + (size_t)bh * P_, P_, at.data() + (size_t)bh * P);
    row_at_.swap(at);
    P_ = P;
  }
};

struct Moves {
  std::vector<int> pos, bucket;
  std::vector<float> w;
};

// A retrieval layer's step as a node: the selection and the attention (a2ats_native_step), or
// with the missed-attention estimate (`sums` given: the node A2ATSGraphEstimate) the selection, the
// layer's SlotSums brought to this context, then the attention with them
// (a2ats_native_attend_estimate), whose estimated share of the softmax mass is a fifth output,
// float32 [B, n_kv, G].
class GraphStep : public mx::Primitive {
 public:
  GraphStep(mx::Stream s, Params p, std::shared_ptr<SlotSums> sums = nullptr, Moves moves = {})
      : mx::Primitive(s), p_(p), sums_(std::move(sums)), moves_(std::move(moves)) {}

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
    const size_t n_share = sums_ ? out[4].size() : 0;
    enc.dispatch([=, sums = sums_, mv = moves_, qp = q.data<float>(), tp = to_far.data<float>(),
                  cp = codes.data<uint16_t>(), kp = keys.data<float>(),
                  vp = values.data<float>(), ep = cent.data<float>(), op = out[0].data<float>(),
                  pp = out[1].data<int32_t>(), rp = out[2].data<bool>(),
                  np_ = out[3].data<int32_t>(),
                  shp = sums_ ? out[4].data<float>() : nullptr]() {
      const int F = p.window_start - p.n_sinks;
      auto* rep = reinterpret_cast<uint8_t*>(rp);
      bool ok = true;
      for (int t = 0; bp && ok && t < F; ++t) ok = bp[t] >= 0 && bp[t] < p.m;
      auto select = [&](float* attended) {
        return a2ats_native_step(B, n_kv, G, d, p.m, S, C, qp, tp, ld, ep, cp, bp, kp, vp, sp,
                                 cap, p.n, p.n_sinks, p.window_start, p.k, p.cand, p.scale,
                                 attended, pp, rep);
      };
      long got = -1;
      if (!sums) {
        if (ok) got = select(op);
      } else {
        std::lock_guard<std::mutex> hold(sums->mu);
        // the sums move whatever the query: the next step's moves start from this context
        const bool moved = sums->advance(B * n_kv, cap, S, d, cp, kp, vp, p.n, p.n_sinks,
                                         p.window_start, mv.pos, mv.bucket, mv.w);
        if (ok && moved) got = select(nullptr);
        const int M = (int)(n_sel / ((size_t)B * n_kv)), R = sums->rows_read();
        const long P = sums->P_, rows = sums->rows_;
        if (got >= 0 && a2ats_native_attend_estimate(
                            B, n_kv, G, d, cap, M, p.n_sinks, G * p.k, R, qp, kp, vp, pp, rep,
                            sums->row_at_.data(), n_kv * P, P, (int)P, sums->counts_.data(),
                            n_kv * rows, rows, sums->vs_.data(), sums->ks_.data(),
                            n_kv * rows * d, rows * d, sp, p.scale, op, shp) < 0)
          got = -1;
      }
      if (got < 0) {  // the step undone: NaN out (and share), the first rows as its selection
        std::fill(op, op + n_out, std::numeric_limits<float>::quiet_NaN());
        if (shp) std::fill(shp, shp + n_share, std::numeric_limits<float>::quiet_NaN());
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

  const char* name() const override {
    return sums_ ? "A2ATSGraphEstimate" : "A2ATSGraphStep";
  }

 private:
  Params p_;
  std::shared_ptr<SlotSums> sums_;
  Moves moves_;
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

// The step with the missed-attention estimate (GraphStep with the sums: the node
// A2ATSGraphEstimate): graph_step's arguments, the
// layer's SlotSums, and the moves from context n - 1 (positions, buckets, weights +1 / -1;
// used where the sums describe n - 1) -> (out, positions, repeat, retrieved, share float32
// [B, n_kv, G]).
std::vector<mx::array> graph_estimate(
    const mx::array& q, const mx::array& to_far, const mx::array& codes, const mx::array& keys,
    const mx::array& values, const mx::array& cent, std::optional<mx::array> bucket,
    std::optional<mx::array> sink_logits, int m, int n, int n_sinks, int window_start, int k,
    int cand, float scale, std::shared_ptr<SlotSums> sums, std::vector<int> mpos,
    std::vector<int> mbucket, std::vector<float> mw) {
  need(sums != nullptr, "no slot sums");
  need(mpos.size() == mbucket.size() && mpos.size() == mw.size() && mpos.size() <= 4096,
       "moves of unequal lengths");
  for (size_t i = 0; i < mpos.size(); ++i)
    need(mpos[i] >= 0 && mpos[i] < window_start && mbucket[i] >= 0 &&
             (mw[i] == 1.f || mw[i] == -1.f),
         "a move outside the far region, or of a weight other than +1 / -1");
  auto outs = graph_step(q, to_far, codes, keys, values, cent, bucket, sink_logits, m, n,
                         n_sinks, window_start, k, cand, scale);  // the checks, the shapes
  const int B = outs[1].shape(0), n_kv = outs[1].shape(1), G = q.shape(1) / n_kv;
  need(fits(int64_t(window_start) * B * n_kv), "context too long for the slot sums");
  Params p{m, n, n_sinks, window_start, k, cand, bool(bucket), bool(sink_logits), scale};
  auto s = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> ins = outs[0].inputs();
  Moves mv{std::move(mpos), std::move(mbucket), std::move(mw)};
  return mx::array::make_arrays(
      {outs[0].shape(), outs[1].shape(), outs[2].shape(), {1}, {B, n_kv, G}},
      {mx::float32, mx::int32, mx::bool_, mx::int32, mx::float32},
      std::make_shared<GraphStep>(s, p, std::move(sums), std::move(mv)), ins);
}

}  // namespace

NB_MODULE(_graph_step, mod) {
  nb::class_<SlotSums>(mod, "SlotSums")
      .def(nb::init<int, int, std::vector<int>>())
      .def_prop_ro("nbytes",
                   [](SlotSums& s) {
                     std::lock_guard<std::mutex> hold(s.mu);
                     return s.nbytes();
                   })
      .def_prop_ro("context",
                   [](SlotSums& s) {
                     std::lock_guard<std::mutex> hold(s.mu);
                     return s.n_done_;
                   })
      .def_prop_ro("rows_used",  // the most rows one (batch, KV head) gives out
                   [](SlotSums& s) {
                     std::lock_guard<std::mutex> hold(s.mu);
                     return s.rows_read() - 1;
                   })
      .def_ro("n_slots", &SlotSums::n_slots_)
      .def_prop_ro("rebuilds",
                   [](SlotSums& s) {
                     std::lock_guard<std::mutex> hold(s.mu);
                     return s.rebuilds_;
                   })
      .def("dense", [](SlotSums& s) {
        // (counts [BH, n_slots], value sums, key sums [BH, n_slots * d]) over every slot, as
        // lists (the tests compare them with SlotRows.dense)
        std::lock_guard<std::mutex> hold(s.mu);
        std::vector<float> counts((size_t)s.BH_ * s.n_slots_, 0.f);
        std::vector<float> vs(counts.size() * s.d_, 0.f), ks(vs.size(), 0.f);
        for (int bh = 0; bh < s.BH_; ++bh)
          for (int r = 0; r < s.used_[bh]; ++r) {
            const size_t from = (size_t)bh * s.rows_ + r;
            const size_t to = (size_t)bh * s.n_slots_ + s.slot_of_[from];
            counts[to] = s.counts_[from];
            std::copy_n(s.vs_.data() + from * s.d_, s.d_, vs.data() + to * s.d_);
            std::copy_n(s.ks_.data() + from * s.d_, s.d_, ks.data() + to * s.d_);
          }
        return std::make_tuple(counts, vs, ks);
      });
  mod.def("step", &graph_step);
  mod.def("estimate", &graph_estimate);
  mod.attr("mlx_version") = A2ATS_MLX_VERSION;
}
