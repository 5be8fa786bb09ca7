"""Give PyTorch's f32 matmuls the BLAS kernels this CPU can run.

Debian's PyTorch 1.13 does its f32 matmuls in OpenBLAS 0.3.21, which picks
its kernels from the CPU model. On a virtual CPU it does not know ("Intel(R)
Xeon(R) Processor", seen 2026-11-28) it falls back to its generic "Prescott"
kernels: a [2048, 512] x [512, 128] matmul took 8.1 ms instead of 2.2 ms with
the SkylakeX kernels, and the GPT peer trained at 6k tok/s instead of ~15k.
A benchmark against a crippled peer proves nothing, so unless the user set
OPENBLAS_CORETYPE, the benchmarks set it from the CPU's flags before any
peer starts (children inherit it; Shoal reads OpenBLAS for f64 only).
"""
import os
import sys


def pin_openblas_core():
    if "OPENBLAS_CORETYPE" in os.environ:
        return os.environ["OPENBLAS_CORETYPE"]
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return None
    core = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
        print(f"(OPENBLAS_CORETYPE={core} for the PyTorch peer: bench/blas_core.py)",
              file=sys.stderr)
    return core
