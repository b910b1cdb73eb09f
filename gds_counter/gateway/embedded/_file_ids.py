"""Which file a path names now: (device, inode), asked so as not to slow
the next commit.

The engine asks before every commit whether its database and its ``-wal``
file are still the ones its connection opened (``ConnectionLife.check_file``):
a commit into a deleted log is lost. ``os.stat`` asks the kernel for the
file's times too, and on Linux 6.13 and later (multigrain timestamps, ext4,
XFS, Btrfs, tmpfs) a file whose change time was read gets a fine-grained
one at its next write, which dirties its inode: the ``-wal`` file, written
by every commit, then cost a journal update at every ``COMMIT`` (a lone
add on a SQLite file: about 40 µs more, a third of SQLite's own commit,
``benchmarks/lone_call.py``). So on Linux the path is asked through
``statx`` for its inode number alone, through ``ctypes`` (Python's ``os``
has no ``statx`` before 3.14); elsewhere, or when the C library lacks it,
through ``os.stat``. Both give the same answer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
from typing import Any, Callable

__all__ = ["FileId", "file_id"]

#: (device, inode): what names a file whatever path, link or mount reaches it.
FileId = tuple[int, int]

_AT_FDCWD = -100
_STATX_INO = 0x100
_STATX_SIZE = 256  # ``struct statx``
_INO_AT = 32  # ``stx_ino``: u64
_DEV_AT = 136  # ``stx_dev_major``, ``stx_dev_minor``: u32 each (filled whatever the mask)


def _statx() -> Callable[..., int] | None:
    """libc's ``statx``, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function: Any = libc.statx
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


_STATX = _statx()


def file_id(path: str) -> FileId | None:
    """(device, inode) of ``path``, or None when nothing is there. Other
    failures raise ``OSError`` naming the path, as ``os.stat`` does."""
    if _STATX is None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino
    buffer = ctypes.create_string_buffer(_STATX_SIZE)  # one per call: threads ask at once
    if _STATX(_AT_FDCWD, os.fsencode(path), 0, _STATX_INO, buffer) != 0:
        code = ctypes.get_errno()
        if code == errno.ENOENT:
            return None
        raise OSError(code, os.strerror(code), path)
    major, minor = struct.unpack_from("=II", buffer, _DEV_AT)
    return os.makedev(major, minor), struct.unpack_from("=Q", buffer, _INO_AT)[0]
