"""glibc malloc settings that keep freed memory for the next token instead of unmapping it.

Generation on a CPU frees and reallocates tensors of the same sizes at every token (the
logits, a batch's activations). With glibc's defaults a free block above the mmap threshold,
or a free top of the heap above the trim threshold, goes back to the kernel, and the next
token's allocation faults every page in again. ``keep_freed_memory()`` raises both thresholds,
as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` would: the process then keeps up
to ``TRIM_THRESHOLD`` bytes of freed heap, which generation reuses at the next step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt(3) parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit; blocks above it are still mapped
TRIM_THRESHOLD = 2**31 - 1  # the largest value mallopt takes: never trim in practice
TOP_PAD = 64 * 2**20  # grow the heap in steps of at least this much
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the settings once per process; True where they are in force. Nothing changes
    off glibc, or where the user set glibc's malloc variables (``MALLOC_*_``,
    ``GLIBC_TUNABLES=glibc.malloc...``) themselves."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if not sys.platform.startswith("linux") or _user_chose():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (M_TOP_PAD, TOP_PAD),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)


def _user_chose() -> bool:
    return any(name in os.environ for name in USER_SETTINGS) or (
        "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
    )
