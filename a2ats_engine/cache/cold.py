"""The cold storage kind: an A2ATS layer's K/V rows in a file, read through a memory map.

What stays in process memory per token is its code (the cache holds the codes); the post-RoPE
K/V rows go to an append-only file under the cache folder (`kv_dir()`), written with `pwrite`
and read back through a read-only `mmap`: a decode step reads only the rows it attends (sinks,
window, the retrieved far tokens and the rerank candidates), an exact step (prefill, a context
below the crossover) reads every row once per layer. On a Mac or Linux those are clean file
pages: the OS drops them under memory pressure instead of swapping (they are not the process's
anonymous memory).

`ColdRows` keeps the rows resident until they exceed its byte share of the KV memory limit
(`A2ATSConfig.kv_memory`), then moves them to the file (`spilled`). Faults: a write that fails
(full or read-only disk) brings the rows back into memory and says so once (`fault`); a file
truncated or changed behind the map raises `ColdTierError` naming the file (never a SIGBUS, never
a silently wrong row). Files live in a folder per process, held by an exclusive lock: files of a
process that died are removed by the next `kv_dir()` call of any process; a cache's file is
removed when the cache is closed or collected.

File layout: row t (token t) is `[2, B, n_kv, d]` (keys then values) in the model dtype's bytes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import mmap
import os
import shutil
import uuid
import warnings
import weakref
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..data_dirs import cache_dir
from ..errors import A2ATSError
from .storage import KEYS, STEP, ResidentRows, RowStorage, Stored, gather_rows, grown

_LOCK = ".owner.lock"
_process_dir: Path | None = None
_process_lock: int | None = None


class ColdTierError(A2ATSError):
    """The cold tier's file cannot give back the rows it holds (truncated or changed)."""


def kv_root() -> Path:
    """Folder of every process's cold-tier folders (`<cache dir>/kv`)."""
    return cache_dir() / "kv"


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the folders of processes that no longer run (their lock is free); returns them."""
    root = root or kv_root()
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry == _process_dir or not entry.is_dir():
            continue
        try:
            fd = os.open(entry / _LOCK, os.O_RDWR)
        except OSError:
            fd = None  # no lock file: a folder a crash left half made
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        finally:
            if fd is not None:
                os.close(fd)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def kv_dir() -> Path:
    """This process's cold-tier folder, made (and stale folders swept) on first use."""
    global _process_dir, _process_lock
    if _process_dir is not None and _process_dir.is_dir():
        return _process_dir
    root = kv_root()
    root.mkdir(parents=True, exist_ok=True)
    sweep_stale(root)
    folder = root / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _process_dir, _process_lock = folder, fd
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _unlink(path: Path, fd: int, mm_holder: list) -> None:
    """Finalizer: close the map and the file, remove it."""
    for mm in mm_holder:
        mm.close()
    mm_holder.clear()
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        path.unlink()


class LowBitKeys:
    """Every key row `mx.quantize`d (bits, groups of 64) and resident: the rerank's alternative
    source of candidate keys to the map (`ColdRows(candidate_bits=...)`)."""

    def __init__(self, bits: int) -> None:
        self.fmt = RowStorage(bits)
        self.stored: Stored | None = None

    def append(self, keys: mx.array, start: int) -> None:
        k, end = self.fmt.encode(keys), start + keys.shape[2]
        if self.stored is None or end > RowStorage.capacity(self.stored):
            self.stored = grown(self.stored, k, start, end)
        RowStorage.write(self.stored, k, start, end)

    def gather(self, positions: mx.array) -> mx.array:
        return gather_rows(self.stored, positions, self.fmt)

    @property
    def nbytes(self) -> int:
        return RowStorage.nbytes(self.stored)


class ColdRows:
    """K/V rows (float only) resident up to `limit_bytes`, in a memory-mapped file past it.

    limit_bytes: this layer's share of the KV memory limit (0: every row goes to the file).
    """

    kind = "cold"

    def __init__(self, limit_bytes: int, label: str = "layer", candidate_bits: int | None = None):
        self.limit_bytes = int(limit_bytes)
        self.label = label
        # None: the rerank reads its candidates' keys from the map (the shipped choice); b: from
        # a resident mx.quantize'd copy of every key (b bits, groups of 64), kept for measuring
        # the alternative (BENCHMARKS section 3, "Rerank candidates").
        self.candidate_bits = candidate_bits
        self.low_keys = LowBitKeys(candidate_bits) if candidate_bits else None
        self.memory = ResidentRows(RowStorage())
        self.spilled = False
        self.fault: str | None = None  # why the rows came back to memory, once
        self.path: Path | None = None
        self._fd = -1
        self._maps: list = []  # [mmap] of the file (one at a time; a list for the finalizer)
        self._mapped = 0  # bytes mapped
        self._size = 0  # bytes the file holds (capacity in rows * row bytes)
        self._stamp: tuple[int, int, int] | None = None  # (size, mtime_ns, inode) we last left
        self._row: tuple[tuple[int, ...], mx.Dtype] | None = None  # ([2, B, n_kv, d], dtype)
        self._end = 0
        self._finalizer = None
        self.read_bytes = 0  # bytes read back from the file so far (gathers and whole reads)

    # -- shape of a row ---------------------------------------------------------------------
    def _row_bytes(self) -> int:
        shape, dtype = self._row
        return int(np.prod(shape)) * dtype.size

    def _np_dtype(self):
        return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[self._row[1].size]

    # -- the kind's calls ---------------------------------------------------------------------
    def append(self, keys: mx.array, values: mx.array, start: int) -> None:
        """Store float rows [B, n_kv, L, d] at [start, start + L)."""
        if self._row is None:
            B, n_kv, _, d = keys.shape
            self._row = ((2, B, n_kv, d), keys.dtype)
        end = start + keys.shape[2]
        self._end = end
        if self.low_keys is not None:
            self.low_keys.append(keys, start)
        if not self.spilled:
            self.memory.append(keys, values, start)
            if end * self._row_bytes() > self.limit_bytes:
                self._spill(end)
            return
        try:
            self._write(mx.stack([keys, values]), start)
        except OSError as err:
            self._recall(start, err)
            self.memory.append(keys, values, start)

    def _spill(self, end: int) -> None:
        """Move rows [0, end) from memory to a new file (stay in memory if that fails)."""
        k, v = self.memory.fetch(end)
        try:
            self._open()
            self._write(mx.stack([k, v]), 0)
        except OSError as err:
            self._close_file()
            self._note(f"could not write the cold tier ({err}); keeping K/V in memory")
            self.limit_bytes = 2**62  # do not try again for this cache
            return
        self.spilled = True
        self.memory.close()

    def _open(self) -> None:
        folder = kv_dir()
        self.path = folder / f"{self.label}-{uuid.uuid4().hex[:8]}.rows"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._finalizer = weakref.finalize(self, _unlink, self.path, self._fd, self._maps)

    def _write(self, rows: mx.array, start: int) -> None:
        """rows [2, B, n_kv, L, d] -> file rows [start, start + L), growing the file by STEP."""
        data = np.ascontiguousarray(
            np.array(rows.view(_MX_UINT[self._row[1].size])).transpose(3, 0, 1, 2, 4)
        )
        rb = self._row_bytes()
        end = start + data.shape[0]
        self._check(min(start, self._size // rb))
        if end * rb > self._size:
            self._size = ((end + STEP - 1) // STEP) * STEP * rb
            os.ftruncate(self._fd, self._size)
            self._stamp_file()  # our own growth: a failed write below still reads back
        written = os.pwrite(self._fd, data.tobytes(), start * rb)
        if written != data.nbytes:
            raise OSError(f"short write ({written} of {data.nbytes} bytes)")
        self._stamp_file()

    def _stamp_file(self) -> None:
        st = os.fstat(self._fd)
        self._stamp = (st.st_size, st.st_mtime_ns, st.st_ino)

    def _check(self, end: int) -> None:
        """ColdTierError when the file no longer holds what this cache wrote (rows [0, end))."""
        if self._stamp is None:
            return
        try:
            st = os.fstat(self._fd)
            same_path = os.stat(self.path).st_ino == st.st_ino
        except OSError:
            same_path = False
            st = None
        if st is None or (st.st_size, st.st_mtime_ns, st.st_ino) != self._stamp or not same_path:
            raise ColdTierError(
                f"the cold K/V file {self.path} was truncated, replaced or changed by something "
                f"else (rows 0-{end} can no longer be trusted); the chat must be prefilled again"
            )

    def _map(self, end: int) -> np.ndarray:
        """The file's rows [0, end) as a read-only array [end, 2, B, n_kv, d] (uint view)."""
        self._check(end)
        rb = self._row_bytes()
        if end * rb > self._mapped:
            for mm in self._maps:
                mm.close()
            self._maps.clear()
            mapped = mmap.mmap(self._fd, self._size, prot=mmap.PROT_READ)
            if hasattr(mmap, "MADV_RANDOM"):  # a step reads scattered rows: no readahead
                mapped.madvise(mmap.MADV_RANDOM)
            self._maps.append(mapped)
            self._mapped = self._size
        shape, _ = self._row
        count = self._mapped // self._row[1].size  # what is mapped (the file may have grown)
        flat = np.frombuffer(self._maps[0], dtype=self._np_dtype(), count=count)
        return flat.reshape(-1, *shape)[:end]

    def _to_mx(self, rows: np.ndarray) -> mx.array:
        return mx.array(rows).view(self._row[1])

    def fetch(self, end: int) -> tuple[mx.array, mx.array]:
        """Float K/V rows [0, end): `[B, n_kv, end, d]` each (read whole from the map)."""
        if not self.spilled:
            return self.memory.fetch(end)
        mapped = np.ascontiguousarray(self._map(end))  # [end, 2, B, n_kv, d]
        self.read_bytes += mapped.nbytes
        rows = self._to_mx(mapped).transpose(1, 2, 3, 0, 4)
        return rows[0], rows[1]

    def gather(self, which: int, positions: mx.array) -> mx.array:
        """Float rows at positions [B, n_kv, M] -> [B, n_kv, M, d], read from the map."""
        if not self.spilled:
            return self.memory.gather(which, positions)
        pos = np.array(positions).astype(np.int64)  # host sync: the map is read on the host
        B, n_kv, M = pos.shape
        d = self._row[0][-1]
        flat = self._map(self._end).reshape(-1, d)  # file row t, kind w, b, h -> one flat row
        b = np.arange(B)[:, None, None]
        h = np.arange(n_kv)[None, :, None]
        index = (((pos * 2 + which) * B + b) * n_kv + h).reshape(-1)
        # One flat `take` instead of indexing with four arrays: 137 vs 218 ms a step of 16K
        # Qwen3-0.6B-geometry decode on the same positions (this host). Reading each distinct
        # row once (np.unique) and reusing the rerank's candidate keys for the selection cost
        # more in sorting than they saved in reads (0.75x in-memory speed at 32K with them).
        rows = np.take(flat, index, axis=0).reshape(B, n_kv, M, d)
        self.read_bytes += rows.nbytes
        return self._to_mx(rows)

    def candidate_keys(self, positions: mx.array) -> mx.array:
        """The rerank's candidate keys at positions [B, n_kv, M]: read from the map, or
        dequantized from the resident low-bit copy (`candidate_bits`, measured, not shipped)."""
        if self.low_keys is not None and self.spilled:
            return self.low_keys.gather(positions)
        return self.gather(KEYS, positions)

    def for_attention(self, keys: mx.array, values: mx.array, start: int):
        """The incoming rows only: `attend` reads the past itself when it attends exactly."""
        return keys, values

    @property
    def keys(self) -> mx.array | None:
        """Every held key row `[B, n_kv, N, d]`, read back (tests, evaluation variants)."""
        return None if self._row is None else self.fetch(self._end)[0]

    @property
    def values(self) -> mx.array | None:
        return None if self._row is None else self.fetch(self._end)[1]

    def truncate(self, end: int) -> None:
        """Drop rows past `end` (trim, regenerate): the file shrinks with them."""
        self._end = min(self._end, end)
        if not self.spilled:
            return
        rb = self._row_bytes()
        size = ((self._end + STEP - 1) // STEP) * STEP * rb
        if size < self._size:
            for mm in self._maps:
                mm.close()
            self._maps.clear()
            self._mapped = 0
            os.ftruncate(self._fd, size)
            self._size = size
            self._stamp_file()

    def arrays(self, end: int) -> list[mx.array]:
        """The resident rows [0, end) as `state` arrays: none once spilled (the rows are in the
        file; mlx-lm evaluates `state` after every prefill chunk, which must not read them)."""
        if self._row is None or self.spilled:
            return []
        return self.memory.arrays(end)

    def export(self, end: int) -> list[mx.array]:
        """Every row [0, end) as (keys, values) arrays, read back from the file when spilled."""
        if self._row is None:
            return []
        return list(self.fetch(end))

    def load(self, arrays: list[mx.array]) -> int:
        """Take rows from `state` arrays (keys, values [B, n_kv, N, d]); returns N."""
        if len(arrays) != 2:
            raise ValueError(f"stored rows need 2 arrays, got {len(arrays)}")
        self.close()
        self.__init__(self.limit_bytes, self.label, self.candidate_bits)  # fresh, same settings
        n = arrays[0].shape[2]
        if n:
            self.append(arrays[0], arrays[1], 0)
        return n

    def drop_page_cache(self) -> bool:
        """Unmap the file and ask the OS to drop its pages from the page cache (Linux
        `POSIX_FADV_DONTNEED`), so the next step reads its rows from the disk: for measuring a
        cold page cache. False where the platform has no such call or nothing is on disk."""
        if not self.spilled or not hasattr(os, "posix_fadvise"):
            return False
        for mm in self._maps:
            mm.close()
        self._maps.clear()
        self._mapped = 0
        os.fsync(self._fd)  # dirty pages are not dropped
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True

    def _recall(self, end: int, err: OSError) -> None:
        """A write failed: rows [0, end) come back into memory; the cache goes on there."""
        rows = self.fetch(end)
        self.memory = ResidentRows(RowStorage())
        self.memory.append(*rows, 0)
        self.spilled = False
        self.limit_bytes = 2**62
        self._close_file()
        self._note(f"the cold K/V file could not be written ({err}); K/V are back in memory")

    def _note(self, message: str) -> None:
        self.fault = message
        warnings.warn(f"A2ATS {self.label}: {message}", stacklevel=4)

    @property
    def resident_bytes(self) -> int:
        low = 0 if self.low_keys is None else self.low_keys.nbytes
        return low + (0 if self.spilled else self.memory.resident_bytes)

    @property
    def disk_bytes(self) -> int:
        return self._end * self._row_bytes() if self.spilled else 0

    def _close_file(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._fd = -1
        self._mapped = self._size = 0
        self._stamp = None

    def close(self) -> None:
        """Remove the file and free the rows."""
        if self.low_keys is not None:
            self.low_keys = LowBitKeys(self.candidate_bits)
        self._close_file()
        self.memory.close()
        self.spilled = False


_MX_UINT = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}
