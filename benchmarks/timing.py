"""The wall-clock timer the Python benchmarks share: the best of several timed repeats."""

import time


def best_time(fn, calls=1, repeat=5, warmup=True):
    """Seconds per call of fn: the fastest of `repeat` timings of `calls` back-to-back calls (the
    least disturbed by other work on the machine). `warmup` makes one untimed call first (compilation,
    first-touch allocation)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return min(times)
