"""The options of an algorithm's config: a field named like a command's own option (`iterations` beside
`fragc bench --iterations`), bool fields as flags (`--anneal-lr`, `--no-anneal-lr`), and each option's type and
default in `--help`.

`fragc run` reads the run length from the config's `iterations`, so a user's config often has that
field; `fragc bench` has its own `--iterations`. Parsed in-process: no JAX start-up, no subprocess.
"""

import dataclasses

import pytest

from fragc.algos import ppo

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
    cache: bool = True
    """A bool field whose --no- form is fragc run's own option (--no-cache)."""


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
    assert "--config-iterations INT Training iterations (fragc run's run length). (config field " \
           "iterations: --iterations is fragc bench's own option) (default 10)" in out


@pytest.mark.parametrize("command", ["run", "ir", "bench", "sweep"])
def test_a_bool_field_is_a_flag_its_no_form_or_a_value(command):
    """`--anneal-lr` alone is true, `--no-anneal-lr` false, `--anneal-lr false` the value given; under `fragc
    sweep` each is a list of one value, and `true,false` sweeps both."""
    def anneal_lr(*options):
        return parse([command, "ppo", *options, "--lr", "1e-3"], "ppo").cfg_anneal_lr

    one = (lambda value: [value]) if command == "sweep" else (lambda value: value)
    assert anneal_lr() is None  # not given: the config's default
    assert anneal_lr("--anneal-lr") == one(True)
    assert anneal_lr("--no-anneal-lr") == one(False)
    assert anneal_lr("--anneal-lr", "false") == one(False)
    assert anneal_lr("--anneal-lr", "yes") == one(True)
    if command == "sweep":
        assert anneal_lr("--anneal-lr", "true,false") == [True, False]


def test_a_bool_fields_no_form_gives_way_to_a_command_option(spec):
    """`cache: bool` beside `fragc run --no-cache`: `--cache` is the field, `--no-cache` stays run's own."""
    args = parse(["run", spec, "--no-cache", "--cache", "false"], spec)
    assert (args.no_cache, args.cfg_cache) == (True, False)


def help_lines(capsys, monkeypatch, argv):
    """`--help`'s options, one line each (wide enough that argparse wraps no help text; a long option's text,
    which argparse starts on the next line, joined to it)."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as stopped:
        parse(argv, argv[1])
    assert stopped.value.code == 0
    lines = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  -"):
            lines.append(line.strip())
        elif line.startswith("    ") and lines:
            lines[-1] += " " + line.strip()
    return [" ".join(line.split()) for line in lines]


def test_the_help_shows_each_config_options_type_and_default(capsys, monkeypatch):
    """Every field of PPO's config: `--name TYPE` (a bool's `--no-` form beside it), and its dataclass default
    as the command line spells it (with its default on an EnvPool Atari game where that differs)."""
    from fragc.algos import ATARI_DEFAULTS

    lines = help_lines(capsys, monkeypatch, ["run", "ppo", "--help"])
    spelled = {True: "true", False: "false"}
    for field in dataclasses.fields(ppo.Config):
        flag = "--" + field.name.replace("_", "-")
        kind = {"bool": f"[BOOL], --no-{flag[2:]}", "int": "INT", "float": "FLOAT", "str": "STR"}[str(field.type)]
        line = next(line for line in lines if line.startswith(f"{flag} {kind} "))
        default = spelled.get(field.default, field.default) if isinstance(field.default, bool) else field.default
        atari = ATARI_DEFAULTS["ppo"].get(field.name)
        shown = f"(default {default})" if atari is None else f"(default {default}; on an envpool: Atari game {atari})"
        assert line.endswith(shown), line


def test_the_help_shows_a_command_options_type_and_default(capsys, monkeypatch):
    """A command's own option: its type where it has no metavar, its default where its help does not say it;
    no default shown for a flag or an option whose default is None."""
    lines = help_lines(capsys, monkeypatch, ["sweep", "ppo", "--help"])
    assert "--iterations-per-dispatch INT iterations scanned per dispatch (default 16)" in lines
    assert "--devices INT devices to spread the members over (default 1; simulated on CPU if needed)" in lines
    assert not [line for line in lines if "(default None)" in line or "(default False)" in line]
