"""XLA's CPU threads (src/fragc/runtime/cpu_threads.py): who decides them, that XLA's pool really takes the decided
size, and the measuring protocol's choice against children whose speed is known."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

from fragc.runtime import cpu_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLEAN = {"PJRT_NPROC", "NPROC", "FRAGC_CPU_THREADS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"}


@pytest.fixture
def environ(monkeypatch):
    """The environment without any variable that decides the threads, no accelerator plugin, a backend not started
    and JAX's own device count unset: what a user's fresh process on one CPU device sees."""
    for variable in CLEAN:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(cpu_threads, "accelerator_installed", lambda: False)
    monkeypatch.setattr(cpu_threads, "backend_started", lambda: False)
    monkeypatch.setattr(cpu_threads, "_chose_one_thread", False)  # what a test's configure() sets is undone after it
    one_device = types.SimpleNamespace(config=types.SimpleNamespace(jax_num_cpu_devices=-1))
    monkeypatch.setitem(sys.modules, "jax", one_device)  # restored after the test; several_cpu_devices reads it
    return monkeypatch


def test_who_decides(environ):
    assert cpu_threads.decided_by_environment() is None
    environ.setenv("JAX_NUM_CPU_DEVICES", "8")
    assert cpu_threads.decided_by_environment() == "several CPU devices"
    environ.delenv("JAX_NUM_CPU_DEVICES")
    environ.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    assert cpu_threads.decided_by_environment() == "several CPU devices"
    environ.setenv("FRAGC_CPU_THREADS", "xla")
    assert cpu_threads.decided_by_environment() == "FRAGC_CPU_THREADS=xla"
    environ.setenv("NPROC", "3")
    assert cpu_threads.decided_by_environment() == "the user's NPROC"
    assert cpu_threads.threads() == 3


@pytest.mark.parametrize("value", ["0", "two", "-1", ""])
def test_a_bad_value_is_one_line(environ, value, capsys):
    """At `import fragc` a bad value cannot exit as the CLI does: one line on stderr, and XLA's default threads."""
    environ.setenv("FRAGC_CPU_THREADS", value)
    cpu_threads.configure()
    assert "PJRT_NPROC" not in os.environ
    [line] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"fragc: FRAGC_CPU_THREADS=.*: expected auto, xla or a number of threads; XLA's default "
                        r"threads", line), line


def test_configure_sets_the_pool(environ, tmp_path):
    environ.setenv("FRAGC_CPU_THREADS", "3")
    cpu_threads.configure()
    assert os.environ["PJRT_NPROC"] == "3"
    environ.delenv("PJRT_NPROC")
    environ.delenv("FRAGC_CPU_THREADS")
    environ.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_threads.configure()  # nothing kept: XLA's default
    assert "PJRT_NPROC" not in os.environ
    keep(tmp_path, threads=0)
    cpu_threads.configure()
    assert "PJRT_NPROC" not in os.environ
    keep(tmp_path, threads=1)
    environ.setattr(cpu_threads, "backend_started", lambda: True)
    cpu_threads.configure()  # too late for this process
    assert "PJRT_NPROC" not in os.environ
    environ.setattr(cpu_threads, "backend_started", lambda: False)
    cpu_threads.configure()
    assert os.environ["PJRT_NPROC"] == "1"


def keep(cache_home, threads: int) -> None:
    path = os.path.join(cache_home, "fragc", "cpu_threads.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({cpu_threads.key(): {"threads": threads}}, f)


def xla_pool_threads() -> int:
    """The threads of this process's XLA CPU pool (XLA names them XLAEigen)."""
    return sum("XLAEigen" in open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names from /proc (Linux)")
def test_the_kept_choice_reaches_xla(tmp_path):
    """A kept choice of one thread, and no variable: in a fresh process of one CPU device, `import fragc` makes
    XLA's pool one thread (XLA's own default: one per usable core)."""
    keep(tmp_path, threads=1)
    code = textwrap.dedent("""
        import fragc, jax, jax.numpy as jnp
        jax.block_until_ready(jax.jit(lambda x: x @ x)(jnp.ones((64, 64))))
        import sys
        sys.path.insert(0, "tests")  # by file: pgx installs a package named `tests` of its own
        from test_cpu_threads import xla_pool_threads
        print(xla_pool_threads())
    """)
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "JAX_PLATFORMS": "cpu", "XDG_CACHE_HOME": str(tmp_path)},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert int(out.stdout.strip().splitlines()[-1]) == 1


CHILD = textwrap.dedent("""
    import os, sys, time
    from fragc.runtime import cpu_threads
    print("a library's warning on stdout")
    one = os.environ.get("PJRT_NPROC") == "1"
    seconds = {"one": float(sys.argv[1]), "xla": float(sys.argv[2])}["one" if one else "xla"]
    def spin():
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    cpu_threads.serve(spin)
""")


@pytest.mark.parametrize("one, xla, chosen", [(0.01, 0.03, 1), (0.03, 0.01, 0), (0.02, 0.02, 0)])
def test_measure_chooses_the_faster(one, xla, chosen):
    """Children that spin a known time on each side: one thread is chosen only where it is faster by the margin."""
    got = cpu_threads.measure([sys.executable, "-c", CHILD, str(one), str(xla)], rounds=3)
    assert got["threads"] == chosen
    assert got["one_cpu_s"] == pytest.approx(one, abs=0.01) and got["xla_cpu_s"] == pytest.approx(xla, abs=0.01)


def test_a_child_that_dies_is_one_line():
    with pytest.raises(RuntimeError, match=r"measuring child ended \(exit 3\) without answering"):
        cpu_threads.measure([sys.executable, "-c", "import sys; sys.exit(3)"], rounds=1)


def test_several_devices_take_fragcs_one_thread_back(environ):
    """fragc simulating several CPU devices before JAX starts (`--devices N`) drops its own choice of one thread;
    a user's PJRT_NPROC stays."""
    environ.setenv("PJRT_NPROC", "1")
    cpu_threads.several_devices_asked()
    assert os.environ["PJRT_NPROC"] == "1"  # the user's
    cpu_threads._one_thread()
    cpu_threads.several_devices_asked()
    assert "PJRT_NPROC" not in os.environ and not cpu_threads._chose_one_thread


def test_devices_started_on_fragcs_one_thread_are_said_once(environ):
    environ.setattr(cpu_threads, "_chose_one_thread", True)
    cpu_threads.warn_if_devices_share_one_thread(1)
    with pytest.warns(UserWarning, match=r"JAX then started 8 CPU devices, which take turns on it: set "
                                         r"jax_num_cpu_devices before importing fragc, or FRAGC_CPU_THREADS=xla"):
        cpu_threads.warn_if_devices_share_one_thread(8)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        cpu_threads.warn_if_devices_share_one_thread(8)
    assert not again  # said once


def test_a_choice_kept_meanwhile_is_applied_without_measuring(environ, tmp_path):
    """Another process measured while this one started (it waited on the lock): its choice applies here."""
    environ.setenv("XDG_CACHE_HOME", str(tmp_path))
    keep(tmp_path, threads=1)
    cpu_threads.measure_if_undecided([sys.executable, "-c", "raise SystemExit('measured again')"])
    assert os.environ["PJRT_NPROC"] == "1"


def test_an_unwritable_cache_measures_nothing_and_says_so(environ, tmp_path, capsys):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    environ.setenv("XDG_CACHE_HOME", str(blocker))
    cpu_threads.measure_if_undecided([sys.executable, "-c", "raise SystemExit('measured')"])
    assert "PJRT_NPROC" not in os.environ
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("fragc: cannot keep XLA's CPU threads' choice in ") and "FRAGC_CPU_THREADS=N" in line


def test_a_missing_choice_is_measured_once_and_kept(environ, tmp_path, capsys):
    environ.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_threads.measure_if_undecided([sys.executable, "-c", CHILD, "0.01", "0.03"])
    assert os.environ["PJRT_NPROC"] == "1"
    kept = json.loads((tmp_path / "fragc" / "cpu_threads.json").read_text())
    assert kept[cpu_threads.key()]["threads"] == 1
    assert "timing XLA's CPU threads on this processor" in capsys.readouterr().err
