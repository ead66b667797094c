"""pgx's two-player board games (`pgx:connect_four`, `pgx:tic_tac_toe`, `pgx:othello`, ...): what AlphaZero plays.

A game is pgx's own environment (`pgx.make`), stepped on the device: its state is the search's embedding, so it is
not a `VecEnv` (a single-agent algorithm given `pgx:ID` is refused in one line). `make_game` refuses, each in one
line before anything compiles, an unknown id (with the closest), a game that is not for two players, and one whose
observation is not a board (H, W, C) the network can take. `pgx` is an extra (`pip install 'fragc[search]'`),
imported when a game is made.
"""

from __future__ import annotations

import difflib
from typing import Any

import jax

from fragc.algos.vec_env import IMPLEMENTATIONS, VecEnv, split_env_name
from fragc.ir.errors import FragcError


def import_pgx() -> Any:
    """pgx, an optional extra: refused in one line where it is not installed."""
    try:
        import mctx  # noqa: F401 - the search that plays them
        import pgx
        import pgx.experimental  # noqa: F401 - auto_reset
    except ImportError as err:
        raise FragcError("pgx: games need pgx and mctx: pip install 'fragc[search]'") from err
    return pgx


def make_game(name: str, algo: str) -> Any:
    """pgx's environment for `pgx:ID`, refused in one line where `algo` cannot play it."""
    backend, game_id = split_env_name(name)
    if backend != "pgx":
        raise FragcError(f"{algo} plays pgx's two-player games; {name} is a single-agent environment "
                         "(--env pgx:connect_four, pgx:tic_tac_toe; fragc envs pgx)")
    with jax.ensure_compile_time_eval():  # pgx's modules make arrays at import: concrete, even inside a trace
        pgx = import_pgx()
    if game_id not in pgx.available_envs():
        close = difflib.get_close_matches(game_id, pgx.available_envs(), n=1)
        raise FragcError(f"pgx: unknown game '{game_id}'" + (f"; did you mean '{close[0]}'?" if close else
                                                              f"; known: {', '.join(pgx.available_envs())}"))
    with jax.ensure_compile_time_eval():  # made on first use, maybe inside a trace: its constants stay concrete
        env = pgx.make(game_id)
    if env.num_players != 2:
        raise FragcError(f"{algo} plays two-player games; pgx:{game_id} has {env.num_players} player(s)")
    if len(env.observation_shape) != 3:
        raise FragcError(f"{algo}'s network takes board observations (height, width, planes); pgx:{game_id}'s are "
                         f"{tuple(env.observation_shape)}")
    return env


class TwoPlayerGame(VecEnv):
    """`VecEnv('pgx:ID')`: refused, a board game is not a single-agent environment."""

    def __init__(self, name: str, **_: Any):
        raise FragcError(f"{name} is a two-player board game (pgx): use alphazero, or a single-agent environment")


IMPLEMENTATIONS["pgx"] = TwoPlayerGame
