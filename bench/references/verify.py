"""Run each reference built by build.py on a tiny configuration: one line each, ok / skipped (why) / failed (why).

Each check runs in a process of its own (the references share module names such as `ppo` and `wrappers`), in a
scratch working directory (CleanRL's scripts write runs/, pgx's AlphaZero checkpoints/), on its upstream
configuration (PureJaxRL's `__main__` dict, read from the file; the Hydra YAMLs of purejaxql and JaxMARL; CleanRL's
and pgx's AlphaZero's defaults) with only the sizes cut to a couple of updates (and pgx's AlphaZero on tic-tac-toe
instead of 9x9 Go). A check whose reference is not built, or whose extra dependency is not installed, is skipped.

    python bench/references/verify.py [--build bench/references/build] [--only purejaxrl/ppo,...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
SKIP, FAIL = 3, 4  # a check's exit status for "skipped" and "failed"; its last stdout line says why
EXTRA = "pip install -e '.[references]'"
TORCH = "torch is not in fragc[references] (PyPI's wheel brings CUDA's): install a CPU build of torch"


@dataclass(frozen=True)
class Check:
    reference: str  # build/<reference>/
    needs: tuple[str, ...]  # modules it imports beyond the core dependencies: missing -> skipped
    run: Callable[[Path], str]  # (reference's build folder) -> a short description of what ran
    install: str = EXTRA  # how to get what `needs` names


def main_config(path: Path) -> dict:
    """The `config = {...}` literal in a script's `if __name__ == "__main__":` block (PureJaxRL's own values)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "config":
                    return ast.literal_eval(stmt.value)
    raise ValueError(f"{path.name} has no config dict in its __main__ block")


def main_block(path: Path):
    """A script's `if __name__ == "__main__":` block, compiled, to run in the namespace of the module imported."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return compile(ast.Module(body=node.body, type_ignores=[]), str(path), "exec")
    raise ValueError(f"{path.name} has no __main__ block")


def hydra_config(config_dir: Path, name: str, overrides: list[str] | None = None) -> dict:
    """The configuration Hydra gives the script's `main` (`python script.py +alg=...`), as a plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return OmegaConf.to_container(compose(name, overrides=overrides or []))


def train(make_train: Callable, config: dict):
    """`jax.jit(make_train(config))(key)`, as the scripts' `__main__` run it; -> its output, computed."""
    import jax

    return jax.block_until_ready(jax.jit(make_train(config))(jax.random.PRNGKey(0)))


def purejaxrl(script: str, env: str | None = None, **sizes) -> Callable[[Path], str]:
    def run(build: Path) -> str:
        module = __import__(script)
        config = {**main_config(build / f"{script}.py"), "DEBUG": False, **sizes}  # DEBUG prints every episode
        config["ENV_NAME"] = env or config["ENV_NAME"]
        updates = int(config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"])
        train(module.make_train, config)
        return f"{config['ENV_NAME']}, {updates} updates"
    return run


def pqn(build: Path) -> str:
    import pqn_gymnax

    config = hydra_config(build / "config", "config", ["+alg=pqn_cartpole"])
    config = {**config, **config["alg"]}  # as its single_run merges it
    config.update(TOTAL_TIMESTEPS=2 * 32 * 64, TOTAL_TIMESTEPS_DECAY=2 * 32 * 64, TEST_INTERVAL=0.5, TEST_NUM_ENVS=8)
    out = train(pqn_gymnax.make_train, config)
    return f"{config['ENV_NAME']}, {len(out['metrics']['td_loss'])} updates, greedy test episodes included"


def jaxmarl(script: str, config_name: str) -> Callable[[Path], str]:
    def run(build: Path) -> str:
        import wandb

        module = __import__(script)
        config = hydra_config(build / "config", config_name)
        config.update(TOTAL_TIMESTEPS=2 * config["NUM_ENVS"] * config["NUM_STEPS"])
        wandb.init(mode="disabled")  # the scripts' per-update io_callback calls wandb.log
        train(module.make_train, config)
        return f"{config['ENV_NAME']}, 2 updates"
    return run


def cleanrl(script: str, *args: str) -> Callable[[Path], str]:
    """A whole CleanRL script, run as `python script.py ARGS` (in the scratch directory)."""
    def run(build: Path) -> str:
        done = subprocess.run([sys.executable, str(build / script), *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(last_line(done.stderr) or f"exit status {done.returncode}")
        return " ".join(args)
    return run


def pgx_alphazero(*args: str) -> Callable[[Path], str]:
    """pgx's AlphaZero train.py: imported at a configuration given as its command line (it reads sys.argv at
    import, as a bench does), then its own training loop (its __main__ block) run in that module; -> the last log."""
    def run(build: Path) -> str:
        sys.argv = ["train.py", *args]
        os.environ["WANDB_MODE"] = "disabled"  # the loop calls wandb.init and wandb.log
        import train as script

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # the loop prints its log dict every iteration
            exec(main_block(build / "train.py"), vars(script))
        log = ast.literal_eval(last_line(printed.getvalue()))
        rates = "/".join(f"{log[f'eval/vs_baseline/{k}_rate']:.2f}" for k in ("win", "draw", "lose"))
        return (f"{script.config.env_id}, {log['iteration']} iterations, {log['frames']} frames: policy loss "
                f"{log['train/policy_loss']:.3f}, value loss {log['train/value_loss']:.3f}; sampled policy vs "
                f"uniform random: win/draw/lose {rates}")
    return run


CHECKS = {
    "purejaxrl/ppo": Check("purejaxrl", ("distrax",), purejaxrl("ppo", TOTAL_TIMESTEPS=2 * 4 * 128)),
    "purejaxrl/ppo_rnn": Check("purejaxrl", ("distrax",), purejaxrl("ppo_rnn", TOTAL_TIMESTEPS=2 * 4 * 128)),
    "purejaxrl/ppo_continuous_action": Check(
        "purejaxrl", ("distrax", "brax"),
        purejaxrl("ppo_continuous_action", "inverted_pendulum", NUM_ENVS=8, NUM_MINIBATCHES=2,
                  TOTAL_TIMESTEPS=2 * 8 * 10)),
    "purejaxql/pqn_gymnax": Check("purejaxql", ("hydra", "wandb", "safetensors"), pqn),
    "jaxmarl/ippo_ff_mpe": Check("jaxmarl", ("distrax", "hydra", "wandb", "jaxmarl"),
                                 jaxmarl("ippo_ff_mpe", "ippo_ff_mpe")),
    "jaxmarl/mappo_rnn_mpe": Check("jaxmarl", ("distrax", "hydra", "wandb", "jaxmarl"),
                                   jaxmarl("mappo_rnn_mpe", "mappo_homogenous_rnn_mpe")),
    "jaxmarl/ippo_rnn_mpe": Check("jaxmarl", ("distrax", "hydra", "wandb", "jaxmarl"),
                                  jaxmarl("ippo_rnn_mpe", "ippo_rnn_mpe")),
    "cleanrl/ppo_atari_envpool_xla_jax": Check(
        "cleanrl", ("envpool", "tyro", "tensorboardX"),
        cleanrl("ppo_atari_envpool_xla_jax.py", "--total-timesteps", "256", "--num-steps", "32",
                "--update-epochs", "1")),
    "cleanrl_sac/sac_continuous_action_jax": Check(
        "cleanrl_sac", ("torch", "tyro", "tensorboard"),
        cleanrl("sac_continuous_action_jax.py", "--env-id", "Pendulum-v1", "--total-timesteps", "300",
                "--learning-starts", "100"), install=f"{EXTRA}; {TORCH}"),
    "pgx_alphazero/train": Check(
        "pgx_alphazero", ("haiku", "mctx", "pgx", "omegaconf", "pydantic", "wandb"),
        pgx_alphazero("env_id=tic_tac_toe", "num_channels=16", "num_layers=2", "selfplay_batch_size=64",
                      "num_simulations=8", "max_num_steps=32", "training_batch_size=256", "max_num_iters=2",
                      "eval_interval=1")),
}


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_one(name: str, build: Path) -> int:
    """In the child process: run check `name`, print what ran (or why it is skipped) as the last stdout line."""
    check = CHECKS[name]
    folder = build / check.reference
    if not (folder / "REFERENCE.json").exists():
        print(f"{check.reference} is not built (python bench/references/build.py)")
        return SKIP
    missing = [m for m in check.needs if importlib.util.find_spec(m) is None]
    if missing:
        print(f"needs {', '.join(missing)}, not installed: {check.install}")
        return SKIP
    sys.path.insert(0, str(folder))
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        try:
            print(check.run(folder))
        except Exception as error:  # the traceback to stderr, the verdict's one line to stdout
            traceback.print_exc()
            message = str(error).strip().splitlines()
            print(f"{type(error).__name__}: {message[0] if message else ''}")
            return FAIL
    return 0


def spawn(name: str, build: Path, timeout: float) -> tuple[str, str]:
    """Run check `name` in a process of its own; -> (ok / skipped / failed, what ran or why). XLA's compiled
    programs are kept in build/.jax_cache (JAX's persistent cache, keyed by program and versions), so a second run
    skips most compiling (not the JaxMARL scripts': JAX does not keep programs with host callbacks)."""
    env = {"JAX_COMPILATION_CACHE_DIR": str(build / ".jax_cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           **os.environ}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--build", str(build), "--one", name],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "failed", f"no result in {timeout:.0f} s"
    seconds = time.perf_counter() - start
    if done.returncode == SKIP:
        return "skipped", last_line(done.stdout)
    if done.returncode == FAIL:
        return "failed", last_line(done.stdout)
    if done.returncode:  # a crash, which printed no verdict
        return "failed", last_line(done.stderr) or f"exit status {done.returncode}"
    return "ok", f"{revision(build, CHECKS[name].reference)}; {last_line(done.stdout)}; {seconds:.0f} s"


def revision(build: Path, reference: str) -> str:
    return json.loads((build / reference / "REFERENCE.json").read_text())["commit"][:12]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=HERE / "build", help="build.py's output (default: %(default)s)")
    parser.add_argument("--only", help=f"comma-separated checks (default: all of {', '.join(CHECKS)})")
    parser.add_argument("--jobs", type=int, default=2, help="checks run at once (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for one check (default: %(default)s)")
    parser.add_argument("--one", choices=CHECKS, help=argparse.SUPPRESS)  # the child process's check
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build = args.build.resolve()
    if args.one:
        return run_one(args.one, build)
    names = args.only.split(",") if args.only else list(CHECKS)
    unknown = set(names) - set(CHECKS)
    if unknown:
        sys.exit(f"unknown checks: {', '.join(sorted(unknown))} (known: {', '.join(CHECKS)})")
    failed = False
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, (verdict, detail) in zip(names, pool.map(lambda name: spawn(name, build, args.timeout), names)):
            print(f"{name}: {verdict} ({detail})", flush=True)
            failed |= verdict == "failed"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
