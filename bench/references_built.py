"""Loading the references' own code that `bench/references/build.py` built into bench/references/build/ (gitignored).

A bench that compares with a reference calls `require(name)` first: where the reference is not built it stops with
the one command that builds it, and never runs a rewrite in its place.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from types import ModuleType

BUILD = os.environ.get("FRAGC_REFERENCES_BUILD") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                   "references", "build")
"""Where the references are built (`FRAGC_REFERENCES_BUILD` moves it: the tests point it at an empty folder)."""


def folder(name: str) -> str:
    return os.path.join(BUILD, name)


def built(name: str) -> dict | None:
    """The reference's REFERENCE.json (repository, commit, patches), or None where it is not built."""
    try:
        with open(os.path.join(folder(name), "REFERENCE.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def require(name: str) -> dict:
    """The reference's REFERENCE.json; exits with the command that builds it where it is not built."""
    manifest = built(name)
    if manifest is None:
        raise SystemExit(f"{name}: the reference's own code is not built in {folder(name)}; build it with "
                         f"`python bench/references/build.py` (from git mirrors of the references)")
    return manifest


def load(name: str, module: str) -> ModuleType:
    """Import `module` (a file of the reference, e.g. PureJaxRL's `ppo`) from its built folder."""
    require(name)
    path = folder(name)
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(module)


def processor() -> str:
    """The processor's model name, the cores this process may use and JAX's version (fragc's own description of
    the machine it decides its CPU lowerings for)."""
    from fragc.runtime.cpu_lowering import processor as described

    return described()


def jaxmarl_updates(config: dict) -> int:
    """JaxMARL's NUM_UPDATES for a yaml's config."""
    return int(config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"])


JAXMARL_PPO_FIELDS = {
    "env": ("ENV_NAME", lambda v: f"jaxmarl:{v}"), "num_envs": ("NUM_ENVS", int), "num_steps": ("NUM_STEPS", int),
    "total_steps": ("TOTAL_TIMESTEPS", int), "lr": ("LR", float), "anneal_lr": ("ANNEAL_LR", bool),
    "update_epochs": ("UPDATE_EPOCHS", int), "num_minibatches": ("NUM_MINIBATCHES", int), "gamma": ("GAMMA", float),
    "gae_lambda": ("GAE_LAMBDA", float), "clip_eps": ("CLIP_EPS", float), "ent_coef": ("ENT_COEF", float),
    "vf_coef": ("VF_COEF", float), "max_grad_norm": ("MAX_GRAD_NORM", float)}
"""fragc's config field -> (the key of JaxMARL's PPO yamls, its conversion): what every JaxMARL PPO yaml sets."""


def jaxmarl_differences(mine, config: dict, pairs: dict, fixed: dict) -> list[str]:
    """Where fragc's config `mine` differs from JaxMARL's yaml `config`: the fields of `pairs` (field -> (key,
    conversion)), what the script fixes in code (`fixed`: field -> value), environment arguments, and the
    iterations (JaxMARL's NUM_UPDATES)."""
    wrong = [f"{field}: fragc {getattr(mine, field)!r}, JaxMARL {key}={convert(config[key])!r}"
             for field, (key, convert) in pairs.items() if getattr(mine, field) != convert(config[key])]
    wrong += [f"{field}: fragc {getattr(mine, field)!r}, JaxMARL's script {value!r}"
              for field, value in fixed.items() if getattr(mine, field) != value]
    if config.get("ENV_KWARGS"):
        wrong.append(f"ENV_KWARGS: JaxMARL {config['ENV_KWARGS']!r}, fragc takes none")
    updates = jaxmarl_updates(config)
    if mine.iterations != updates:
        wrong.append(f"iterations: fragc {mine.iterations}, JaxMARL NUM_UPDATES {updates}")
    return wrong
