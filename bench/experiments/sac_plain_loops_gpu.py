"""Does the CleanRL side gain from unrolling when its dispatch loop is written as fragc's (fori_loop, static trip
count, metrics written into preallocated rows) instead of lax.scan with stacked outputs? Alternating medians."""
import statistics, sys, time
sys.path.insert(0, "bench")
import jax, jax.numpy as jnp
import fragc, sac_plain
from fragc.algos import sac

K, IT, REPEATS = 16, 64, 9
config = sac.Config(learning_starts=0)


def dispatches(step):
    return sac_plain.dispatched(step, IT, K)


def fori(train):
    def loop(s):
        def body(i, carry):
            s, rows = carry
            s, m = train.update_step(s, None)
            return s, jax.tree.map(lambda r, x: r.at[i].set(x), rows, m)
        _, m0 = jax.eval_shape(train.update_step, s, None)
        rows = jax.tree.map(lambda x: jnp.zeros((K,) + x.shape, x.dtype), m0)
        return jax.lax.fori_loop(0, K, body, (s, rows))
    return loop


prog = fragc.compile(sac.SAC(config), "single", iterations_per_dispatch=K)
sides = {"fragc": (prog.init(0), lambda s: prog.run(s, IT)[0])}
for unroll in (1, 8):
    train = sac_plain.make_train(config, unroll)
    ps = jax.jit(train.init)(jax.random.key(0))
    scan = jax.jit(lambda s: jax.lax.scan(train.update_step, s, None, K), donate_argnums=0).lower(ps).compile()
    loop = jax.jit(fori(train), donate_argnums=0).lower(ps).compile()
    sides[f"cleanrl_scan_u{unroll}"] = (ps, dispatches(scan))
    sides[f"cleanrl_fori_u{unroll}"] = (ps, dispatches(loop))
states = {n: jax.block_until_ready(run(s)) for n, (s, run) in sides.items()}
times = {n: [] for n in sides}
for _ in range(REPEATS):
    for n, (_, run) in sides.items():
        t = time.perf_counter(); jax.block_until_ready(run(states[n])); times[n].append(time.perf_counter() - t)
print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, {REPEATS} alternating repeats of {IT} iterations")
for n, ts in times.items():
    r = [b / t for b, t in zip(times["cleanrl_scan_u1"], ts)]
    print(f"{n:18} {statistics.median([IT * 8 / t for t in ts]):8.0f} env-steps/s  / cleanrl_scan_u1: median "
          f"{statistics.median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})", flush=True)
