"""A trained policy outside fragc's runs: `load_policy(folder)` and `export_policy(checkpoint_dir, out)`.

`load_policy` reads either a checkpoint folder (`fragc run --checkpoint-dir`: the latest good checkpoint, a
population's member by `member`) or an export folder (`fragc export`: the policy's parameters as flax msgpack,
`params.msgpack`, and `policy.json` naming the algorithm and its config). Either way the algorithm is rebuilt from
its name and config (`fragc.algos.make`), no training state is read beyond the policy's parameters, and nothing is
compiled until the policy is called.

The policy acts on a batch of observations as the algorithm's environment gives them (axis 0: the batch):
- `policy(obs)`: the deterministic policy (the algorithm's `greedy_action`, what evaluation and videos act with);
- `policy(obs, key)`: a sample from the stochastic policy (the PPO family, SAC; a value-based policy refuses a
  key in one line);
- a recurrent policy (`ppo_rnn`) carries its hidden state: `carry = policy.initial_carry(n)`, then
  `carry, action = policy(obs, carry=carry, reset=done)` each step, `reset` marking the observations that start
  an episode.
Each call is jittable: `jax.jit(policy)` or `jax.jit(policy.act)`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from fragc import __version__
from fragc.ir.errors import FragcError
from fragc.runtime.reporting import config_dict

EXPORT_PARAMS = "params.msgpack"
EXPORT_META = "policy.json"


class Policy:
    """An algorithm's trained policy: its parameters and how it acts (module docstring)."""

    def __init__(self, algo: Any, params: Any, meta: dict):
        self.algo, self.params, self.meta = algo, params, meta
        self.recurrent = callable(getattr(algo, "greedy_step", None))
        if not self.recurrent and not callable(getattr(algo, "greedy_action", None)):
            raise FragcError(f"{type(algo).__name__} has no greedy_action(params, obs): fragc cannot act with its "
                             "policy")

    def initial_carry(self, n: int) -> Any:
        """A recurrent policy's hidden state for `n` observations at an episode's start (None when feed-forward)."""
        return self.algo.initial_carry(n) if self.recurrent else None

    def act(self, params: Any, obs: jax.Array, key: jax.Array | None = None, carry: Any = None,
            reset: jax.Array | None = None) -> Any:
        """The actions for `obs` under `params` (the module docstring says which); `(carry, actions)` when
        recurrent."""
        if self.recurrent:
            if key is not None:
                raise FragcError(f"{self.name}: a recurrent policy acts greedily here; call it without a key")
            if carry is None:
                raise FragcError(f"{self.name}: a recurrent policy needs its carry: carry = policy.initial_carry(n)")
            reset = jax.numpy.zeros(obs.shape[:-1], bool) if reset is None else reset  # multi-agent rows: [n, A]
            return self.algo.greedy_step(params, carry, obs, reset)
        if key is None:
            return self.algo.greedy_action(params, obs)
        return self._sample(params, obs, key)

    def _sample(self, params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        """A sample of the stochastic policy, as the environment takes it: the actor-critics' model's `act` (a key
        per observation), SAC's squashed Gaussian (standard normal noise [n, |A|]); refused for a policy that is
        greedy on its values."""
        if callable(getattr(self.algo, "squashed_gaussian", None)):
            noise = jax.random.normal(key, (obs.shape[0], self.algo.action_dim))
            return self.algo.env_action(self.algo.squashed_gaussian(params, obs, noise)[0])
        model = getattr(self.algo, "model", None)
        if callable(getattr(model, "act", None)) and callable(getattr(model, "env_action", None)):
            return model.env_action(model.act(params, obs, jax.random.split(key, obs.shape[0]))[0])
        raise FragcError(f"{self.name}'s policy is deterministic (greedy on its values): call it without a key")

    def __call__(self, obs: jax.Array, key: jax.Array | None = None, carry: Any = None,
                 reset: jax.Array | None = None) -> Any:
        return self.act(self.params, obs, key, carry, reset)

    @property
    def name(self) -> str:
        return str(self.meta.get("algo", type(self.algo).__name__))


def load_policy(folder: str | os.PathLike, member: int = 0) -> Policy:
    """The policy saved in `folder`: a checkpoint folder or an export folder (module docstring)."""
    directory = os.fspath(folder)
    if os.path.isfile(os.path.join(directory, EXPORT_META)):
        return _load_export(directory)
    from fragc.sinks.video import restore_policy

    algo, params, meta = restore_policy(directory, member)
    return Policy(algo, params, meta)


def export_policy(checkpoint_dir: str | os.PathLike, out: str | os.PathLike, member: int = 0) -> str:
    """Write the policy of the latest good checkpoint in `checkpoint_dir` to `out`: `params.msgpack` (flax's
    msgpack of the policy's parameters) and `policy.json` (the algorithm, its config, fragc's version); -> `out`."""
    from flax import serialization

    policy = load_policy(checkpoint_dir, member)
    out = os.fspath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise FragcError(f"--out {out}: a file is there, not a folder")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, EXPORT_PARAMS), "wb") as f:
        f.write(serialization.to_bytes(jax.device_get(policy.params)))
    meta = {"algo": policy.meta.get("algo"), "config": policy.meta.get("config") or config_dict(policy.algo),
            "fragc": __version__, "checkpoint": os.path.abspath(os.fspath(checkpoint_dir)), "member": member}
    with open(os.path.join(out, EXPORT_META), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    return out


def _load_export(directory: str) -> Policy:
    from flax import serialization

    from fragc.sinks.video import algo_of

    try:
        with open(os.path.join(directory, EXPORT_META)) as f:
            meta = json.load(f)
        with open(os.path.join(directory, EXPORT_PARAMS), "rb") as f:
            stored = f.read()
    except (OSError, ValueError) as err:
        raise FragcError(f"'{directory}' is not a readable fragc export ({type(err).__name__}: {err})") from None
    algo = algo_of(meta, directory)
    template = algo.policy_params(jax.eval_shape(algo.init, jax.random.key(0)))
    try:
        params = serialization.from_bytes(template, stored)
    except Exception as err:  # noqa: BLE001 - msgpack's and flax's own errors: the file does not fit the algorithm
        raise FragcError(f"'{os.path.join(directory, EXPORT_PARAMS)}' does not hold {meta.get('algo')}'s parameters "
                         f"for this config ({type(err).__name__})") from None
    return Policy(algo, jax.tree.map(jax.numpy.asarray, params), meta)
