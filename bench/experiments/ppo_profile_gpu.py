"""Profile PPO CartPole at PureJaxRL's configuration (4 envs x 128 steps) on the GPU, the sides of bench/ppo_single.py:
kernels per iteration, kernel time, the span of the GPU's work, wall time and host CPU time per iteration.

On an H200 (2026-11-27) fragc's program ran at 0.50 of PureJaxRL's here, where on the CPU it is ahead (1.35):
`plain_jit` (fragc's PPO as `jax.jit(lax.scan(iteration))`, no fragc runtime) and `fragc_no_trunc` (PureJaxRL's
GAE) say whether the gap is fragc's runtime, its PPO's maths, or the program XLA makes of it.

    python bench/experiments/ppo_profile_gpu.py [--k 16] [--iterations 32] [--sides ...] [--out /tmp]
"""
import argparse
import collections
import cProfile
import glob
import io
import os
import pstats
import resource
import sys
import tempfile
import time

import jax
from jax.profiler import ProfileData

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ppo_single  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def device_kernels(trace_dir: str) -> tuple[collections.Counter, collections.Counter, int, int]:
    """Kernel counts and times by name, their total time and the span from the first kernel's start to the last's
    end (ns), read from a `jax.profiler.trace` folder. On the CPU there are none."""
    kern, kt, busy, first, last = collections.Counter(), collections.Counter(), 0, None, None
    for path in glob.glob(trace_dir + "/**/*.xplane.pb", recursive=True):
        for plane in ProfileData.from_file(path).planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                if line.name.startswith("Stream") or "Kernel" in line.name:
                    for e in line.events:
                        kern[e.name] += 1
                        kt[e.name] += e.duration_ns
                        busy += e.duration_ns
                        first = e.start_ns if first is None else min(first, e.start_ns)
                        last = e.start_ns + e.duration_ns if last is None else max(last, e.start_ns + e.duration_ns)
    return kern, kt, busy, (last or 0) - (first or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch")
    parser.add_argument("--iterations", type=int, default=32, help="iterations profiled (a multiple of k)")
    parser.add_argument("--sides", default="fragc,plain_jit,fragc_no_trunc,purejaxrl")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="where the report goes")
    args = parser.parse_args()
    it = args.iterations
    sides = ppo_single.runners(argparse.Namespace(k=args.k, iterations=it, sides=args.sides.split(",")))
    lines = [f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}; {it} iterations of 4 envs x 128 steps"]
    print(lines[0], flush=True)
    for name, (state, run) in sides.items():
        state = jax.block_until_ready(run(jax.block_until_ready(run(state))))  # compiled and warm
        wall = cpu = float("inf")
        for _ in range(3):  # the best of three: the program's own cost, not the machine's noise
            t, c = time.perf_counter(), cpu_seconds()
            state = jax.block_until_ready(run(state))
            wall, cpu = min(wall, time.perf_counter() - t), min(cpu, cpu_seconds() - c)
        trace = tempfile.mkdtemp()
        with jax.profiler.trace(trace):
            state = jax.block_until_ready(run(state))
        kern, kt, busy, span = device_kernels(trace)
        lines.append(f"== {name}: wall {wall / it * 1e6:.0f} us/iteration, host CPU {cpu / it * 1e6:.0f} us/iteration; "
                     f"kernels {sum(kern.values()) / it:.0f}/iteration, kernel time {busy / it / 1e3:.0f} us/iteration, "
                     f"span {span / it / 1e3:.0f} us/iteration")
        lines += [f"    {kern[n] / it:6.1f}/it {c / it / 1e3:7.1f} us/it  {n[:100]}"
                  for n, c in sorted(kt.items(), key=lambda kv: -kv[1])[:15]]
        print("\n".join(lines[-16:] if kern else lines[-1:]), flush=True)
        if name == "fragc":  # the Python side of `Program.run`: where the host's time goes outside XLA
            profile = cProfile.Profile()
            profile.enable()
            state = jax.block_until_ready(run(state))
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
            lines.append("    the host's Python, one run of the fragc side (cProfile, by own time):")
            lines += ["      " + line for line in text.getvalue().splitlines() if line.strip()][-16:]
            print("\n".join(lines[-17:]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ppo_profile.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
