"""Memory that large requests used goes back to the system when they end.

glibc's malloc gives each large block a mapping of its own, unmapped when
freed, but only from a threshold that moves: freeing such a block raises
the threshold to its size (up to 32 MiB), and from then on blocks that size
come from the heaps (the main one, and one for each thread that allocates:
grpc's, the decoding threads), whose free memory goes back only from a
heap's top, and only past a trim threshold that moves with it (up to
64 MiB). Fixed thresholds keep large blocks (a request's bytes, their
copies, protobuf's arenas) in mappings of their own, gone when freed. What
smaller blocks leave free between blocks still in use (grpc reads a message
in slices) stays resident until ``malloc_trim`` hands it back, which
``runtime.reclaim`` calls after large requests.

Standard library only: the child processes that decode bodies import it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

# Blocks of this size or more get their own mapping (glibc's starting value,
# kept instead of raised): two system calls and a page fault per 4 KiB
# touched, a few microseconds against what filling the block costs.
MMAP_THRESHOLD = 128 * 1024
# Free memory at a heap's top past this goes back to the system.
TRIM_THRESHOLD = 1024 * 1024

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018  # glibc's, not musl's
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator() -> bool:
    """Fix glibc's thresholds (above); False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Setting either one stops glibc moving both.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``: the free pages of every heap go back to the
    system, those between blocks still in use too. Called through ctypes,
    it runs without the GIL. None where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))
