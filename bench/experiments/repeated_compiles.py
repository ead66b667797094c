"""Seconds per `fragc.compile` of PPO (its defaults) under four policies in one fresh process, as `fragc bench ppo
--policies ...` compiles them, and the seconds of each trace among them: how much a process's later traces reuse
of its earlier ones (JAX's tracing cache, scoped per trace: src/fragc/ir/frontend.py `_JIT_CACHE_SCOPE`). No persistent
compilation cache.

    JAX_NUM_CPU_DEVICES=8 python bench/experiments/repeated_compiles.py
    JAX_NUM_CPU_DEVICES=8 PYTHONPATH=/tmp/base-pkg python bench/experiments/repeated_compiles.py   # another tree
"""

import json
import time

import fragc
import fragc.compiler
from fragc.algos import make

POLICIES = ["single", "anakin", "gspmd", "actor_learner"]


def main() -> None:
    traces = []
    trace = fragc.compiler.trace

    def timed_trace(*args, **kwargs):
        start = time.perf_counter()
        module = trace(*args, **kwargs)
        traces.append(round(time.perf_counter() - start, 2))
        return module

    fragc.compiler.trace = timed_trace  # what `compile` calls
    seconds = {}
    try:
        for policy in POLICIES:
            start = time.perf_counter()
            fragc.compile(make("ppo"), policy, devices=4)
            seconds[policy] = round(time.perf_counter() - start, 2)
    finally:
        fragc.compiler.trace = trace
    print(json.dumps({"compile_s": seconds, "trace_s": traces}))


if __name__ == "__main__":
    main()
