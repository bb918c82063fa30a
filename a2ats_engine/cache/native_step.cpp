// The host decode step of one A2ATS layer after its sync, in one call: lookup tables, far scores,
// top-K (+ rerank), GQA union, and softmax attention over the selected rows. The NumPy step
// (a2ats_engine/cache/host_step.py) makes about forty NumPy calls a layer for the same work, and
// right after MLX's threads ran the layer each of them runs several times slower than warm
// (docs/BENCHMARKS.md, "The step after MLX's layer work"); one compiled call touches far less
// code and no temporaries (what slows them is the layer's weights having pushed the step's
// code and data out of the CPU caches: docs/BENCHMARKS.md, "The host step in C++"). With the
// missed-attention estimate a second call, a2ats_native_attend_estimate, attends after the NumPy
// step moved the slot sums. Python calls them through the module's entries at the end (`step`,
// `estimate`, `recall`, from a2ats_engine/cache/native_step.py): each reads its arrays' buffers
// in place (MLX arrays or NumPy arrays) and checks every shape before the C function reads a
// row; the C functions themselves validate only what indexes their sums (the estimate's slot
// rows, the recall's positions).
//
// Selection rule (the same scores as NumPy's argpartition; among tied scores at the cut the
// lowest far index, where argpartition's choice is arbitrary): the `want` highest of a row.

#ifndef A2ATS_STEP_CORE_ONLY  // graph_step.cpp includes the C functions alone
#include <Python.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__APPLE__)
#define A2ATS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define A2ATS_CLONES
#endif

namespace {

inline float dot(const float* a, const float* b, int d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// One subspace's lookup tables: out[r * ld + c] = centroid c . x_r (c < C, r < R), the C
// centroids row-major of sd numbers, x_r = x + r * xstride. The x86 kernel takes 8 centroids at
// once and sums their 8 accumulators with one horizontal-add tree, where a dot at a time pays
// a horizontal reduction for each dot.
void table_rows_generic(const float* cs, int C, int sd, const float* x, int xstride, int R,
                        float* out, size_t ld) {
  for (int c = 0; c < C; ++c) {
    const float* cc = cs + (size_t)c * sd;
    for (int r = 0; r < R; ++r) out[(size_t)r * ld + c] = dot(cc, x + (size_t)r * xstride, sd);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The 8 dots row_j . x (j < 8, d a multiple of 8) -> [dot_0 .. dot_7]: 8 accumulators, summed
// with one horizontal-add tree.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 dots8_avx2(
    const float* const* row, const float* x, int d) {
  __m256 a[8];
  for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(row[j] + i), xv, a[j]);
  }
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

__attribute__((target("avx2,fma"))) void table_rows_avx2(const float* cs, int C, int sd,
                                                          const float* x, int xstride, int R,
                                                          float* out, size_t ld) {
  const int C8 = C - C % 8;
  for (int c0 = 0; c0 < C8; c0 += 8) {
    const float* cc[8];
    for (int j = 0; j < 8; ++j) cc[j] = cs + (size_t)(c0 + j) * sd;
    for (int r = 0; r < R; ++r)
      _mm256_storeu_ps(out + (size_t)r * ld + c0, dots8_avx2(cc, x + (size_t)r * xstride, sd));
  }
  if (C8 < C) table_rows_generic(cs + (size_t)C8 * sd, C - C8, sd, x, xstride, R, out + C8, ld);
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
const bool has_avx2 = cpu_has_avx2();
#endif

void table_rows(const float* cs, int C, int sd, const float* x, int xstride, int R, float* out,
                size_t ld) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2 && sd % 8 == 0) return table_rows_avx2(cs, C, sd, x, xstride, R, out, ld);
#endif
  table_rows_generic(cs, C, sd, x, xstride, R, out, ld);
}

// out[g * ld + i] = x_g . rows[i] (i < n, g < G; x_g = x + g * d): rows given by address (the
// attended rows of a selection, the rerank's candidates), each read once for the G vectors; on
// x86 8 rows at a time with one horizontal-add tree per 8 dots, as `table_rows`.
void row_dots_generic(const float* const* rows, int n, const float* x, int G, int d, float* out,
                      size_t ld) {
  for (int i = 0; i < n; ++i)
    for (int g = 0; g < G; ++g) out[(size_t)g * ld + i] = dot(rows[i], x + (size_t)g * d, d);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void row_dots_avx2(const float* const* rows, int n,
                                                        const float* x, int G, int d, float* out,
                                                        size_t ld) {
  const int n8 = n - n % 8;
  for (int i0 = 0; i0 < n8; i0 += 8) {
    const float* const* r = rows + i0;
    if (i0 + 16 <= n)
      for (int j = 0; j < 8; ++j) __builtin_prefetch(rows[i0 + 8 + j]);
    for (int g = 0; g < G; ++g)
      _mm256_storeu_ps(out + (size_t)g * ld + i0, dots8_avx2(r, x + (size_t)g * d, d));
  }
  if (n8 < n) row_dots_generic(rows + n8, n - n8, x, G, d, out + n8, ld);
}
#endif

void row_dots(const float* const* rows, int n, const float* x, int G, int d, float* out,
              size_t ld) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2 && d % 8 == 0) return row_dots_avx2(rows, n, x, G, d, out, ld);
#endif
  row_dots_generic(rows, n, x, G, d, out, ld);
}

// Scaled logits of the attended rows of one KV head, a GQA union's repeats at -inf:
// logits[g * M + i] = scale * q_g . keys[pos[i]] (each row read once for the G query heads);
// `rows` is the caller's scratch for the rows' addresses.
void attended_logits(const float* kh, const float* qh, const int32_t* pos, const uint8_t* rep,
                     int M, int G, int d, float scale, float* logits,
                     std::vector<const float*>& rows) {
  rows.resize((size_t)M);
  for (int i = 0; i < M; ++i) rows[i] = kh + (size_t)pos[i] * d;
  row_dots(rows.data(), M, qh, G, d, logits, (size_t)M);
  for (int g = 0; g < G; ++g) {
    float* lg = logits + (size_t)g * M;
    for (int i = 0; i < M; ++i) lg[i] = rep[i] ? -INFINITY : scale * lg[i];
  }
}

// out[g] = sum_i w_gi * values[pos[i]] over the rows that are not repeats (out [G, d], zeroed
// here), each value row read once for the G query heads: w_gi = p[g * M + i], or with `tops`
// exp(p[g * M + i] - tops[g]), summed into dens[g]. Inlined into each C entry, so that it is
// compiled for the entry's target (AVX2 in its x86 clone).
__attribute__((always_inline)) inline void attended_values(const float* vh, const int32_t* pos,
                                                           const uint8_t* rep, int M, int G,
                                                           int d, const float* p,
                                                           const float* tops, float* dens,
                                                           float* out) {
  std::fill(out, out + (size_t)G * d, 0.f);
  for (int i = 0; i < M; ++i) {
    if (rep[i]) continue;
    if (i + 8 < M) __builtin_prefetch(vh + (size_t)pos[i + 8] * d);
    const float* v = vh + (size_t)pos[i] * d;
    for (int g = 0; g < G; ++g) {
      float w = p[(size_t)g * M + i];
      if (tops) {
        w = std::exp(w - tops[g]);
        dens[g] += w;
      }
      float* o = out + (size_t)g * d;
#pragma omp simd
      for (int j = 0; j < d; ++j) o[j] += w * v[j];
    }
  }
}

// A call's scratch (one per thread, grown as needed, never shrunk). The entries bind a
// reference to it once: a thread_local named in a loop is an address lookup each time.
struct Scratch {
  std::vector<float> rq, tables, scores, exact, logits, values, tops, dens, kept;
  std::vector<int> pick, top, merged, at, col, cand;
  std::vector<uint8_t> seen;
  std::vector<const float*> rows;
};
thread_local Scratch step_scratch;

struct EstimateScratch {
  std::vector<float> logits, t, e, got, tops, ests, dens, kd;
  std::vector<int> binned, live;
  std::vector<const float*> rows;
};
thread_local EstimateScratch estimate_scratch;

// The cut of the `want` highest of v[0..n) (want <= n): the want-th highest is the threshold,
// every value above it is kept and, of the values equal to it, the first ones in order; the
// kept ones' indices (or at[i] with `at`), ascending -> out[0..want).
void cut_of(const float* v, const int* at, int n, int want, std::vector<float>& vals, int* out) {
  vals.assign(v, v + n);
  std::nth_element(vals.begin(), vals.begin() + (want - 1), vals.end(), std::greater<float>());
  const float thr = vals[want - 1];
  int ties = want;
  for (int i = 0; i < n; ++i) ties -= v[i] > thr;
  int o = 0;
  for (int i = 0; i < n; ++i)
    if (v[i] > thr || (v[i] == thr && ties-- > 0)) out[o++] = at ? at[i] : i;
}

// Where a row of F scores is long, a strided sample's threshold a little below the want-th
// highest (as `topk.top_indices`): the cut is then taken from the scores at or above it alone.
inline bool sampled_row(int F, int want) { return F >= 1536 && 4 * want <= F; }

// The sample of a row given by `score(t)` (every 16th) -> its threshold, or false on a NaN in
// the sample (before any nth_element: a NaN breaks its ordering).
template <class Score>
bool sample_threshold(Score score, int F, int want, std::vector<float>& vals, float* lo) {
  vals.clear();
  for (int t = 0; t < F; t += 16) vals.push_back(score(t));
  for (const float v : vals)
    if (v != v) return false;
  const int m = (int)vals.size();
  const int j = (int)std::min<long long>(m - 1, (5LL * want * m) / (4LL * F) + 8);
  std::nth_element(vals.begin(), vals.begin() + j, vals.end(), std::greater<float>());
  *lo = vals[j];
  return true;
}

// Indices into s[0..F) of its `want` highest (want <= F), ascending -> out[0..want): one pass
// keeps the scores at or above the sampled threshold with their indices where the row is long
// (else, or where too few are kept, the cut is taken from the whole row). False on a NaN score.
bool top_of(const float* s, int F, int want, Scratch& w, int* out) {
  for (int t = 0; t < F; ++t)
    if (s[t] != s[t]) return false;  // (before any nth_element)
  float lo;
  auto at_t = [s](int t) { return s[t]; };
  if (sampled_row(F, want) && sample_threshold(at_t, F, want, w.values, &lo)) {
    w.kept.clear();
    w.at.clear();
    for (int t = 0; t < F; ++t) {
      if (s[t] >= lo) {
        w.kept.push_back(s[t]);
        w.at.push_back(t);
      }
    }
    if ((int)w.kept.size() >= want) {
      cut_of(w.kept.data(), w.at.data(), (int)w.kept.size(), want, w.values, out);
      return true;
    }
  }
  cut_of(s, nullptr, F, want, w.values, out);
  return true;
}

// The `want` highest far scores of each of the G query heads of one KV head -> w.cand
// [G, want], ascending far indices (top_of on each head's row of far scores gives the same).
// A far token's score is its table entry (tables [G, ldT], bucket `bucket[t]`, summed over the
// S subspaces in order). Where the row is long, each head's sampled threshold comes first, and
// one pass over the far tokens keeps the head's scores at or above it with their indices
// (branch-free: each one is written, and counted where kept); the row of far scores is not
// written out whole. False on a NaN score.
bool far_top(Scratch& w, const float* tables, int G, int ldT, int S, int C,
             const uint16_t* codes, const int32_t* bucket, int F, int want) {
  w.cand.resize((size_t)G * want);
  // each far token's first table column (its bucket's first entry + its first code), once for
  // the G heads
  w.col.resize((size_t)F);
  int* col = w.col.data();
  for (int t = 0; t < F; ++t) col[t] = (bucket ? bucket[t] : 0) * S * C + codes[(size_t)t * S];
  auto score = [=](const float* tg, int t) {
    const uint16_t* code = codes + (size_t)t * S;
    const float* tb = tg + (col[t] - code[0]);  // the token's bucket's tables
    float v = tb[code[0]];
    for (int s = 1; s < S; ++s) v += tb[(size_t)s * C + code[s]];
    return v;
  };
  const bool sampled = sampled_row(F, want);
  if (sampled && w.kept.size() < (size_t)F) {
    w.kept.resize((size_t)F);
    w.at.resize((size_t)F);
  }
  for (int g = 0; g < G; ++g) {
    const float* tg = tables + (size_t)g * ldT;
    int* out = w.cand.data() + (size_t)g * want;
    float lo;
    if (sampled) {
      if (!sample_threshold([&](int t) { return score(tg, t); }, F, want, w.values, &lo))
        return false;
      float* kept = w.kept.data();
      int* at = w.at.data();
      int n = 0;
      bool nan = false;
      auto keep = [&](auto score_t) {  // one pass (the one-subspace score given inline)
        for (int t = 0; t < F; ++t) {
          const float v = score_t(t);
          kept[n] = v;
          at[n] = t;
          n += v >= lo;
          nan |= v != v;
        }
      };
      if (S == 1)
        keep([&](int t) { return tg[col[t]]; });
      else
        keep([&](int t) { return score(tg, t); });
      if (nan) return false;
      if (n >= want) {
        cut_of(kept, at, n, want, w.values, out);
        continue;
      }
    }
    w.scores.resize((size_t)F);  // a short row, or too few kept: the cut over the whole row
    for (int t = 0; t < F; ++t) w.scores[t] = score(tg, t);
    if (!top_of(w.scores.data(), F, want, w, out)) return false;
  }
  return true;
}

}  // namespace

// Shapes (all C-contiguous; float32 unless said):
//   q [B, n_kv, G, d] post-RoPE queries; to_far [d, ld] whose first m * d columns are the
//   step's rotations to the m distance buckets used; centroids [n_kv, S, C, sd] (the layer's
//   scoring centroids); codes uint16 [B, n_kv, cap, S]; bucket int32 [F] or null
//   (m == 1); keys / values [B, n_kv, cap, d]; sink_logits [n_kv * G] or null.
// Far region [n_sinks, window_start), F = window_start - n_sinks >= k; cand > k reranks the
// top `cand` by their exact scores. Outputs: out [B, n_kv, G, d]; positions int32 and repeat
// uint8 [B, n_kv, M], M = n_sinks + G * k + (n - window_start) (`NumpyTopK.select_host`'s);
// out null: the selection only.
// Returns the far tokens retrieved (distinct over KV heads, summed over the batch), or -1
// where a score is NaN (nothing written that the caller keeps: it takes the NumPy step).
extern "C" A2ATS_CLONES long a2ats_native_step(
    int B, int n_kv, int G, int d, int m, int S, int C, const float* q, const float* to_far,
    int ld, const float* centroids, const uint16_t* codes, const int32_t* bucket,
    const float* keys, const float* values, const float* sink_logits, int cap, int n,
    int n_sinks, int window_start, int k, int cand, float scale, float* out, int32_t* positions,
    uint8_t* repeat) {
  const int F = window_start - n_sinks;
  const int n_win = n - window_start;
  const int M = n_sinks + G * k + n_win;
  const int sd = d / S;
  Scratch& w = step_scratch;
  w.rq.assign((size_t)G * m * d, 0.f);
  w.tables.resize((size_t)G * m * S * C);
  w.logits.resize((size_t)G * M);
  w.top.resize((size_t)G * k);
  long retrieved = 0;
  for (int b = 0; b < B; ++b) {
    w.seen.assign((size_t)F, 0);
    for (int h = 0; h < n_kv; ++h) {
      const size_t bh = (size_t)b * n_kv + h;
      const float* qh = q + bh * G * d;
      const float* kh = keys + bh * cap * d;
      const float* vh = values + bh * cap * d;
      const uint16_t* ch = codes + bh * cap * S;
      // the queries rotated to each bucket's distance: rq[g, bk, :] = q[g] @ to_far[:, bk]
      std::fill(w.rq.begin(), w.rq.end(), 0.f);
      for (int g = 0; g < G; ++g) {
        float* dst = w.rq.data() + (size_t)g * m * d;
        for (int i = 0; i < d; ++i) {
          const float a = qh[(size_t)g * d + i];
          const float* row = to_far + (size_t)i * ld;
#pragma omp simd
          for (int j = 0; j < m * d; ++j) dst[j] += a * row[j];
        }
      }
      // lookup tables [g, bk, s, c]: each subspace's slice of rq against its centroids
      for (int s = 0; s < S; ++s)
        table_rows(centroids + ((size_t)h * S + s) * C * sd, C, sd, w.rq.data() + (size_t)s * sd,
                   d, G * m, w.tables.data() + (size_t)s * C, (size_t)S * C);
      // each query head's `want` highest far scores (the rerank's candidates, or the top K)
      const int want = cand > k ? cand : k;
      if (!far_top(w, w.tables.data(), G, m * S * C, S, C, ch + (size_t)n_sinks * S, bucket, F,
                   want))
        return -1;
      for (int g = 0; g < G; ++g) {
        const int* idx = w.cand.data() + (size_t)g * want;
        int* dst = w.top.data() + (size_t)g * k;
        if (cand > k) {
          w.exact.resize(cand);
          w.rows.resize(cand);
          w.pick.resize(k);
          for (int j = 0; j < cand; ++j) w.rows[j] = kh + (size_t)(n_sinks + idx[j]) * d;
          row_dots(w.rows.data(), cand, qh + (size_t)g * d, 1, d, w.exact.data(), (size_t)cand);
          if (!top_of(w.exact.data(), cand, k, w, w.pick.data())) return -1;
          for (int j = 0; j < k; ++j) dst[j] = idx[w.pick[j]];
        } else {
          std::copy(idx, idx + k, dst);
        }
      }
      // the GQA union, sorted (its repeats marked), between the sinks and the window: each
      // head's K are ascending, merged
      for (int g = 1; g < G; ++g) {
        w.merged.resize((size_t)(g + 1) * k);
        std::merge(w.top.begin(), w.top.begin() + (size_t)g * k, w.top.begin() + (size_t)g * k,
                   w.top.begin() + (size_t)(g + 1) * k, w.merged.begin());
        std::copy(w.merged.begin(), w.merged.end(), w.top.begin());
      }
      int32_t* pos = positions + bh * M;
      uint8_t* rep = repeat + bh * M;
      for (int i = 0; i < n_sinks; ++i) pos[i] = i, rep[i] = 0;
      for (int i = 0; i < G * k; ++i) {
        pos[n_sinks + i] = w.top[i] + n_sinks;
        rep[n_sinks + i] = i > 0 && w.top[i] == w.top[i - 1];
        if (!rep[n_sinks + i]) {  // a far token retrieved in this batch row: counted once
          retrieved += !w.seen[w.top[i]];
          w.seen[w.top[i]] = 1;
        }
      }
      for (int i = 0; i < n_win; ++i) pos[n_sinks + G * k + i] = window_start + i;
      std::fill(rep + n_sinks + G * k, rep + M, 0);
      if (!out) continue;  // the caller attends (the missed-attention estimate)
      // softmax attention: each attended row read once for the G query heads
      w.tops.assign(G, -INFINITY);
      w.dens.assign(G, 0.f);
      if (sink_logits) {
        for (int g = 0; g < G; ++g) w.tops[g] = sink_logits[h * G + g];
      }
      attended_logits(kh, qh, pos, rep, M, G, d, scale, w.logits.data(), w.rows);
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < M; ++i) w.tops[g] = std::max(w.tops[g], w.logits[(size_t)g * M + i]);
      float* oh = out + bh * G * d;
      attended_values(vh, pos, rep, M, G, d, w.logits.data(), w.tops.data(), w.dens.data(), oh);
      for (int g = 0; g < G; ++g) {
        float den = w.dens[g];
        if (sink_logits) den += std::exp(sink_logits[h * G + g] - w.tops[g]);
        const float inv = 1.f / den;
        float* o = oh + (size_t)g * d;
        for (int j = 0; j < d; ++j) o[j] *= inv;
      }
    }
  }
  return retrieved;
}

// Softmax attention over a selection (a2ats_native_step's positions / repeat) with the
// missed-attention estimate, mean slot scores (host_step.attention_with_estimate with key sums):
// each occupied slot's far tokens not retrieved enter the softmax as one term, scored by their
// mean key, `(q . key_sum - the retrieved tokens' exact scores) / (count - retrieved)`, weighted
// by that count, contributing their summed values.
// Shapes: q [B, n_kv, G, d]; keys / values [B, n_kv, cap, d] (the cache's rows); positions int32
// and repeat uint8 [B, n_kv, M]; the union's columns [u0, u0 + U); row_at int32 [B, n_kv, P]
// (strides ra_b, ra_h in elements) the row (in counts / sums / key_sums) of each far position's
// slot (`SlotRows.row_at`); counts [B, n_kv, R] float32,
// sums and key_sums [B, n_kv, R, d], the strides of their first two dimensions in elements
// (cs_b, cs_h; ss_b, ss_h; a row of d numbers after another), the last row R - 1 empty (the bin
// of the union's repeats); sink_logits [n_kv * G] or null. Outputs: out [B, n_kv, G, d], share
// [B, n_kv, G] (the estimated share of the softmax mass). Returns 0, or -1 where a union
// column's position is outside [0, P) or its row outside [0, R) (nothing written that the
// caller keeps).
extern "C" A2ATS_CLONES int a2ats_native_attend_estimate(
    int B, int n_kv, int G, int d, int cap, int M, int u0, int U, int R, const float* q,
    const float* keys, const float* values, const int32_t* positions, const uint8_t* repeat,
    const int32_t* row_at, long ra_b, long ra_h, int P, const float* counts, long cs_b,
    long cs_h, const float* sums,
    const float* key_sums, long ss_b, long ss_h, const float* sink_logits, float scale,
    float* out, float* share) {
  // Every row (attended, key sum, value sum) is read once for the group's G query heads, and
  // a slot row with no far token left unretrieved is skipped.
  EstimateScratch& x = estimate_scratch;
  std::vector<float>&logits = x.logits, &t = x.t, &e = x.e, &got = x.got, &tops = x.tops;
  std::vector<float>&ests = x.ests, &dens = x.dens, &kd = x.kd;
  std::vector<int>&binned = x.binned, &live = x.live;
  logits.resize((size_t)G * M);
  t.resize((size_t)G * R);
  e.resize((size_t)G * R);
  kd.resize((size_t)G * R);
  got.resize((size_t)R);
  binned.resize((size_t)U);
  tops.resize(G);
  ests.resize(G);
  dens.resize(G);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_kv; ++h) {
      const size_t bh = (size_t)b * n_kv + h;
      const float* qh = q + bh * G * d;
      const float* kh = keys + bh * cap * d;
      const float* vh = values + bh * cap * d;
      const int32_t* pos = positions + bh * M;
      const uint8_t* rep = repeat + bh * M;
      const float* cnt = counts + b * cs_b + h * cs_h;
      const float* vs = sums + b * ss_b + h * ss_h;
      const float* ks = key_sums + b * ss_b + h * ss_h;
      attended_logits(kh, qh, pos, rep, M, G, d, scale, logits.data(), x.rows);
      // each union column's row (a repeat's: the empty last row), the retrieved per row
      std::fill(got.begin(), got.end(), 0.f);
      for (int u = 0; u < U; ++u) {
        const int32_t p = pos[u0 + u];
        if (p < 0 || p >= P) return -1;
        const int32_t row = rep[u0 + u] ? R - 1 : row_at[b * ra_b + h * ra_h + p];
        if (row < 0 || row >= R) return -1;
        binned[u] = (int)row;
        got[row] += 1.f;
      }
      // the retrieved tokens' exact scores summed per row (t, [R, G]), taken from the row's
      // key sum: t = (q . key_sum - retrieved) / left, or -inf where nothing is left
      std::fill(t.begin(), t.end(), 0.f);
      for (int u = 0; u < U; ++u)
        if (!rep[u0 + u])
          for (int g = 0; g < G; ++g) t[(size_t)binned[u] * G + g] += logits[(size_t)g * M + u0 + u];
      table_rows(ks, R, d, qh, d, G, kd.data(), (size_t)R);  // kd[g, r] = key_sum_r . q_g
      live.clear();
      for (int g = 0; g < G; ++g) tops[g] = -INFINITY;
      for (int r = 0; r < R; ++r) {
        const float left = cnt[r] - got[r];
        float* tr = t.data() + (size_t)r * G;
        if (!(left > 0.f)) {
          for (int g = 0; g < G; ++g) tr[g] = -INFINITY;
          continue;
        }
        live.push_back(r);
        const float inv = 1.f / std::max(left, 1.f);
        for (int g = 0; g < G; ++g) {
          tr[g] = (scale * kd[(size_t)g * R + r] - tr[g]) * inv;
          tops[g] = std::max(tops[g], tr[g]);
        }
      }
      for (int g = 0; g < G; ++g) {
        const float* lg = logits.data() + (size_t)g * M;
        for (int i = 0; i < M; ++i) tops[g] = std::max(tops[g], lg[i]);
        if (sink_logits) tops[g] = std::max(tops[g], sink_logits[h * G + g]);
        ests[g] = 0.f;
        dens[g] = 0.f;
      }
      // each live row's weight exp(t - top) (e, [R, G]; 0 elsewhere) and the estimated mass
      std::fill(e.begin(), e.end(), 0.f);
      for (const int r : live) {
        for (int g = 0; g < G; ++g) {
          const float w = std::exp(t[(size_t)r * G + g] - tops[g]);
          e[(size_t)r * G + g] = w;
          ests[g] += w * cnt[r];
        }
      }
      // the attended rows' weights (in logits), each retrieved token taken out of its slot's
      // term, then each attended value row read once
      for (int g = 0; g < G; ++g) {
        float* lg = logits.data() + (size_t)g * M;
        for (int i = 0; i < M; ++i) {
          if (rep[i]) {
            lg[i] = 0.f;
            continue;
          }
          float p = std::exp(lg[i] - tops[g]);
          dens[g] += p;
          if (i >= u0 && i < u0 + U) {  // this token leaves its slot's term
            const float own = e[(size_t)binned[i - u0] * G + g];
            ests[g] -= own;
            p -= own;
          }
          lg[i] = p;
        }
      }
      float* oh = out + bh * G * d;
      attended_values(vh, pos, rep, M, G, d, logits.data(), nullptr, nullptr, oh);
      for (const int r : live) {
        const float* v = vs + (size_t)r * d;
        for (int g = 0; g < G; ++g) {
          const float w = e[(size_t)r * G + g];
          if (w == 0.f) continue;
          float* o = oh + (size_t)g * d;
#pragma omp simd
          for (int j = 0; j < d; ++j) o[j] += w * v[j];
        }
      }
      for (int g = 0; g < G; ++g) {
        const float est = std::max(ests[g], 0.f);
        float den = dens[g] + est;
        if (sink_logits) den += std::exp(sink_logits[h * G + g] - tops[g]);
        const float inv = 1.f / den;
        float* o = oh + (size_t)g * d;
        for (int j = 0; j < d; ++j) o[j] *= inv;
        share[bh * G + g] = est * inv;
      }
    }
  }
  return 0;
}

// The exact attention mass on a selection (layer_stats.attention_recall, the inspector's shadow
// selection): for each (b, h), the softmax over the n rows held of scale * q_g . keys[i], summed
// over the selection's positions that are not repeats, averaged over the G query heads. Each
// row is read once for the G heads. Shapes: q [B, n_kv, G, d]; keys [B, n_kv, cap, d];
// positions int32 and repeat uint8 [B, n_kv, M]. Output: mass [B, n_kv]. Returns 0, or -1
// where a position is outside [0, n) (nothing written that the caller keeps).
extern "C" A2ATS_CLONES int a2ats_native_recall(int B, int n_kv, int G, int d, int cap, int n,
                                                int M, const float* q, const float* keys,
                                                const int32_t* positions,
                                                const uint8_t* repeat, float scale,
                                                float* mass) {
  Scratch& w = step_scratch;
  w.logits.resize((size_t)G * n);
  w.rows.resize((size_t)n);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_kv; ++h) {
      const size_t bh = (size_t)b * n_kv + h;
      const float* kh = keys + bh * cap * d;
      const int32_t* pos = positions + bh * M;
      const uint8_t* rep = repeat + bh * M;
      for (int i = 0; i < n; ++i) w.rows[i] = kh + (size_t)i * d;
      row_dots(w.rows.data(), n, q + bh * G * d, G, d, w.logits.data(), (size_t)n);
      double total = 0.0;
      for (int g = 0; g < G; ++g) {
        float* lg = w.logits.data() + (size_t)g * n;
        float top = -INFINITY;
        for (int i = 0; i < n; ++i) top = std::max(top, lg[i] *= scale);
        double den = 0.0, kept = 0.0;
        for (int i = 0; i < n; ++i) den += (lg[i] = std::exp(lg[i] - top));
        for (int j = 0; j < M; ++j) {
          if (pos[j] < 0 || pos[j] >= n) return -1;
          if (!rep[j]) kept += lg[pos[j]];
        }
        total += kept / den;
      }
      mass[bh] = (float)(total / G);
    }
  }
  return 0;
}

#ifndef A2ATS_STEP_CORE_ONLY
namespace {

// A buffer of the step, released when the call returns.
struct Buf {
  Py_buffer v{};
  bool held = false;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (held) PyBuffer_Release(&v);
  }
};

// The format's type letter, without a native byte-order prefix ("f", "=f", "<f" on x86 / arm64),
// or 0 where it is anything else.
char type_letter(const char* fmt) {
  if (!fmt) return 'B';
  if (*fmt == '@' || *fmt == '=' || *fmt == '<') ++fmt;
  return fmt[0] && !fmt[1] ? fmt[0] : 0;
}

// Take `o`'s buffer into `b`: of element type `letter` (itemsize bytes), `ndim` dimensions (or
// any where ndim < 0), writable where asked. false with a Python error set where it is not such
// a buffer; `*strided` set (and nothing else) where it is one but not C-contiguous.
bool take(PyObject* o, Buf& b, const char* name, char letter, Py_ssize_t itemsize, int ndim,
          bool writable, bool* strided) {
  const char* type = letter == 'f' ? "float32" : letter == 'H' ? "uint16"
                     : letter == 'i' ? "int32" : "bool";
  const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(o, &b.v, flags) < 0) {
    PyErr_Format(PyExc_ValueError, "native step: %s are not a%s buffer", name,
                 writable ? " writable" : "");
    return false;
  }
  b.held = true;
  if (type_letter(b.v.format) != letter || b.v.itemsize != itemsize) {
    PyErr_Format(PyExc_ValueError, "native step: %s are not %s (buffer format %s)", name, type,
                 b.v.format ? b.v.format : "B");
    return false;
  }
  if (ndim >= 0 && b.v.ndim != ndim) {
    PyErr_Format(PyExc_ValueError, "native step: %s have %d dimensions, not %d", name,
                 b.v.ndim, ndim);
    return false;
  }
  if (!PyBuffer_IsContiguous(&b.v, 'C')) *strided = true;
  return true;
}

bool shape_is(const Buf& b, std::initializer_list<Py_ssize_t> want) {
  int i = 0;
  for (Py_ssize_t w : want)
    if (b.v.shape[i++] != w) return false;
  return true;
}

bool fits_int(Py_ssize_t x) { return x >= 0 && x <= (Py_ssize_t)(1 << 30); }

bool read_ints(PyObject* const* args, int count, long* out) {
  for (int i = 0; i < count; ++i) {
    out[i] = PyLong_AsLong(args[i]);
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

}  // namespace

// The step from Python in one call (a2ats_engine/cache/native_step.py, `run`):
// step(queries, to_far, codes, keys, values, centroids, bucket, sink_logits, out, positions,
//      repeat, m, n, n_sinks, window_start, k, cand, scale) -> the far tokens retrieved, -1 where
// a score is NaN, -2 where the queries, rotations, codes, keys, values or centroids are not
// C-contiguous (the caller takes the NumPy step: a trimmed cache's rows read in place). Any
// buffer (MLX arrays, NumPy arrays): queries float32 [B, n_q, 1, d] or [B, n_kv, G, d]
// (n_q = n_kv * G), to_far float32 [d, ld >= m * d], codes uint16 [B, n_kv, cap, S], keys /
// values float32 [B, n_kv, cap, d], centroids float32 [n_kv, S, C, d / S], bucket None or int32
// [F] each in [0, m), sink_logits None or float32 of n_kv * G, out None or writable float32
// [B, n_kv, G, d], positions writable int32 and repeat writable bool [B, n_kv, M]. Every shape
// is checked here (a ValueError names the one that does not fit) before a2ats_native_step
// reads a row; the compute runs without the GIL.
static PyObject* py_step(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 18) {
    PyErr_SetString(PyExc_TypeError, "native step: 18 arguments");
    return nullptr;
  }
  long iv[6];
  if (!read_ints(args + 11, 6, iv)) return nullptr;
  const double scale = PyFloat_AsDouble(args[17]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  const long m = iv[0], n = iv[1], n_sinks = iv[2], window_start = iv[3], k = iv[4], cand = iv[5];
  Buf q, to_far, codes, keys, values, cent, bucket, sinks, out, positions, repeat;
  bool strided = false, fixed = false;  // fixed: a buffer that must be C-contiguous is not
  if (!take(args[0], q, "queries", 'f', 4, 4, false, &strided) ||
      !take(args[2], codes, "codes", 'H', 2, 4, false, &strided) ||
      !take(args[3], keys, "keys", 'f', 4, 4, false, &strided) ||
      !take(args[4], values, "values", 'f', 4, 4, false, &strided) ||
      !take(args[1], to_far, "rotations", 'f', 4, 2, false, &strided) ||
      !take(args[5], cent, "centroids", 'f', 4, 4, false, &strided) ||
      (args[6] != Py_None && !take(args[6], bucket, "buckets", 'i', 4, 1, false, &fixed)) ||
      (args[7] != Py_None && !take(args[7], sinks, "sink logits", 'f', 4, -1, false, &fixed)) ||
      (args[8] != Py_None && !take(args[8], out, "out", 'f', 4, 4, true, &fixed)) ||
      !take(args[9], positions, "positions", 'i', 4, 3, true, &fixed) ||
      !take(args[10], repeat, "repeat", '?', 1, 3, true, &fixed))
    return nullptr;
  if (fixed) {
    PyErr_SetString(PyExc_ValueError,
                    "native step: buckets, sink logits and outputs must be C-contiguous");
    return nullptr;
  }
  if (strided) return PyLong_FromLong(-2);
  const Py_ssize_t B = codes.v.shape[0], n_kv = codes.v.shape[1], cap = codes.v.shape[2],
                   S = codes.v.shape[3], d = keys.v.shape[3],
                   n_q = q.v.shape[1] * q.v.shape[2], C = cent.v.shape[2];
  const Py_ssize_t G = n_kv > 0 ? n_q / n_kv : 0, F = window_start - n_sinks;
  const Py_ssize_t M = n_sinks + G * k + (n - window_start);
  if (!(B > 0 && n_kv > 0 && G > 0 && S > 0 && d > 0 && C > 0 && n_q == n_kv * G && d % S == 0 &&
        fits_int(B) && fits_int(n_kv) && fits_int(cap) && fits_int(d) && fits_int(C) &&
        fits_int(n_q) && q.v.shape[0] == B && q.v.shape[3] == d &&
        shape_is(keys, {B, n_kv, cap, d}) &&
        shape_is(values, {B, n_kv, cap, d}) && shape_is(cent, {n_kv, S, C, d / S}) &&
        C <= 65536)) {
    PyErr_SetString(PyExc_ValueError, "native step: queries, codes, keys, values and centroids "
                                      "do not share batch, KV heads, capacity and head dim");
    return nullptr;
  }
  if (!(m >= 1 && m <= 4096 && to_far.v.shape[0] == d && to_far.v.shape[1] >= m * d &&
        fits_int(to_far.v.shape[1]) && fits_int(G * m * S * C))) {  // the tables' floats
    PyErr_SetString(PyExc_ValueError, "native step: rotations do not fit the buckets used");
    return nullptr;
  }
  if (!(n_sinks >= 0 && window_start >= n_sinks && n >= window_start && n <= cap && k >= 1 &&
        k <= F && cand >= 0 && cand <= F && fits_int(M))) {
    PyErr_SetString(PyExc_ValueError, "native step: context, sinks, window or budget out of range");
    return nullptr;
  }
  if (bucket.held) {
    const int32_t* bk = static_cast<const int32_t*>(bucket.v.buf);
    bool ok = bucket.v.shape[0] == F;
    for (Py_ssize_t t = 0; ok && t < F; ++t) ok = bk[t] >= 0 && bk[t] < m;
    if (!ok) {
      PyErr_SetString(PyExc_ValueError, "native step: distance buckets do not fit the tables");
      return nullptr;
    }
  } else if (m != 1) {
    PyErr_SetString(PyExc_ValueError, "native step: several buckets used but no distance buckets");
    return nullptr;
  }
  if (sinks.held && sinks.v.len != n_q * 4) {
    PyErr_SetString(PyExc_ValueError, "native step: sink logits are not one per query head");
    return nullptr;
  }
  if ((out.held && !shape_is(out, {B, n_kv, G, d})) || !shape_is(positions, {B, n_kv, M}) ||
      !shape_is(repeat, {B, n_kv, M})) {
    PyErr_SetString(PyExc_ValueError, "native step: outputs of the wrong shape");
    return nullptr;
  }
  long got;
  Py_BEGIN_ALLOW_THREADS;
  got = a2ats_native_step(
      (int)B, (int)n_kv, (int)G, (int)d, (int)m, (int)S, (int)C,
      static_cast<const float*>(q.v.buf), static_cast<const float*>(to_far.v.buf),
      (int)to_far.v.shape[1], static_cast<const float*>(cent.v.buf),
      static_cast<const uint16_t*>(codes.v.buf),
      bucket.held ? static_cast<const int32_t*>(bucket.v.buf) : nullptr,
      static_cast<const float*>(keys.v.buf), static_cast<const float*>(values.v.buf),
      sinks.held ? static_cast<const float*>(sinks.v.buf) : nullptr, (int)cap, (int)n,
      (int)n_sinks, (int)window_start, (int)k, (int)cand, (float)scale,
      out.held ? static_cast<float*>(out.v.buf) : nullptr,
      static_cast<int32_t*>(positions.v.buf), static_cast<uint8_t*>(repeat.v.buf));
  Py_END_ALLOW_THREADS;
  return PyLong_FromLong(got);
}

namespace {

// The element stride of dimension i (bytes / itemsize), or -1 where it is not a whole number.
long elems(const Buf& b, int i) {
  const Py_ssize_t s = b.v.strides[i];
  return s % b.v.itemsize ? -1 : (long)(s / b.v.itemsize);
}

// q [B, n_q, 1, d] or [B, n_kv, G, d] of `B`, `n_kv` heads and head dim `d` -> G, or 0.
Py_ssize_t groups(const Buf& q, Py_ssize_t B, Py_ssize_t n_kv, Py_ssize_t d) {
  const Py_ssize_t n_q = q.v.shape[1] * q.v.shape[2];
  if (q.v.shape[0] != B || q.v.shape[3] != d || n_kv <= 0 || n_q % n_kv) return 0;
  return n_q / n_kv;
}

}  // namespace

// a2ats_native_attend_estimate from Python: estimate(queries, keys, values, positions, repeat,
// counts, sums, key_sums, row_at, sink_logits, out, share, n_sinks, n_window, scale) -> 0, or
// -2 where the queries, rows or selection are not C-contiguous, or the slot rows' last
// dimensions not packed (the caller's NumPy attention takes them). Buffers: queries float32
// [B, n_q, 1, d] or [B, n_kv, G, d]; keys / values float32 [B, n_kv, cap, d]; positions int32
// and repeat bool [B, n_kv, M] (the step's); counts float32 [B, n_kv, R]; sums and key_sums
// float32 [B, n_kv, R, d] (the same strides); row_at int32 [B, n_kv, P]; sink_logits None or
// n_q float32; out float32 [B, n_kv, G, d] and share float32 [B, n_kv, G], writable. The union
// is the columns [n_sinks, M - n_window). A ValueError names what does not fit, or a union
// column whose position or slot row is out of range.
static PyObject* py_estimate(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 15) {
    PyErr_SetString(PyExc_TypeError, "native estimate: 15 arguments");
    return nullptr;
  }
  long iv[2];
  if (!read_ints(args + 12, 2, iv)) return nullptr;
  const double scale = PyFloat_AsDouble(args[14]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  Buf q, keys, values, positions, repeat, counts, sums, key_sums, row_at, sinks, out, share;
  bool strided = false, fixed = false, rows = false;  // rows: slot rows taken with any strides
  if (!take(args[0], q, "queries", 'f', 4, 4, false, &strided) ||
      !take(args[1], keys, "keys", 'f', 4, 4, false, &strided) ||
      !take(args[2], values, "values", 'f', 4, 4, false, &strided) ||
      !take(args[3], positions, "positions", 'i', 4, 3, false, &strided) ||
      !take(args[4], repeat, "repeat", '?', 1, 3, false, &strided) ||
      !take(args[5], counts, "counts", 'f', 4, 3, false, &rows) ||
      !take(args[6], sums, "sums", 'f', 4, 4, false, &rows) ||
      (args[7] == Py_None && (PyErr_SetString(PyExc_ValueError, "native estimate: key sums "
                                              "(the mean-key scores)"), true)) ||
      !take(args[7], key_sums, "key sums", 'f', 4, 4, false, &rows) ||
      !take(args[8], row_at, "slot rows", 'i', 4, 3, false, &rows) ||
      (args[9] != Py_None && !take(args[9], sinks, "sink logits", 'f', 4, -1, false, &fixed)) ||
      !take(args[10], out, "out", 'f', 4, 4, true, &fixed) ||
      !take(args[11], share, "share", 'f', 4, 3, true, &fixed))
    return nullptr;
  if (fixed) {
    PyErr_SetString(PyExc_ValueError, "native estimate: sink logits and outputs must be "
                                      "C-contiguous");
    return nullptr;
  }
  const Py_ssize_t B = keys.v.shape[0], n_kv = keys.v.shape[1], cap = keys.v.shape[2],
                   d = keys.v.shape[3], M = positions.v.shape[2], R = counts.v.shape[2],
                   P = row_at.v.shape[2];
  const Py_ssize_t G = groups(q, B, n_kv, d);
  const Py_ssize_t U = M - iv[0] - iv[1];
  if (!(G > 0 && shape_is(values, {B, n_kv, cap, d}) && shape_is(positions, {B, n_kv, M}) &&
        shape_is(repeat, {B, n_kv, M}) && shape_is(counts, {B, n_kv, R}) &&
        shape_is(sums, {B, n_kv, R, d}) && shape_is(key_sums, {B, n_kv, R, d}) &&
        row_at.v.shape[0] == B && row_at.v.shape[1] == n_kv && R >= 1 && iv[0] >= 0 &&
        iv[1] >= 0 && U >= 0 && fits_int(B) && fits_int(n_kv) && fits_int(cap) &&
        fits_int(d) && fits_int(M) && fits_int(R) && fits_int(P) && fits_int(G))) {
    PyErr_SetString(PyExc_ValueError, "native estimate: queries, rows, selection and slot rows "
                                      "do not share batch, KV heads, head dim and columns");
    return nullptr;
  }
  if ((sinks.held && sinks.v.len != n_kv * G * 4) || !shape_is(out, {B, n_kv, G, d}) ||
      !shape_is(share, {B, n_kv, G})) {
    PyErr_SetString(PyExc_ValueError, "native estimate: sink logits or outputs of the wrong "
                                      "shape");
    return nullptr;
  }
  if (strided) return PyLong_FromLong(-2);
  const long cs_b = elems(counts, 0), cs_h = elems(counts, 1), ss_b = elems(sums, 0),
             ss_h = elems(sums, 1), ra_b = elems(row_at, 0), ra_h = elems(row_at, 1);
  if (elems(counts, 2) != 1 || elems(row_at, 2) != 1 || elems(sums, 3) != 1 ||
      elems(sums, 2) != d || cs_b < 0 || cs_h < 0 || ss_b < 0 || ss_h < 0 || ra_b < 0 ||
      ra_h < 0 || key_sums.v.strides[0] != sums.v.strides[0] ||
      key_sums.v.strides[1] != sums.v.strides[1] || key_sums.v.strides[2] != sums.v.strides[2] ||
      key_sums.v.strides[3] != sums.v.strides[3])
    return PyLong_FromLong(-2);
  int bad;
  Py_BEGIN_ALLOW_THREADS;
  bad = a2ats_native_attend_estimate(
      (int)B, (int)n_kv, (int)G, (int)d, (int)cap, (int)M, (int)iv[0], (int)U, (int)R,
      static_cast<const float*>(q.v.buf), static_cast<const float*>(keys.v.buf),
      static_cast<const float*>(values.v.buf), static_cast<const int32_t*>(positions.v.buf),
      static_cast<const uint8_t*>(repeat.v.buf), static_cast<const int32_t*>(row_at.v.buf),
      ra_b, ra_h, (int)P, static_cast<const float*>(counts.v.buf), cs_b, cs_h,
      static_cast<const float*>(sums.v.buf), static_cast<const float*>(key_sums.v.buf), ss_b,
      ss_h, sinks.held ? static_cast<const float*>(sinks.v.buf) : nullptr, (float)scale,
      static_cast<float*>(out.v.buf), static_cast<float*>(share.v.buf));
  Py_END_ALLOW_THREADS;
  if (bad) {
    PyErr_SetString(PyExc_ValueError, "native estimate: a retrieved column's position or slot "
                                      "row is out of range");
    return nullptr;
  }
  return PyLong_FromLong(0);
}

// a2ats_native_recall from Python: recall(queries, keys, n, positions, repeat, scale, mass) ->
// None. Buffers, all C-contiguous: queries float32 [B, n_q, 1, d] or [B, n_kv, G, d]; keys
// float32 [B, n_kv, cap, d] (the first n rows held, 0 < n <= cap); positions int32 and repeat
// bool [B, n_kv, M]; mass float32 [B, n_kv], writable. A ValueError names what does not fit,
// or a selected position outside the n rows.
static PyObject* py_recall(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "native recall: 7 arguments");
    return nullptr;
  }
  long n;
  if (!read_ints(args + 2, 1, &n)) return nullptr;
  const double scale = PyFloat_AsDouble(args[5]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  Buf q, keys, positions, repeat, mass;
  bool strided = false;
  if (!take(args[0], q, "queries", 'f', 4, 4, false, &strided) ||
      !take(args[1], keys, "keys", 'f', 4, 4, false, &strided) ||
      !take(args[3], positions, "positions", 'i', 4, 3, false, &strided) ||
      !take(args[4], repeat, "repeat", '?', 1, 3, false, &strided) ||
      !take(args[6], mass, "mass", 'f', 4, 2, true, &strided))
    return nullptr;
  if (strided) {
    PyErr_SetString(PyExc_ValueError, "native recall: C-contiguous arrays");
    return nullptr;
  }
  const Py_ssize_t B = keys.v.shape[0], n_kv = keys.v.shape[1], cap = keys.v.shape[2],
                   d = keys.v.shape[3], M = positions.v.shape[2];
  const Py_ssize_t G = groups(q, B, n_kv, d);
  if (!(G > 0 && n > 0 && n <= cap && shape_is(positions, {B, n_kv, M}) &&
        shape_is(repeat, {B, n_kv, M}) && shape_is(mass, {B, n_kv}) && fits_int(B) &&
        fits_int(n_kv) && fits_int(cap) && fits_int(d) && fits_int(M) && fits_int(G))) {
    PyErr_SetString(PyExc_ValueError, "native recall: shapes of queries, keys, selection and "
                                      "context do not fit");
    return nullptr;
  }
  int bad;
  Py_BEGIN_ALLOW_THREADS;
  bad = a2ats_native_recall((int)B, (int)n_kv, (int)G, (int)d, (int)cap, (int)n, (int)M,
                            static_cast<const float*>(q.v.buf),
                            static_cast<const float*>(keys.v.buf),
                            static_cast<const int32_t*>(positions.v.buf),
                            static_cast<const uint8_t*>(repeat.v.buf), (float)scale,
                            static_cast<float*>(mass.v.buf));
  Py_END_ALLOW_THREADS;
  if (bad) {
    PyErr_Format(PyExc_ValueError, "native recall: a selected position is outside the %ld rows "
                 "held", n);
    return nullptr;
  }
  Py_RETURN_NONE;
}

static PyMethodDef native_methods[] = {
    {"step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_step)),
     METH_FASTCALL, "The host decode step of one layer (see native_step.cpp)."},
    {"estimate", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_estimate)),
     METH_FASTCALL, "The attention with the missed-attention estimate (see native_step.cpp)."},
    {"recall", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_recall)),
     METH_FASTCALL, "The exact attention mass on a selection (see native_step.cpp)."},
    {nullptr, nullptr, 0, nullptr}};

// The module: `step`, `estimate` and `recall` above, each checking its buffers before the C
// function it calls reads a row.
static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native_step",
    "The A2ATS host decode step in C++ (a2ats_engine/cache/native_step.py loads it).", -1,
    native_methods};

PyMODINIT_FUNC PyInit__native_step(void) { return PyModule_Create(&native_module); }
#endif  // A2ATS_STEP_CORE_ONLY
