"""Every built-in algorithm's parameters after `fragc run ALGO --seed 0 --iterations 6 --json`, pinned bit for bit.

A refactor of src/fragc/algos/ changes no bit of any algorithm: each algorithm's fingerprint as it was pinned when it
was added, run in one fresh process with one CPU device, as the command runs (tests/fingerprints.py). They are XLA's CPU bits of the pinned jax (pyproject.toml) on x86-64: a jax upgrade
re-pins them, with the change said in CHANGELOG.md. -m slow (a minute and a half of compiling); .ci/run runs it
after the default suite.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from fragc.algos import ALGOS

PINNED = {
    "ppo": "cc28095ade0c3dca",
    "a2c": "d8dab052f3512f6a",
    "ppo_continuous": "3aead16fdf9a997f",
    "dqn": "5f2102b1d02d95a6",
    "sac": "1e3f475da0a15675",
    "pqn": "28bbd781eccae4d5",
    "ppo_rnn": "e6922f66e8452f44",
    "impala": "8f31cb8f8f55cde3",
    "ippo": "def08a9461caa3a6",
    "mappo": "89a1c2a12dfa0a6c",
    "ippo_rnn": "8caa36b9ad44bdea",
    "mappo_rnn": "73ee8a2a641de152",
    "alphazero": "22deb9dbb7b343e2",
    "muzero": "5a76050a32eab931",
}
PINNED_JAX = "0.10.2"


def test_every_built_in_algorithm_is_pinned():
    assert set(PINNED) == set(ALGOS)


@pytest.mark.slow
def test_every_algorithm_s_parameters_are_the_pinned_bits():
    assert jax.__version__ == PINNED_JAX, f"the pins are jax {PINNED_JAX}'s bits; re-pin them for {jax.__version__}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("JAX_")}
    env["FRAGC_CPU_THREADS"] = "xla"  # the pins are on XLA's default threads: on one, ppo_rnn's bits differ
    script = pathlib.Path(__file__).with_name("fingerprints.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == PINNED, {algo: (got.get(algo), pin) for algo, pin in PINNED.items() if got.get(algo) != pin}
