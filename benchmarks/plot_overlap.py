"""Draws a meshfuse Chrome trace (fd.execute(..., trace=...) or MESHFUSE_TRACE) as a PNG timeline:
one row per rank x lane (lane 0 compute, lanes 1.. communication streams), one box per event,
compute and communication in two colours, "[chunk i]" events labelled with i; prints per rank the
stream loop's time, the time in matmuls and the rest (what the overlap left exposed).

    /usr/bin/python3 benchmarks/plot_overlap.py trace.json -o overlap.png [--title TEXT]

Needs only matplotlib (Debian's python3-matplotlib with Debian's python3); it does not import meshfuse.
A communication box spans post to completed wait: the time the chunk was in flight, an upper bound on
the transfer itself.
"""
import argparse
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {"compute": "#4c72b0", "communication": "#dd8452"}
OTHER_COLOUR = "#999999"
CHUNK = re.compile(r"\[chunk (\d+)\]")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    lane_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                  if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if not spans:
        raise SystemExit(f"{path}: no duration events (ph = X)")
    return spans, lane_names


def draw(spans, lane_names, title):
    rows = sorted({(e["pid"], e["tid"]) for e in spans} | set(lane_names))
    row_of = {key: i for i, key in enumerate(rows)}
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    scale, unit = (1e-3, "ms") if end - start > 2000 else (1.0, "µs")

    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6), dpi=100)
    for e in spans:
        y = row_of[(e["pid"], e["tid"])]
        left, width = (e["ts"] - start) * scale, e["dur"] * scale
        ax.broken_barh([(left, width)], (y - 0.38, 0.76), facecolors=COLOURS.get(e.get("cat"), OTHER_COLOUR),
                       edgecolors="black", linewidths=0.5)
        chunk = CHUNK.search(e["name"])
        label = chunk.group(1) if chunk else e["name"].split()[0]
        if width > 0.012 * (end - start) * scale:  # only where the label fits
            ax.text(left + width / 2, y, label, ha="center", va="center", fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid} · {lane_names.get((pid, tid), f'lane {tid}')}" for pid, tid in rows], fontsize=8)
    ax.invert_yaxis()
    for i in range(1, len(rows)):  # a line between ranks
        if rows[i][0] != rows[i - 1][0]:
            ax.axhline(i - 0.5, color="black", linewidth=0.8)
    ax.set_xlim(0, (end - start) * scale * 1.01)
    ax.set_xlabel(f"time ({unit}); numbers in boxes are chunk indices")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.legend(handles=[Patch(facecolor=c, edgecolor="black", label=k) for k, c in COLOURS.items()],
              loc="upper right", fontsize=8, ncol=2, framealpha=0.9)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def summarize(spans):
    """Per rank, over the chunk events: the loop's span, the time in matmuls, and the rest (the
    compute lane waiting for communication or doing bookkeeping): what the overlap did not hide."""
    lines = []
    for pid in sorted({e["pid"] for e in spans}):
        chunks = [e for e in spans if e["pid"] == pid and CHUNK.search(e["name"])]
        if not chunks:
            continue
        loop = max(e["ts"] + e["dur"] for e in chunks) - min(e["ts"] for e in chunks)
        matmuls = sum(e["dur"] for e in chunks if e.get("cat") == "compute")
        lines.append(f"rank {pid}: stream loop {loop / 1e3:.2f} ms, in matmuls {matmuls / 1e3:.2f} ms, "
                     f"exposed (waiting) {(loop - matmuls) / 1e3:.2f} ms")
    return lines


def main():
    p = argparse.ArgumentParser(description="meshfuse trace JSON -> PNG timeline")
    p.add_argument("trace")
    p.add_argument("-o", "--output", default="overlap.png")
    p.add_argument("--title", help="default: the trace's file name")
    args = p.parse_args()
    spans, lane_names = load(args.trace)
    fig = draw(spans, lane_names, args.title or args.trace)
    fig.savefig(args.output)
    for line in summarize(spans):
        print(line)
    print(f"wrote {args.output}: {len(spans)} events on {len({(e['pid'], e['tid']) for e in spans})} lanes")


if __name__ == "__main__":
    main()
