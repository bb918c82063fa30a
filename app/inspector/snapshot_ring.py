"""Recent snapshots (a bounded ring), per-reply byte series and retrieval-frequency counts.

Qt-free. The engine sends each layer's code histograms as a keyframe (full histograms, after a
prefill, trim or rebuild) or as the codes appended since its previous snapshot (`new_codes`,
every other step; see `LayerStats`). The ring keeps, per kept step, only what changed since the
step before (those new codes, or the sparse difference of two full histograms) plus the
histograms of the oldest and newest kept steps, and rebuilds any kept step's histograms exactly
(`restored`). `append` is O(layers) for engine records (a few codes per layer), so the GUI thread
takes a snapshot per decode step for free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats

from .data import retrieved_positions

DEFAULT_CAPACITY = 256
DEFAULT_MAX_BYTES = 128 * 1024 * 1024  # kept selections + histogram changes, whatever N says
MIN_KEPT = 2

# One layer's histograms: int64 [H, C] (KV heads x codes), a tuple of per-head arrays when
# ragged or empty, or None when unknown (new codes arrived without a keyframe before them).
Histograms = np.ndarray | tuple | None
# How one layer's histograms changed from the previous kept step:
#   ("codes", flat indices)          one count more at each [H, C] flat index (h * C + code)
#   ("sparse", flat indices, values) added at those [H, C] flat indices
#   ("full", histograms)             replaced (shape change or unknown before)
Change = tuple


@dataclass(frozen=True)
class Entry:
    """One kept snapshot: `seq` counts every snapshot ever appended, `reply` numbers replies."""

    seq: int
    reply: int
    snapshot: CacheSnapshot


class ByteSeries:
    """Total bytes held / fp16 per step of one reply (grows by one row per snapshot). Both
    count the native layers' bytes (`CacheSnapshot.native_bytes`): they hold the same either way;
    held also counts the model's codebook (`CacheSnapshot.codebook_bytes`)."""

    def __init__(self) -> None:
        self._steps: list[int] = []
        self._held: list[int] = []
        self._fp16: list[int] = []

    def add(self, snapshot: CacheSnapshot) -> None:
        self._steps.append(snapshot.step)
        self._held.append(snapshot.bytes_total)
        self._fp16.append(snapshot.bytes_fp16 + snapshot.native_bytes)

    def __len__(self) -> int:
        return len(self._steps)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps int64 [n], held int64 [n], fp16 int64 [n])."""
        return (
            np.asarray(self._steps, dtype=np.int64),
            np.asarray(self._held, dtype=np.int64),
            np.asarray(self._fp16, dtype=np.int64),
        )


# ---- histogram bookkeeping ----------------------------------------------------------------------
def _stacked(counts: tuple) -> Histograms:
    """Per-head histograms as one int64 [H, C] array (a new one), or the tuple when ragged/empty."""
    if not counts or len({c.size for c in counts}) != 1:
        return tuple(counts)
    return np.stack(counts).astype(np.int64)


def _flat_codes(codes: tuple, n_codes: int) -> np.ndarray:
    """Each head's codes as flat indices into [H, C]: int32 h * C + code."""
    return np.concatenate([np.asarray(c, np.int32) + h * n_codes for h, c in enumerate(codes)])


def _advance(before: Histograms, layer: LayerStats) -> tuple[Histograms, Change]:
    """The layer's histograms after `layer` and the change from `before`.

    `before` is updated in place for new codes (it is the caller's own accumulator)."""
    if layer.new_codes is not None:  # the engine's delta: the codes appended this step
        if not isinstance(before, np.ndarray) or before.shape[0] != len(layer.new_codes):
            return None, ("full", None)
        flat = _flat_codes(layer.new_codes, before.shape[1])
        np.add.at(before.reshape(-1), flat, 1)
        return before, ("codes", flat)
    after = _stacked(layer.code_counts)
    same = isinstance(after, np.ndarray) and isinstance(before, np.ndarray)
    if same and after.shape == before.shape:
        diff = (after - before).reshape(-1)
        idx = np.flatnonzero(diff)
        return after, ("sparse", idx.astype(np.int32), diff[idx])
    return after, ("full", after.copy() if isinstance(after, np.ndarray) else after)


def _apply(hist: Histograms, change: Change) -> Histograms:
    """Histograms after `change`; `hist` is updated in place when it is an array."""
    kind = change[0]
    if kind == "full":
        full = change[1]
        return full.copy() if isinstance(full, np.ndarray) else full
    if not isinstance(hist, np.ndarray):
        return None
    if kind == "codes":
        np.add.at(hist.reshape(-1), change[1], 1)
    else:
        hist.reshape(-1)[change[1]] += change[2]
    return hist


def _replay(hist: Histograms, changes: list[Change]) -> Histograms:
    """A new array: `hist` plus every "codes" / "sparse" change, in one scatter-add."""
    if not isinstance(hist, np.ndarray):
        return hist if not changes else None
    out = hist.copy()
    if not changes:
        return out
    flat = out.reshape(-1)
    codes = [c[1] for c in changes if c[0] == "codes"]
    if codes:
        np.add.at(flat, np.concatenate(codes), 1)
    sparse = [c for c in changes if c[0] == "sparse"]
    if sparse:
        index = np.concatenate([c[1] for c in sparse])
        np.add.at(flat, index, np.concatenate([c[2] for c in sparse]))
    return out


def _change_bytes(change: Change) -> int:
    parts = change[1:] if change[0] == "sparse" else change[1]
    if isinstance(parts, np.ndarray):
        return parts.nbytes
    return sum(np.asarray(p).nbytes for p in parts or ())


def _with_counts(snapshot: CacheSnapshot, hists: list[Histograms]) -> CacheSnapshot:
    """The snapshot as a keyframe: each layer's full histograms, no new codes."""
    layers = tuple(
        replace(layer, code_counts=_as_tuple(h), new_codes=None)
        for layer, h in zip(snapshot.layers, hists, strict=True)
    )
    return replace(snapshot, layers=layers)


def _as_tuple(hist: Histograms) -> tuple:
    if isinstance(hist, np.ndarray):
        return tuple(hist.copy())
    return tuple(hist) if hist else ()


def _strip_counts(snapshot: CacheSnapshot) -> CacheSnapshot:
    """The same snapshot without full code histograms (the ring keeps their change instead)."""
    if not any(layer.code_counts for layer in snapshot.layers):
        return snapshot
    layers = tuple(replace(layer, code_counts=()) for layer in snapshot.layers)
    return replace(snapshot, layers=layers)


def _has_counts(snapshot: CacheSnapshot) -> bool:
    return all(layer.new_codes is None for layer in snapshot.layers)


def _step_histograms(
    before: list[Histograms], snapshot: CacheSnapshot
) -> tuple[list[Histograms], list[Change]]:
    """Every layer's histograms after `snapshot`, and their changes from `before`."""
    if len(before) != len(snapshot.layers):
        before = [None] * len(snapshot.layers)
    pairs = [_advance(b, layer) for b, layer in zip(before, snapshot.layers, strict=True)]
    return [h for h, _ in pairs], [c for _, c in pairs]


def with_histograms(snapshots: Iterable[CacheSnapshot]) -> list[CacheSnapshot]:
    """Snapshots in order with every layer's full histograms (engine deltas accumulated)."""
    out, hists = [], []
    for snap in snapshots:
        hists, _ = _step_histograms(hists, snap)
        out.append(snap if _has_counts(snap) else _with_counts(snap, hists))
    return out


def _selection_bytes(snapshot: CacheSnapshot) -> int:
    return sum(s.nbytes for layer in snapshot.layers for s in layer.selected) + 200 * len(
        snapshot.layers
    )


class SnapshotRing:
    """The last `capacity` snapshots (within `max_bytes`), tagged with sequence and reply numbers.

    Histograms: `_base` holds every layer's histograms at the oldest kept step and `_live` at
    the newest; each later kept step holds its change from the step before (`_changes`). Older
    entries' snapshots come without full histograms; `restored` rebuilds them exactly.
    """

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._entries: deque[Entry] = deque()
        self._changes: dict[int, list[Change]] = {}
        self._base: list[Histograms] = []
        self._live: list[Histograms] = []
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
        """Keep one snapshot: O(layers) plus the size of its histogram change."""
        entry = Entry(self._next_seq, self._reply, snapshot)
        self._next_seq += 1
        self._live, changes = _step_histograms(self._live, snapshot)
        size = _selection_bytes(snapshot)
        if self._entries:
            self._changes[entry.seq] = changes
            size += sum(_change_bytes(c) for c in changes)
            newest = self._entries[-1]
            self._entries[-1] = Entry(newest.seq, newest.reply, _strip_counts(newest.snapshot))
        else:
            self._base = [h.copy() if isinstance(h, np.ndarray) else h for h in self._live]
        self._entries.append(entry)
        self._sizes[entry.seq] = size
        self._total_bytes += size
        self._series.setdefault(self._reply, ByteSeries()).add(snapshot)
        self._trim()
        return entry

    def compact(self) -> None:
        """Nothing left to do: `append` keeps only histogram changes (kept for callers)."""

    def clear(self) -> None:
        self._entries.clear()
        self._series.clear()
        self._changes.clear()
        self._sizes.clear()
        self._base, self._live = [], []
        self._total_bytes = 0
        self._restored = None

    def _trim(self) -> None:
        dropped = False
        while len(self._entries) > self._capacity or (
            self._total_bytes > self._max_bytes and len(self._entries) > MIN_KEPT
        ):
            old = self._entries.popleft()
            self._total_bytes -= self._sizes.pop(old.seq, 0)
            self._fold_into_base()
            dropped = True
        if dropped and len(self._series) > 1:
            live = {e.reply for e in self._entries} | {self._reply}
            for reply in [r for r in self._series if r not in live]:
                del self._series[reply]

    def _fold_into_base(self) -> None:
        """The oldest entry was dropped: move the base to the new oldest one."""
        if not self._entries:
            self._base = []
            return
        seq = self._entries[0].seq
        changes = self._changes.pop(seq, None)
        if changes is None:
            return
        size = sum(_change_bytes(c) for c in changes)
        self._sizes[seq] -= size
        self._total_bytes -= size
        if len(changes) != len(self._base):
            self._base = [None] * len(changes)
        self._base = [_apply(h, c) for h, c in zip(self._base, changes, strict=True)]

    # ---- reading -------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Approximate bytes the kept entries hold (selections, histogram changes; not the
        oldest and newest steps' full histograms)."""
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
        """Kept entries, oldest first, as appended; older ones without full histograms."""
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
        """The entry with its full code histograms (itself when it still holds them)."""
        if _has_counts(entry.snapshot) and any(
            layer.code_counts for layer in entry.snapshot.layers
        ):
            return entry
        cached = self._restored
        if cached is not None and cached.seq == entry.seq:
            return cached
        if self._entries and entry.seq == self._entries[-1].seq:
            hists = self._live
        else:
            hists = self._histograms_at(self.index_of(entry.seq))
        restored = Entry(entry.seq, entry.reply, _with_counts(entry.snapshot, hists))
        self._restored = restored
        return restored

    def _histograms_at(self, index: int) -> list[Histograms]:
        """Every layer's histograms at the entry at ring position `index` (from the base).

        Per layer, the changes after its last replacement are added in one `np.add.at`, so
        scrubbing far back costs O(layers) NumPy calls, not O(steps x layers)."""
        hists = list(self._base)
        pending: list[list[Change]] = [[] for _ in hists]
        for entry in list(self._entries)[1 : index + 1]:
            changes = self._changes[entry.seq]
            if len(changes) != len(hists):
                hists, pending = [None] * len(changes), [[] for _ in changes]
            for row, change in enumerate(changes):
                if change[0] == "full":
                    hists[row], pending[row] = change[1], []
                else:
                    pending[row].append(change)
        return [_replay(h, p) for h, p in zip(hists, pending, strict=True)]

    def restored_entries(self) -> list[Entry]:
        """Every kept entry with its histograms, oldest first (one forward pass)."""
        out: list[Entry] = []
        hists: list[Histograms] = []
        for i, entry in enumerate(self._entries):
            if i == 0:
                hists = [h.copy() if isinstance(h, np.ndarray) else h for h in self._base]
            else:
                changes = self._changes[entry.seq]
                if len(changes) != len(hists):
                    hists = [None] * len(changes)
                hists = [_apply(h, c) for h, c in zip(hists, changes, strict=True)]
            if _has_counts(entry.snapshot) and any(
                layer.code_counts for layer in entry.snapshot.layers
            ):
                out.append(entry)
            else:
                snap = _with_counts(entry.snapshot, hists)
                out.append(Entry(entry.seq, entry.reply, snap))
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
