"""Profile fragc SAC unrolled / rolled and the CleanRL side rolled / unrolled on the GPU: kernels per iteration,
kernel time, wall time (why does unrolling help fragc's program and not the plain one?).

    python bench/experiments/sac_profile_gpu.py [--k 16] [--iterations 32] [--out /tmp]
"""
import argparse
import dataclasses
import os
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sac_plain  # noqa: E402
from experiments.ppo_profile_gpu import device_kernels  # noqa: E402

import fragc  # noqa: E402
from fragc.algos import sac  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16, help="iterations per dispatch")
    parser.add_argument("--iterations", type=int, default=32, help="iterations profiled")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"), help="where the HLO and the profile go")
    args = parser.parse_args()
    K, IT, OUT = args.k, args.iterations, args.out
    config = sac.Config(learning_starts=0)
    sides = {}
    for name, unroll in (("fragc", 0), ("fragc_rolled", 1)):
        prog = fragc.compile(sac.SAC(dataclasses.replace(config, unroll=unroll)), "single", iterations_per_dispatch=K)
        sides[name] = (prog.init(0), (lambda p: lambda s: p.run(s, IT)[0])(prog))
        with open(f"{OUT}/hlo_{name}.txt", "w") as f:
            f.write(prog.hlo(prog.executables[0], optimized=True))
    for name, unroll in (("cleanrl", 1), ("cleanrl_unrolled", 8)):
        init, train = sac_plain.fused(config, K, unroll)
        ps = init(jax.random.key(0))
        train = train.lower(ps).compile()
        sides[name] = (ps, sac_plain.dispatched(train, IT, K))
    lines = []
    for name, (s, run) in sides.items():
        s = jax.block_until_ready(run(s))
        s = jax.block_until_ready(run(s))
        t = time.perf_counter()
        jax.block_until_ready(run(s))
        wall = time.perf_counter() - t
        d = tempfile.mkdtemp()
        with jax.profiler.trace(d):
            jax.block_until_ready(run(s))
        kern, kt, busy, span = device_kernels(d)
        lines.append(f"== {name}: wall {wall/IT*1e6:.0f} us/iteration; kernels {sum(kern.values())/IT:.0f}/iteration, "
                     f"kernel time {busy/IT/1e3:.0f} us/iteration, span {span/IT/1e3:.0f} "
                     "us/iteration")
        for n, c in sorted(kt.items(), key=lambda kv: -kv[1])[:12]:
            lines.append(f"    {kern[n]/IT:6.1f}/it {c/IT/1e3:7.1f} us/it  {n[:100]}")
        print("\n".join(lines[-13:]), flush=True)
    with open(f"{OUT}/sac_profile.txt", "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
