"""Shoal: train networks on one process or many (C++ library, Python front).

The bindings live in shoal._shoal; this package sets the process up for
them first. libgomp (the OpenMP runtime the kernels use) reads its wait
settings once, when it loads, which is when the core below is imported: so
GOMP_SPINCOUNT is set here, to 10000 (a short spin, then sleep), as the shoal
binary sets it. libgomp's default long spin beside another busy process ran
two threads 3x slower than one, and sleeping at once costs idle hosts 20-37%
(docs/BENCHMARKS.md, bench/omp_wait.sh). A policy the user set
(OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept; an OpenMP runtime another module
loaded first (torch) cannot be changed any more, and a warning says so.
"""

import os as _os
import warnings as _warnings


def _openmp_loaded():
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libgomp" in maps.read()
    except OSError:
        return False


def _set_wait_policy():
    if "OMP_WAIT_POLICY" in _os.environ or "GOMP_SPINCOUNT" in _os.environ:
        return
    if _openmp_loaded():
        _warnings.warn(
            "shoal: the OpenMP runtime (libgomp) was loaded before shoal, by another module "
            "(torch?), with its default wait policy: its threads spin and fall below one "
            "thread's speed beside a busy process. Set GOMP_SPINCOUNT=10000 before Python "
            "starts, or import shoal first.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    _os.environ["GOMP_SPINCOUNT"] = "10000"


_set_wait_policy()

from ._shoal import *  # noqa: E402,F401,F403  (the bindings)
from ._shoal import __version__, build  # noqa: E402,F401
