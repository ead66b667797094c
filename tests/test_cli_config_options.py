"""A config field named like a command's own option (`iterations` beside `fragc bench --iterations`).

`fragc run` reads the run length from the config's `iterations`, so a user's config often has that
field; `fragc bench` has its own `--iterations`. Parsed in-process: no JAX start-up, no subprocess.
"""

import pytest

from fragc.cli.algorithm import make_algo
from fragc.cli.commands import parse

ALGO = '''
import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    iterations: int = 10
    """Training iterations (fragc run's run length)."""
    seed_offset: int = 0
    """Not an option of any command."""


class Colliding:
    Config = Config

    def __init__(self, config: Config = Config()):
        self.config = config

    def init(self, key):
        raise NotImplementedError  # only parsed here

    def iteration(self, state):
        raise NotImplementedError
'''


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("algo") / "colliding.py"
    path.write_text(ALGO)
    return f"{path}:Colliding"


def test_a_field_named_like_a_command_option_is_offered_with_a_prefix(spec):
    args = parse(["bench", spec, "--iterations", "3", "--config-iterations", "7", "--seed-offset", "2"], spec)
    assert (args.iterations, args.cfg_iterations, args.cfg_seed_offset) == (3, 7, 2)
    assert make_algo(args).config.iterations == 7
    args = parse(["run", spec, "--iterations", "4"], spec)  # `run` has no --iterations: the field keeps its name
    assert make_algo(args).config.iterations == 4


def test_the_help_says_why_a_field_has_a_prefix(spec, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse(["bench", spec, "--help"], spec)
    assert stopped.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--config-iterations ITERATIONS Training iterations (fragc run's run length). (config field " \
           "iterations: --iterations is fragc bench's own option)" in out
