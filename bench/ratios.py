#!/usr/bin/env python3
"""Ratios from idem-bench's Google Benchmark JSON output.

    idem-bench --benchmark_repetitions=5 --benchmark_out=run.json --benchmark_out_format=json
    python3 bench/ratios.py run.json [more.json ...] [--markdown] [--metric NAME]

Benchmark names are "<scenario>/<guard>/...", e.g. "fresh_begin_succeed/idem/iterations:1048576/
real_time/threads:2". For every scenario and thread count this prints each guard's ops/s (the median
over repetitions; the median aggregate when only aggregates were written) and idem's ratio to each
peer (every guard named idem*: default options and options.prefault), then each guard's 100-thread / 2-thread scaling. Two metrics are shown:

  items_per_second       Google Benchmark's rate: items / mean of the threads' own run times
  wall_items_per_second  idem-bench's counter: items / elapsed time of the whole run (the honest
                         figure when threads outnumber cores: some threads finish early)

Standard library only. Exit status 1 when a run reports unexpected answers (counter `unexpected`).
"""
import argparse
import json
import signal
import statistics
import sys
from collections import defaultdict

REFERENCE = "idem"  # every guard whose name starts with this is compared with every other guard
METRICS = ("items_per_second", "wall_items_per_second")


def load(paths):
    """Returns {(scenario, guard, threads): {metric: [values]}} and the summed `unexpected` counts."""
    runs = defaultdict(lambda: defaultdict(list))
    order = {}  # scenario -> first appearance, so tables follow the binary's order
    medians = defaultdict(dict)  # from median aggregates, used when no per-repetition runs exist
    unexpected = defaultdict(float)
    context = None
    for path in paths:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        context = context or data.get("context", {})
        for b in data.get("benchmarks", []):
            if b.get("error_occurred"):
                print(f"warning: {b['name']}: {b.get('error_message', 'error')}", file=sys.stderr)
                continue
            parts = b.get("run_name", b["name"]).split("/")
            if len(parts) < 2:
                continue
            key = (parts[0], parts[1], int(b.get("threads", 1)))
            order.setdefault(parts[0], len(order))
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    for m in METRICS:
                        if m in b:
                            medians[key][m] = float(b[m])
                continue
            unexpected[key] += float(b.get("unexpected", 0))
            for m in METRICS:
                if m in b:
                    runs[key][m].append(float(b[m]))
    table = {}
    for key in set(runs) | set(medians):
        table[key] = {}
        for m in METRICS:
            values = runs.get(key, {}).get(m)
            if values:
                table[key][m] = (statistics.median(values), min(values), max(values), len(values))
            elif m in medians.get(key, {}):
                v = medians[key][m]
                table[key][m] = (v, v, v, 1)
    return table, unexpected, context or {}, order


def human(x):
    """3 significant digits with a k/M/G suffix: 1.41M, 999k."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0)):
        if float(f"{x / scale:.3g}") >= 1 or not unit:
            return f"{float(f'{x / scale:.3g}'):g}{unit}"


def render(rows, markdown):
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def is_reference(guard):
    return guard.startswith(REFERENCE)


def guard_order(guards):
    return sorted(guards, key=lambda g: (not is_reference(g), g))


def report(table, order, metric, markdown, spread):
    scenarios = sorted({s for s, _, _ in table}, key=lambda s: order.get(s, len(order)))
    lines = []
    for scenario in scenarios:
        keys = [k for k in table if k[0] == scenario and metric in table[k]]
        if not keys:
            continue
        guards = guard_order({g for _, g, _ in keys})
        refs = [g for g in guards if is_reference(g)]
        peers = [g for g in guards if not is_reference(g)]
        threads = sorted({t for _, _, t in keys})
        head = ["threads"] + [f"{g} ops/s" for g in guards]
        head += [f"{r}/{p}" for r in refs for p in peers]
        rows = [head]
        for t in threads:
            row = [str(t)]
            for g in guards:
                cell = table.get((scenario, g, t), {}).get(metric)
                if cell is None:
                    row.append("-")
                elif spread and cell[3] > 1:
                    row.append(f"{human(cell[0])} ({human(cell[1])}-{human(cell[2])})")
                else:
                    row.append(human(cell[0]))
            for r in refs:
                ref = table.get((scenario, r, t), {}).get(metric)
                for p in peers:
                    other = table.get((scenario, p, t), {}).get(metric)
                    row.append(f"{ref[0] / other[0]:.2f}x" if ref and other and other[0] > 0 else "-")
            rows.append(row)
        lines.append(f"{scenario} ({metric}, median over repetitions"
                     + (", min-max in parentheses" if spread else "") + ")")
        lines.append(render(rows, markdown))
        if 2 in threads and 100 in threads:
            scale = []
            for g in guards:
                two = table.get((scenario, g, 2), {}).get(metric)
                hundred = table.get((scenario, g, 100), {}).get(metric)
                if two and hundred and two[0] > 0:
                    scale.append(f"{g} {hundred[0] / two[0]:.2f}x")
            lines.append("100 threads / 2 threads: " + ", ".join(scale))
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="Google Benchmark JSON output files (runs are pooled)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--metric", choices=METRICS, action="append", help="metric(s) to show (default: both)")
    ap.add_argument("--no-spread", action="store_true", help="omit the min-max over repetitions")
    args = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head

    table, unexpected, context, order = load(args.files)
    if not table:
        print("no idem-bench results found", file=sys.stderr)
        return 1
    info = [context.get(k) for k in ("date", "host_name", "compiler", "cxx_flags")]
    print("# " + ", ".join(str(i) for i in info if i))
    for metric in args.metric or METRICS:
        print(report(table, order, metric, args.markdown, not args.no_spread))
    bad = {k: v for k, v in unexpected.items() if v}
    for (s, g, t), v in sorted(bad.items()):
        print(f"error: {s}/{g}/threads:{t} reported {v:.0f} unexpected answers", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
