"""What the Python benchmarks share: the best of several timed repeats, the mean of back-to-back
calls by CUDA events (GPU), a scoped environment variable (the settings meshfuse reads at each
execute), a kernel profile under torch.profiler (GPU), and the reading of a meshfuse trace file
(its events; a host trace's program, segments and steps)."""

import argparse
import contextlib
import os
import time


def positive_int(text):
    """argparse type of a count that must be at least 1 (0 repeats or iterations used to end in a
    traceback: an empty min(), a division by zero, a median of nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def cuda_event_ms(fn, iters=20, warmup=3):
    """Milliseconds per call of fn on the GPU: `iters` back-to-back calls between two CUDA events
    (what the device spends, not the host), after `warmup` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


@contextlib.contextmanager
def scoped_env(name, value):
    """The environment variable `name` set to `value` inside the block (None: left as the caller's
    environment has it), and restored after: for settings meshfuse reads at each execute."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def kernel_profile(label, fn, sync, top=8, timeline=False):
    """One call of fn under torch.profiler: wall time, the GPU's busy time (kernels and copies, all
    streams, so host gaps show as wall - busy), and the kernels that take most of it; with timeline,
    also every kernel in the order it ran (to tell apart the launches of one kernel name)."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    wall = (time.perf_counter() - start) * 1e3
    by_name, busy = {}, 0.0
    for e in prof.events():
        # device_time (torch >= 2.4); cuda_time only where it is missing (it warns as deprecated).
        us = e.device_time if hasattr(e, "device_time") else getattr(e, "cuda_time", 0.0)
        us = us or 0.0
        if str(getattr(e, "device_type", "")).endswith("CUDA") and us:
            busy += us / 1e3
            by_name[e.name] = by_name.get(e.name, 0.0) + us / 1e3
    tops = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    print(f"# {label:<10} {wall:>8.2f} {busy:>12.2f}  " + "; ".join(f"{n[:60]} {ms:.3f}" for n, ms in tops))
    print_idle_gaps(label, prof)
    if timeline:
        print_timeline(label, prof)


def device_spans(prof):
    """(start us, end us, name) of each GPU kernel or copy the profile saw, in start order."""
    return sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                  if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > e.time_range.start)


def print_timeline(label, prof):
    """Each GPU kernel or copy of the call, in start order, with its microseconds."""
    for i, (start, end, name) in enumerate(device_spans(prof)):
        print(f"#   {label} {i:3d} {end - start:9.1f} us  {name[:90]}")


def print_idle_gaps(label, prof, top=6, min_us=5.0):
    """Where the GPU sat idle between the first and the last kernel of the call (host launch cost,
    synchronizations): the gaps longer than min_us, with the kernels on either side of each."""
    gaps, reach, before = [], None, None
    for start, end, name in device_spans(prof):
        if reach is not None and start - reach > min_us:
            gaps.append((start - reach, before, name))
        if reach is None or end > reach:
            reach, before = end, name
    total = sum(g for g, _, _ in gaps) / 1e3
    worst = sorted(gaps, key=lambda g: -g[0])[:top]
    print(f"#   {label} idle inside the call: {total:.2f} ms in {len(gaps)} gaps > {min_us:.0f} us; longest: " +
          "; ".join(f"{g:.0f} us {a[:28]} -> {b[:28]}" for g, a, b in worst))


def host_device_split(label, fn, sync, iters=5):
    """Where a call's wall time goes, medians over `iters` calls after one warm-up: the host's time to
    return from fn (launching its kernels), the device's time between CUDA events recorded on the
    current stream just before and just after the call (which includes any wait for the host's
    first launch), and the wall time to the synchronization. Wall ~ host: launch-bound; wall ~ events
    >> the profile's busy time: the device ran slower than under the profiler (clocks, power)."""
    import statistics

    import torch
    fn()
    sync()
    host, dev, wall = [], [], []
    for _ in range(iters):
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sync()
        t0 = time.perf_counter()
        before.record()
        fn()
        t1 = time.perf_counter()
        after.record()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
        dev.append(before.elapsed_time(after))
    clock = ""
    with contextlib.suppress(Exception):  # pynvml may be missing
        clock = f", SM clock now {torch.cuda.clock_rate()} MHz"
    print(f"#   {label} host/device split: host launch {statistics.median(host):.2f} ms, device events "
          f"{statistics.median(dev):.2f} ms, wall {statistics.median(wall):.2f} ms{clock}")


def trace_events(path):
    """The events of a meshfuse trace file (a {"traceEvents": [...]} object or a bare list)."""
    import json
    with open(path) as f:
        events = json.load(f)
    return events.get("traceEvents", events) if isinstance(events, dict) else events


def host_trace_summary(path, pid=0, top=6):
    """From a trace written with trace_host=True (each segment's span: the host's time to launch it):
    (the host program's ms, ms per segment kind, the `top` slowest segments as (ms, name), and the
    executor's own steps inside the segments (category "host detail", runtime/host_span.h) as
    (self ms, name, count), most first: a step's time less that of the steps inside it)."""
    program, kinds, segments, details = 0.0, {}, [], []
    for ev in trace_events(path):
        if ev.get("ph") != "X" or ev.get("pid") != pid:
            continue
        if ev.get("cat") == "host detail":
            details.append(ev)
        if ev.get("cat") != "host":
            continue
        ms = ev["dur"] / 1e3
        if ev["name"] == "host program":
            program += ms
            continue
        kind = ev["name"].split()[0]
        kinds[kind] = kinds.get(kind, 0.0) + ms
        segments.append((ms, ev["name"]))
    return program, kinds, sorted(segments, reverse=True)[:top], detail_self_times(details)


def detail_self_times(events):
    """[(self ms, name, count)] of nested spans (one thread's): each span's time less its children's."""
    self_us, counts, stack = {}, {}, []
    for ev in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= ev["ts"]:
            stack.pop()
        if stack:
            self_us[stack[-1]["name"]] -= ev["dur"]
        self_us[ev["name"]] = self_us.get(ev["name"], 0.0) + ev["dur"]
        counts[ev["name"]] = counts.get(ev["name"], 0) + 1
        stack.append(ev)
    return sorted(((us / 1e3, name, counts[name]) for name, us in self_us.items()), reverse=True)
