"""Time of a CPU sum over a leading axis of extent 1 ([1, 4096, 4096] float32 -> [4096, 4096]),
which the CPU executor runs as a converting copy (it used to go through the column kernel).

    .venv/bin/python benchmarks/sum_extent_one.py
"""
import time

import numpy as np

from meshfuse import DataType, FusionDefinition


def main():
    x = np.random.rand(1, 4096, 4096).astype(np.float32)
    with FusionDefinition() as fd:
        t = fd.define_tensor([1, 4096, 4096], DataType.Float)
        fd.add_output(fd.ops.sum(t, [0]))
    out = fd.execute([x])[0]
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = fd.execute([x])[0]
        times.append(time.perf_counter() - t0)
    print(f"sum over [1,4096,4096] axis 0: {min(times) * 1e3:.1f} ms (best of 5); "
          f"matches numpy: {np.allclose(out, x[0])}")


if __name__ == "__main__":
    main()
