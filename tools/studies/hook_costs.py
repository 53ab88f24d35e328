"""Where a method's cost goes when it skips nothing, timed inside the run.

The bench's overhead table gives one figure per method: the CPU time it adds around the transformer blocks. This
study splits that figure for one method on the bench's heavy random-weight Flux (the overhead workload): the time
the pack's block hook spends outside the blocks it wraps, the decision with its transfer to the host, the stores
into the estimator and the accounting of the held cache, each in CPU milliseconds per step, next to the whole
overhead of the same round (a method run against the uncached run that follows it). Each timed function is
wrapped for the measurement only; the block time comes from the bench's own counters, which time every block.

    python3 -m cached_sampler_dev.studies.hook_costs              # First Block Cache, 4 rounds (about 1 min on 2 cores)
    python3 -m cached_sampler_dev.studies.hook_costs --method fixed_cadence --rounds 6

Prints a markdown table.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time


# (module of the pack, attribute path, label): what is timed
TIMED = [("adapter.blocks", "block_call", "block hook (with the blocks)"),
         ("interceptors.state", "LoopState.decide", "decision"),
         ("interceptors.lifecycle", "to_host", "transfer to the host"),
         ("interceptors.caches", "Caches.store", "stores"),
         ("interceptors.caches", "Caches.measure", "held-cache accounting")]


def wrap_timers(comfy, spent: dict) -> None:
    """Wrap each function of ``TIMED`` where the pack calls it from, adding its CPU seconds to ``spent``."""
    for module_name, path, label in TIMED:
        owner = comfy.module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        function = getattr(owner, name)

        def timed(*args, _function=function, _label=label, **kwargs):
            started = time.process_time()
            try:
                return _function(*args, **kwargs)
            finally:
                spent[_label] += time.process_time() - started
        setattr(owner, name, timed)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="fbcache", help="the bench's method key (default fbcache)")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds after one warm-up (default 4)")
    p.add_argument("--steps", type=int, default=8, help="steps per run (default 8, as the bench's overhead)")
    a = p.parse_args(argv)

    from ..bench.bench_discover import Config, discover, start_comfy
    from ..bench.bench_run import Bench, heavy_workload
    config = Config(steps=[], other_packs=False, plot=False, verbose=False)
    comfy = start_comfy(other_packs=False)
    methods, _ = discover(comfy.nodes, config)
    method = next((m for m in methods if m.key == a.method), None)
    if method is None:
        sys.exit(f"no method '{a.method}'; known: {', '.join(m.key for m in methods)}")
    zero = method.skips_nothing
    bench, workload = Bench(comfy, config, log=lambda _: None), heavy_workload(config)
    spent: dict[str, float] = collections.defaultdict(float)
    wrap_timers(comfy, spent)
    bench.run(workload, method, zero, a.steps)  # warm-up
    bench.run(workload, None, None, a.steps)
    rows = []
    for _ in range(a.rounds):
        spent.clear()
        run = bench.run(workload, method, zero, a.steps)
        base = bench.run(workload, None, None, a.steps)
        per_step = {label: seconds / a.steps * 1e3 for label, seconds in spent.items()}
        block_label = TIMED[0][2]
        if block_label in per_step:
            per_step["block hook, outside the blocks"] = per_step[block_label] - run.block_cpu_seconds / a.steps * 1e3
        around = (run.cpu_seconds - run.block_cpu_seconds) - (base.cpu_seconds - base.block_cpu_seconds)
        per_step["overhead around the blocks"] = around / a.steps * 1e3
        rows.append(per_step)
    print(f"{method.label} at {zero!r}, heavy random-weight Flux, {a.steps} steps, {a.rounds} rounds: "
          f"CPU ms per step\n")
    print("| | " + " | ".join(f"round {i + 1}" for i in range(len(rows))) + " | median |")
    print("|---" * (len(rows) + 2) + "|")
    for label in rows[0]:
        values = [row.get(label, 0.0) for row in rows]
        print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
