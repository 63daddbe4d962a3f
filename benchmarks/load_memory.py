"""Peak memory and time of one ``ndl.load`` (tracemalloc), in a fresh process.

    python benchmarks/load_memory.py numpy     # 8 float64 arrays of 8 MB as NumPy leaves
    python benchmarks/load_memory.py tensor    # the same as Tensors
"""
import os
import sys
import tempfile
import time
import tracemalloc

import numpy as np

import needle as ndl


def main(kind: str) -> str:
    """Save 8 x 8 MB leaves of ``kind``, load them once; the line of figures."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.ndl")
        leaves = [rng.standard_normal(1_000_000) for _ in range(8)]
        ndl.save({str(i): ndl.Tensor(a) if kind == "tensor" else a
                  for i, a in enumerate(leaves)}, path)
        del leaves
        tracemalloc.start()
        start = time.perf_counter()
        out = ndl.load(path)
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        assert len(out) == 8
        return (f"{kind}: file {os.path.getsize(path) / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB, "
                f"load {took * 1e3:.0f} ms")


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "numpy"))
