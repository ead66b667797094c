"""The tutorials run as written: every command and code block of docs/first_run.md and docs/writing_an_algorithm.md,
in a fresh folder, in order: the commands in this process (`fragc.cli.main`), the python blocks as one script in a
process of their own. first_run's test is -m slow; .ci/run runs it after the default suite. docs/porting.md walks
through tests/purejaxrl_ppo.py (the port, tested in test_bench.py): its code blocks are excerpts of that file (or of the file a first line `# from FILE` names), checked
line by line in order; a block that imports the port runs, with the page's commands, in -m slow.

A block fenced ```bash is one command a line (`fragc ...` runs as `python -m fragc.cli ...`; a `--json` run must
print its summary). A ```python block whose first line is `# NAME.py` is saved as that file; the page's other
python blocks run, in order, as one script. The install command is the README's set-up command, which CI runs
itself (.ci/run): it is checked to be that command, not run again."""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e ."


def blocks(page: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block of a docs page, in order."""
    return FENCE.findall((DOCS / page).read_text())


def run_command(line: str, cwd: pathlib.Path, capsys=None, monkeypatch=None) -> None:
    """A tutorial's `fragc ...` line: in this process (`fragc.cli.main`, in `cwd`) where `capsys` is given, else as
    `python -m fragc.cli` in a process of its own (what `fragc launch` needs)."""
    argv = shlex.split(line)
    assert argv[0] == "fragc", f"a tutorial command that is not fragc's: {line}"
    if capsys is not None:
        from fragc.cli import main

        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main(argv[1:])
        out, err = capsys.readouterr()
    else:
        env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run([sys.executable, "-m", "fragc.cli", *argv[1:]], cwd=cwd, capture_output=True,
                              text=True, timeout=600, env=env)  # PATH: `fragc launch -- fragc run ...` starts ours
        code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 0, f"{line}\n{err[-3000:]}"
    if "--json" in argv:
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["iterations"] > 0 and summary["params_fingerprint"], summary


def run_page(page: str, folder: pathlib.Path, capsys, monkeypatch) -> None:
    script = []
    for language, body in blocks(page):
        if language == "bash":
            for line in (l.strip() for l in body.splitlines()):
                if line.startswith("python3 -m venv"):
                    assert line == INSTALL, line
                    assert INSTALL in (ROOT / "README.md").read_text()
                elif line and not line.startswith("#"):
                    run_command(line, folder, capsys, monkeypatch)
        elif language == "python":
            first = body.splitlines()[0]
            if named := re.fullmatch(r"# from (\S+)", first):  # an excerpt of fragc's own source
                assert_excerpt(page, named.group(1), body)
            elif re.fullmatch(r"# \w+\.py", first):
                (folder / first[2:]).write_text(body)
            else:
                script.append(body)
        else:
            raise AssertionError(f"{page}: a block of language {language!r} runs in no test")
    if script:
        (folder / "tutorial.py").write_text("\n".join(script))
        out = subprocess.run([sys.executable, "tutorial.py"], cwd=folder, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow  # 20-30 s of training runs: .ci/run runs it after the default suite, so the page cannot rot
def test_the_first_run(tmp_path: pathlib.Path, capsys, monkeypatch):
    run_page("first_run.md", tmp_path, capsys, monkeypatch)


@pytest.mark.slow  # 20 s of training runs: .ci/run runs it after the default suite, so the page cannot rot
def test_writing_an_algorithm(tmp_path: pathlib.Path, capsys, monkeypatch):
    run_page("writing_an_algorithm.md", tmp_path, capsys, monkeypatch)
    assert (tmp_path / "reinforce.py").exists()


def test_writing_an_algorithms_excerpts_are_the_source():
    """The page's excerpts of A2C are src/fragc/algos/a2c.py's lines (in the default suite; running the page is slow)."""
    excerpts = [body for _, body in blocks("writing_an_algorithm.md") if body.startswith("# from src/fragc/algos/a2c.py")]
    assert len(excerpts) >= 4
    for body in excerpts:
        assert_excerpt("writing_an_algorithm.md", "src/fragc/algos/a2c.py", body)


def excerpt_lines(body: str) -> list[str]:
    return [l.strip() for l in body.splitlines()
            if l.strip() and l.strip() != "..." and not re.fullmatch(r"# from \S+", l.strip())]


def porting_blocks() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """docs/porting.md's (source file, excerpt) blocks, its runnable python blocks and its commands."""
    excerpts, runnable, commands = [], [], []
    for language, body in blocks("porting.md"):
        first = body.splitlines()[0]
        if language == "python" and "from purejaxrl_ppo import" in body:
            runnable.append(body)
        elif language == "python":
            named = re.fullmatch(r"# from (\S+)", first)
            excerpts.append((named.group(1) if named else "tests/purejaxrl_ppo.py", body))
        elif first.startswith("fragc "):
            commands += body.splitlines()
    return excerpts, runnable, commands


def assert_excerpt(page: str, source: str, body: str) -> None:
    """Each line of an excerpt appears in its source file, in order."""
    lines = [l.strip() for l in (ROOT / source).read_text().splitlines()]
    at = 0
    for line in excerpt_lines(body):
        assert line in lines[at:], f"docs/{page} has a line {source} does not (after its line {at}): {line}"
        at = lines.index(line, at) + 1


def test_portings_code_is_the_port():
    excerpts, runnable, commands = porting_blocks()
    assert len(excerpts) >= 6 and runnable and commands
    for source, body in excerpts:
        assert_excerpt("porting.md", source, body)


@pytest.mark.slow
def test_portings_commands_and_example(tmp_path: pathlib.Path):
    _, runnable, commands = porting_blocks()
    for line in commands:
        line = line.replace("tests/purejaxrl_ppo.py", str(ROOT / "tests" / "purejaxrl_ppo.py"))
        run_command(line.replace("--total-steps 500000", "--total-steps 20000"), tmp_path)
    for body in runnable:
        (tmp_path / "example.py").write_text(body)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
        out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
