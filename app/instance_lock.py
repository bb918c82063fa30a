"""One writer per data folder: the first app instance locks the conversations folder; any
other instance on the same folder runs read-only (it shows the chats, writes nothing).

The lock is an advisory `flock` on `.instance.lock` in the folder: the kernel releases it when
the holder exits or crashes, so there is no stale lock to clean up, and it conflicts between
two open files of the same process too (tests start two instances in one process).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = ".instance.lock"


class InstanceLock:
    """The data folder's writer lock. `acquire()` is True when this instance may write."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock without waiting. True when it is held (now or already). A folder where
        no lock file can be created (read-only, full) counts as held: every write there fails
        and is reported anyway, and refusing would only hide the chats."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            # Held elsewhere: read-only. A file system without flock (another errno): behave as
            # before, one writer assumed.
            return exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None
