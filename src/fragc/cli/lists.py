"""`fragc policies`, `fragc algos`, `fragc envs`: one line per built-in policy, algorithm, environment."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
from typing import Any, Callable

from fragc.algos import ALGOS
from fragc.algos.device_suites import CRAFTAX_IDS
from fragc.algos.envs import BACKENDS, backend_summary, env_names, make
from fragc.ir.errors import FragcError
from fragc.passes.policy import BUILTIN
from fragc.runtime.user_cache import read_json, user_cache_folder, write_json


def add_options(parser: argparse.ArgumentParser, algo: str | None) -> None:
    if parser.prog.split()[-1] == "envs":  # `fragc envs [FILTER]`; policies and algos list everything they know
        parser.add_argument("filter", nargs="?", default=None, metavar="TEXT",
                            help="list only the environment ids that contain TEXT (case-insensitive)")


def main(args: argparse.Namespace) -> int:
    if args.command == "envs":
        environments(getattr(args, "filter", None))
    else:
        {"policies": policies, "algos": algorithms}[args.command]()
    return 0


def policies() -> None:
    for name, factory in BUILTIN.items():
        print(f"{name:22} {(factory.__doc__ or '').strip().splitlines()[0]}")
    print(f"{'population(POLICY,S)':22} S independent runs of POLICY vectorised over seeds")


def algorithms() -> None:
    for name, (*_, summary) in ALGOS.items():
        print(f"{name:16} {summary}")


def environments(text: str | None = None) -> None:
    """The backends (without a filter), then every backend's ids grouped by backend, as `--env` takes them (a
    gymnax id bare, with its action space); with `text`, only the ids containing it (case-insensitive)."""
    groups: list[list[str]] = []
    if text is None:
        groups.append([f"{backend + ':ID':26} {backend_summary(backend)}" for backend in BACKENDS])
    for backend, (lister, what) in ID_LISTS.items():
        if backend not in BACKENDS:
            continue
        ids = lister()
        if ids is None:  # not installed
            if text is None:
                groups.append([f"{backend}: {backend_summary(backend).rsplit('; ', 1)[-1]}"])
            continue
        shown = [i for i in ids if text is None or text.lower() in i.lower()]
        if shown:
            count = f"{len(shown)} environment{'s' if len(shown) != 1 else ''}"
            groups.append([f"{backend}: {count}" + (f" containing '{text}'" if text is not None else "") + what,
                           *(gymnax_line(i) if backend == "gymnax" else f"{backend}:{i}" for i in shown)])
    if text is not None and not groups:
        raise FragcError(f"no environment id contains '{text}' (fragc envs lists them all)")
    print("\n\n".join("\n".join(group) for group in groups))


def gymnax_line(name: str) -> str:
    try:
        env, params = make(name)
        kind = type(env.action_space(params)).__name__
    except FragcError:
        kind = "(cannot be made here)"
    return f"{name:26} actions: {kind}"


def jaxmarl_ids() -> list[str] | None:
    """JaxMARL's registered ids and `SMAX_<map>` for each of SMAX's maps (fragc's name for the heuristic-enemy
    SMAX on that map); None where jaxmarl is not installed."""
    if importlib.util.find_spec("jaxmarl") is None:
        return None
    from fragc.algos.marl_envs import _import_jaxmarl

    jaxmarl = _import_jaxmarl()  # keeping sys.stdout, which importing jaxmarl resets
    from jaxmarl.environments.smax.smax_env import MAP_NAME_TO_SCENARIO

    return list(jaxmarl.registered_envs) + [f"SMAX_{name}" for name in MAP_NAME_TO_SCENARIO]


def envpool_ids() -> list[str] | None:
    if importlib.util.find_spec("envpool") is None:
        return None
    import envpool

    return list(envpool.list_all_envs())


def pgx_ids() -> list[str] | None:
    """pgx's games for two players with board observations: what alphazero plays."""
    if importlib.util.find_spec("pgx") is None:
        return None
    import pgx

    return [name for name in pgx.available_envs() if (env := pgx.make(name)).num_players == 2
            and len(env.observation_shape) == 3]


def suite_ids(module: str, ids: Callable[[Any], Any]) -> Callable[[], list[str] | None]:
    """A device suite's ids (src/fragc/algos/device_suites.py): `ids(its module)`, None where it is not installed."""
    def listed() -> list[str] | None:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return None
        return sorted(ids(importlib.import_module(module)))

    return listed


def gymnasium_ids() -> list[str]:
    import gymnasium

    return list(gymnasium.envs.registry)


def kept_per_version(package: str, lister: Callable[[], list[str] | None]) -> Callable[[], list[str] | None]:
    """`lister` (a package's ids), its answer kept in the user's cache per installed version of `package`:
    importing jaxmarl and envpool to ask takes 13 s, their ids change only with the package."""
    def ids() -> list[str] | None:
        try:
            key = f"{package} {importlib.metadata.version(package)}"
        except importlib.metadata.PackageNotFoundError:
            return lister()
        path = os.path.join(user_cache_folder(), "env_ids.json")
        kept = read_json(path) or {}
        if isinstance(kept.get(key), list):
            return kept[key]
        found = lister()
        if found is not None:
            write_json(path, {**kept, key: found})
        return found

    return ids


ID_LISTS: dict[str, tuple[Callable[[], list[str] | None], str]] = {
    "gymnax": (env_names, " (a bare id is gymnax's)"),
    "jaxmarl": (kept_per_version("jaxmarl", jaxmarl_ids), ""),
    "envpool": (kept_per_version("envpool", envpool_ids), ""),
    "pgx": (kept_per_version("pgx", pgx_ids), " for two players (alphazero)"),
    "craftax": (suite_ids("craftax", lambda _: CRAFTAX_IDS), ""),
    "jumanji": (kept_per_version("jumanji", suite_ids("jumanji", lambda m: m.registered_environments())),
                " (those with one discrete action run)"),
    "brax": (kept_per_version("brax", suite_ids("brax.envs", lambda m: m._envs)), ""),
    "playground": (kept_per_version("playground", suite_ids("mujoco_playground", lambda m: m.registry.ALL_ENVS)),
                   " (its locomotion robots fetch their assets from the internet when first made)"),
    "gymnasium": (gymnasium_ids, " in Gymnasium's registry (gymnasium_async:ID takes the same ids)"),
}
"""Backend -> (its ids, None where it is not installed; what its group's heading adds)."""
