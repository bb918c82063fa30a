"""Recent snapshots (a bounded ring), per-reply byte series and retrieval-frequency counts.

Qt-free. `SnapshotRing.append` is O(1) plus O(layers) for the byte totals, so the GUI thread can
take a snapshot per decode step for free; frequency counting happens lazily when something
(the frequency map, a hover) asks for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from a2ats_engine.telemetry import CacheSnapshot

from .data import retrieved_positions

DEFAULT_CAPACITY = 256


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


class SnapshotRing:
    """The last `capacity` snapshots, each tagged with a sequence number and a reply number."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._entries: deque[Entry] = deque()
        self._capacity = 0
        self._next_seq = 0
        self._reply = 0
        self._series: dict[int, ByteSeries] = {}
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
        entry = Entry(self._next_seq, self._reply, snapshot)
        self._next_seq += 1
        self._entries.append(entry)
        self._series.setdefault(self._reply, ByteSeries()).add(snapshot)
        self._trim()
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self._series.clear()

    def _trim(self) -> None:
        dropped = False
        while len(self._entries) > self._capacity:
            self._entries.popleft()
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
