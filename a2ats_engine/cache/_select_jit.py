"""The compiled loops of `host_kernels` (numba, imported only when the host step first asks
for them: numba's import and the cache load cost a fraction of a second)."""

import numpy as np
from numba import njit

from .topk import SAMPLE_STRIDE, THRESHOLD_FROM


@njit(cache=True, nogil=True)
def select_top(vals, idx, n, m):
    # idx[:n] reordered so that idx[:m] hold the m largest vals[idx[i]]: quickselect with a
    # three-way partition (runs of equal scores end it at once)
    lo, hi = 0, n - 1
    while lo < hi:
        a, b, c = vals[idx[lo]], vals[idx[(lo + hi) // 2]], vals[idx[hi]]
        pivot = max(min(a, b), min(max(a, b), c))
        lt, i, gt = lo, lo, hi
        while i <= gt:
            v = vals[idx[i]]
            if v > pivot:
                idx[lt], idx[i] = idx[i], idx[lt]
                lt += 1
                i += 1
            elif v < pivot:
                idx[gt], idx[i] = idx[i], idx[gt]
                gt -= 1
            else:
                i += 1
        if m - 1 < lt:
            hi = lt - 1
        elif m - 1 <= gt:
            return
        else:
            lo = gt + 1


@njit(cache=True, nogil=True)
def top_into(vals, n, m, idx, sample):
    # idx[:m] <- indices of the m largest of vals[:n] (unordered), `topk.top_indices`' way
    count = n
    if n >= THRESHOLD_FROM and 4 * m <= n:
        ns = 0
        for f in range(0, n, SAMPLE_STRIDE):
            sample[ns] = vals[f]
            ns += 1
        j = min(ns - 1, (5 * m * ns) // (4 * n) + 8)
        sample[:ns].sort()
        threshold = sample[ns - 1 - j]
        count = 0
        for f in range(n):
            if vals[f] >= threshold:
                idx[count] = f
                count += 1
        if count < m:  # a sample that misleads: every score
            count = n
            for f in range(n):
                idx[f] = f
    else:
        for f in range(n):
            idx[f] = f
    select_top(vals, idx, count, m)
    lowest_ties(vals, n, m, idx)


@njit(cache=True, nogil=True)
def lowest_ties(vals, n, m, idx):
    # `topk.lowest_ties`: of the scores equal to the m-th largest kept, the lowest indices
    kth = vals[idx[0]]
    for i in range(1, m):
        kth = min(kth, vals[idx[i]])
    above, equal = 0, 0
    for f in range(n):
        v = vals[f]
        if v > kth:
            above += 1
        elif v == kth:
            equal += 1
    if above + equal == m:  # no tie crosses the cut
        return
    j, need = 0, m - above
    for f in range(n):
        v = vals[f]
        if v > kth:
            idx[j] = f
            j += 1
        elif v == kth and need > 0:
            idx[j] = f
            j += 1
            need -= 1


@njit(cache=True, nogil=True, fastmath=True)
def dot(row, q):
    acc = np.float32(0.0)
    for j in range(row.shape[0]):
        acc += row[j] * q[j]
    return acc


@njit(cache=True, nogil=True)
def select(tables, codes, buckets, n_sinks, n_far, n_centroids, k, candidates, q, keys, out):
    B, H, G, _ = tables.shape
    scores = np.empty(n_far, np.float32)
    idx = np.empty(n_far, np.int64)
    sample = np.empty(n_far // SAMPLE_STRIDE + 1, np.float32)
    exact = np.empty(candidates, np.float32)
    order = np.empty(candidates, np.int64)
    for b in range(B):
        for h in range(H):
            for g in range(G):
                t = tables[b, h, g]
                for f in range(n_far):
                    s = t[buckets[f] * n_centroids + codes[b, h, n_sinks + f, 0]]
                    if s != s:  # NaN: the NumPy path ranks it (argpartition's rule)
                        return False
                    scores[f] = s
                top_into(scores, n_far, candidates, idx, sample)
                if candidates > k:
                    for i in range(candidates):
                        e = dot(keys[b, h, n_sinks + idx[i]], q[b, h, g])
                        if e != e:
                            return False
                        exact[i] = e
                        order[i] = i
                    select_top(exact, order, candidates, k)
                    for i in range(k):
                        out[b, h, g, i] = idx[order[i]]
                else:
                    for i in range(k):
                        out[b, h, g, i] = idx[i]
    return True
