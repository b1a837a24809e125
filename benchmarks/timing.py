"""What the Python benchmarks share: the best of several timed repeats, and an environment switch."""

import contextlib
import os
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


@contextlib.contextmanager
def mask_width(width):
    """MESHFUSE_ATTENTION_MASK=width inside the block (None: as the caller's environment has it)."""
    before = os.environ.get("MESHFUSE_ATTENTION_MASK")
    if width is not None:
        os.environ["MESHFUSE_ATTENTION_MASK"] = width
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MESHFUSE_ATTENTION_MASK", None)
        else:
            os.environ["MESHFUSE_ATTENTION_MASK"] = before
