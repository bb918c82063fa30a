"""Recent snapshots (a bounded ring), per-reply byte series and retrieval-frequency counts.

Qt-free. `SnapshotRing.append` is O(1) plus O(layers) for the byte totals, so the GUI thread can
take a snapshot per decode step for free; frequency counting happens lazily when something
(the frequency map, a hover) asks for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats

from .data import retrieved_positions

DEFAULT_CAPACITY = 256
DEFAULT_MAX_BYTES = 128 * 1024 * 1024  # kept selections + histogram deltas, whatever N says
MIN_KEPT = 2
PENDING_LIMIT = 16  # entries may keep their full histograms this long before compaction


@dataclass(frozen=True)
class Entry:
    """One kept snapshot: `seq` counts every snapshot ever appended, `reply` numbers replies."""

    seq: int
    reply: int
    snapshot: CacheSnapshot


class ByteSeries:
    """Total bytes held / fp16 per step of one reply (grows by one row per snapshot)."""

    def __init__(self) -> None:
        self._steps: list[int] = []
        self._held: list[int] = []
        self._fp16: list[int] = []

    def add(self, snapshot: CacheSnapshot) -> None:
        self._steps.append(snapshot.step)
        self._held.append(snapshot.bytes_held)
        self._fp16.append(snapshot.bytes_fp16)

    def __len__(self) -> int:
        return len(self._steps)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps int64 [n], held int64 [n], fp16 int64 [n])."""
        return (
            np.asarray(self._steps, dtype=np.int64),
            np.asarray(self._held, dtype=np.int64),
            np.asarray(self._fp16, dtype=np.int64),
        )


def _stack_counts(layer: LayerStats) -> np.ndarray | None:
    """A layer's histograms as one int64 [H, C] array (None when ragged or empty)."""
    counts = layer.code_counts
    if not counts or len({c.size for c in counts}) != 1:
        return None
    return np.stack(counts).astype(np.int64, copy=False)


def _strip_counts(snapshot: CacheSnapshot) -> CacheSnapshot:
    """The same snapshot without code histograms (they are kept as deltas instead)."""
    layers = tuple(replace(layer, code_counts=()) for layer in snapshot.layers)
    return CacheSnapshot(snapshot.step, layers, snapshot.token_id)


def _selection_bytes(snapshot: CacheSnapshot) -> int:
    return sum(s.nbytes for layer in snapshot.layers for s in layer.selected) + 200 * len(
        snapshot.layers
    )


@dataclass
class _Compact:
    """What replaces an older entry's histograms: the change to the next kept step's histograms
    (per layer: flat indices into [H, C] and values; hist(seq) = hist(seq + 1) + change), or a
    keyframe (the histograms themselves) when shapes changed between the two steps."""

    delta: list[tuple[np.ndarray, np.ndarray, tuple[int, int]]] | None
    keyframe: tuple[tuple[np.ndarray, ...], ...] | None
    nbytes: int


class SnapshotRing:
    """The last `capacity` snapshots (within `max_bytes`), tagged with sequence and reply numbers.

    Each snapshot carries one code histogram per layer and KV head (n_centroids counts): 2.9 MB
    per step for 30 layers x 3 heads x 4096 codes. Only the newest snapshots keep theirs; older
    entries hold the sparse change to the next step instead (one token per head per decode step),
    so the ring costs about the size of the selections. `restored` rebuilds any kept step exactly.
    """

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._entries: deque[Entry] = deque()
        self._compact: dict[int, _Compact] = {}
        self._full_from = 0  # entries with seq >= this still hold their histograms
        self._sizes: dict[int, int] = {}
        self._total_bytes = 0
        self._capacity = 0
        self._max_bytes = max_bytes
        self._next_seq = 0
        self._reply = 0
        self._series: dict[int, ByteSeries] = {}
        self._restored: Entry | None = None
        self.set_capacity(capacity)

    # ---- writing -------------------------------------------------------------------------
    def set_capacity(self, capacity: int) -> None:
        """Change how many snapshots are kept (>= 1); the oldest are dropped if needed."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"history size={capacity!r} is out of range: must be an integer >= 1")
        self._capacity = capacity
        self._trim()

    def new_reply(self) -> int:
        """Start a new reply: later snapshots belong to it. Returns its number."""
        if self._entries or self._reply in self._series:
            self._reply += 1
        return self._reply

    def append(self, snapshot: CacheSnapshot) -> Entry:
        """Keep one snapshot (O(layers); histogram compaction is deferred to `compact`)."""
        entry = Entry(self._next_seq, self._reply, snapshot)
        self._next_seq += 1
        self._entries.append(entry)
        size = _selection_bytes(snapshot)
        self._sizes[entry.seq] = size
        self._total_bytes += size
        self._series.setdefault(self._reply, ByteSeries()).add(snapshot)
        if entry.seq - self._full_from > PENDING_LIMIT:
            self.compact()
        self._trim()
        return entry

    def compact(self) -> None:
        """Replace the histograms of every entry but the newest by sparse deltas."""
        if len(self._entries) < 2:
            return
        newest = self._entries[-1].seq
        first = max(self._full_from, self._entries[0].seq)
        for seq in range(first, newest):  # ascending: the next entry still holds its histograms
            index = seq - self._entries[0].seq
            entry, after = self._entries[index], self._entries[index + 1]
            packed = self._pack(entry.snapshot, after.snapshot)
            self._compact[seq] = packed
            self._entries[index] = Entry(entry.seq, entry.reply, _strip_counts(entry.snapshot))
            self._resize(seq, _selection_bytes(entry.snapshot) + packed.nbytes)
        self._full_from = newest

    @staticmethod
    def _pack(snapshot: CacheSnapshot, after: CacheSnapshot) -> _Compact:
        if len(snapshot.layers) == len(after.layers):
            delta = []
            for layer, nxt in zip(snapshot.layers, after.layers, strict=True):
                a, b = _stack_counts(layer), _stack_counts(nxt)
                if a is None or b is None or a.shape != b.shape:
                    break
                change = (a - b).ravel()
                idx = np.flatnonzero(change)
                delta.append((idx.astype(np.int32), change[idx], a.shape))
            else:
                nbytes = sum(i.nbytes + v.nbytes for i, v, _ in delta)
                return _Compact(delta, None, nbytes)
        keyframe = tuple(tuple(layer.code_counts) for layer in snapshot.layers)
        nbytes = sum(c.nbytes for counts in keyframe for c in counts)
        return _Compact(None, keyframe, nbytes)

    def _resize(self, seq: int, size: int) -> None:
        self._total_bytes += size - self._sizes.get(seq, 0)
        self._sizes[seq] = size

    def clear(self) -> None:
        self._entries.clear()
        self._series.clear()
        self._compact.clear()
        self._sizes.clear()
        self._total_bytes = 0
        self._full_from = self._next_seq
        self._restored = None

    def _trim(self) -> None:
        dropped = False
        while len(self._entries) > self._capacity or (
            self._total_bytes > self._max_bytes and len(self._entries) > MIN_KEPT
        ):
            old = self._entries.popleft()
            self._compact.pop(old.seq, None)
            self._total_bytes -= self._sizes.pop(old.seq, 0)
            dropped = True
        if dropped and len(self._series) > 1:
            live = {e.reply for e in self._entries} | {self._reply}
            for reply in [r for r in self._series if r not in live]:
                del self._series[reply]

    # ---- reading -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Approximate bytes the kept entries hold (selections, deltas; not pending histograms)."""
        return self._total_bytes

    @property
    def current_reply(self) -> int:
        return self._reply

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def first_seq(self) -> int | None:
        return self._entries[0].seq if self._entries else None

    @property
    def last_seq(self) -> int | None:
        return self._entries[-1].seq if self._entries else None

    def entries(self) -> list[Entry]:
        """Kept entries, oldest first. Older ones come without code histograms (`restored`)."""
        return list(self._entries)

    def at_index(self, index: int) -> Entry:
        """Entry by position in the ring (0 = oldest kept)."""
        return self._entries[index]

    def index_of(self, seq: int) -> int:
        """Ring position of `seq`, clamped to the kept range."""
        if not self._entries:
            return 0
        return int(min(max(seq - self._entries[0].seq, 0), len(self._entries) - 1))

    def get(self, seq: int) -> Entry | None:
        if not self._entries:
            return None
        i = seq - self._entries[0].seq
        return self._entries[i] if 0 <= i < len(self._entries) else None

    def restored(self, entry: Entry) -> Entry:
        """The entry with its code histograms (the original snapshot for recent entries)."""
        if entry.seq not in self._compact:
            return entry
        cached = self._restored
        if cached is not None and cached.seq == entry.seq:
            return cached
        history = self._restore_run(entry.seq)
        restored = history[0]
        self._restored = restored
        return restored

    def restored_entries(self) -> list[Entry]:
        """Every kept entry with its histograms, oldest first (one backward pass)."""
        if not self._entries:
            return []
        return self._restore_run(self._entries[0].seq)

    def _restore_run(self, first_seq: int) -> list[Entry]:
        """Entries first_seq..newest with histograms rebuilt from the newest full one."""
        start = self.index_of(first_seq)
        entries = list(self._entries)[start:]
        out: list[Entry] = [entries[-1]]
        counts = [_stack_counts(layer) for layer in entries[-1].snapshot.layers]
        for entry in reversed(entries[:-1]):
            packed = self._compact.get(entry.seq)
            if packed is None:  # still holds its own histograms
                counts = [_stack_counts(layer) for layer in entry.snapshot.layers]
                out.append(entry)
                continue
            if packed.keyframe is not None:
                tuples = packed.keyframe
                counts = [
                    np.stack(t) if t and len({c.size for c in t}) == 1 else None for t in tuples
                ]
            else:
                counts = [_apply(c, d) for c, d in zip(counts, packed.delta, strict=True)]
                tuples = tuple(tuple(c) if c is not None else () for c in counts)
            layers = tuple(
                replace(layer, code_counts=t)
                for layer, t in zip(entry.snapshot.layers, tuples, strict=True)
            )
            snap = CacheSnapshot(entry.snapshot.step, layers, entry.snapshot.token_id)
            out.append(Entry(entry.seq, entry.reply, snap))
        out.reverse()
        return out

    def reply_entries(self, reply: int, up_to_seq: int | None = None) -> list[Entry]:
        """Kept entries of one reply, oldest first, optionally only up to `up_to_seq`."""
        return [
            e
            for e in self._entries
            if e.reply == reply and (up_to_seq is None or e.seq <= up_to_seq)
        ]

    def byte_series(self, reply: int) -> ByteSeries:
        return self._series.get(reply, ByteSeries())


def _apply(counts: np.ndarray | None, delta) -> np.ndarray:
    """counts [H, C] of step s + 1 and the packed change -> counts of step s (a new array)."""
    idx, values, shape = delta
    out = (
        np.array(counts, dtype=np.int64, copy=True)
        if counts is not None
        else np.zeros(shape, np.int64)
    )
    flat = out.reshape(-1)
    flat[idx] += values
    return out


class RetrievalFrequency:
    """How often each position was retrieved, per layer, over a run of steps of one reply.

    counts: int32 [L, W] (W grows with the context); steps: how many steps were counted.
    """

    def __init__(self, reply: int, head: int | None) -> None:
        self.reply = reply
        self.head = head
        self.steps = 0
        self.last_seq = -1
        self.counts = np.zeros((0, 0), dtype=np.int32)

    def _ensure(self, rows: int, width: int) -> None:
        cur_rows, cur_width = self.counts.shape
        if rows <= cur_rows and width <= cur_width:
            return
        new = np.zeros((max(rows, cur_rows), max(width, 2 * cur_width, 256)), dtype=np.int32)
        new[:cur_rows, :cur_width] = self.counts
        self.counts = new

    def add(self, entry: Entry) -> None:
        """Count one step's retrieved positions (union over heads or the chosen head)."""
        snap = entry.snapshot
        width = max((layer.offset for layer in snap.layers), default=0)
        self._ensure(len(snap.layers), width)
        for i, layer in enumerate(snap.layers):
            self.counts[i, retrieved_positions(layer, self.head)] += 1
        self.steps += 1
        self.last_seq = entry.seq

    def count(self, row: int, position: int) -> int:
        rows, width = self.counts.shape
        if 0 <= row < rows and 0 <= position < width:
            return int(self.counts[row, position])
        return 0

    def fraction(self, rows: int, width: int) -> np.ndarray:
        """float32 [rows, width]: counts / steps (0 where never retrieved)."""
        out = np.zeros((rows, width), dtype=np.float32)
        r = min(rows, self.counts.shape[0])
        w = min(width, self.counts.shape[1])
        if self.steps:
            out[:r, :w] = self.counts[:r, :w] / np.float32(self.steps)
        return out


class FrequencyTracker:
    """Retrieval frequency of the reply of a viewed step, counted up to that step.

    Live viewing consumes new snapshots incrementally; scrubbing backwards (or switching head)
    recounts from the kept snapshots of that reply, so the count covers `steps` kept steps.
    A reply longer than the ring keeps counting while live (old steps stay counted).
    """

    def __init__(self, ring: SnapshotRing) -> None:
        self._ring = ring
        self._freq: RetrievalFrequency | None = None

    def reset(self) -> None:
        self._freq = None

    def at(self, seq: int, head: int | None) -> RetrievalFrequency:
        entry = self._ring.get(seq)
        reply = entry.reply if entry is not None else self._ring.current_reply
        freq = self._freq
        reusable = (
            freq is not None
            and freq.reply == reply
            and freq.head == head
            and freq.last_seq <= seq
            and (freq.last_seq + 1 >= (self._ring.first_seq or 0) or freq.last_seq == seq)
        )
        if not reusable:
            freq = RetrievalFrequency(reply, head)
        for e in self._ring.reply_entries(reply, up_to_seq=seq):
            if e.seq > freq.last_seq:
                freq.add(e)
        self._freq = freq
        return freq
