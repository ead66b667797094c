"""Refusals that come before anything starts: a tracking server that does not answer (within --track-timeout, not
after the client's minutes of retries), an env fleet for environments that step on the device; and `fragc envs`,
every backend's ids grouped by backend, with a filter."""

import argparse
import os
import socket
import time

import pytest

from fragc.cli import main
from fragc.ir.errors import FragcError


def run_cli(argv):
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.fixture
def nothing_compiles(monkeypatch):
    """`fragc run` refuses before compiling: compiling (or joining Ray) here fails the test."""
    import fragc.cli.run as run
    from fragc.algos import ray_envs

    def no(*args, **kwargs):
        raise AssertionError("fragc run went on past its refusal")

    monkeypatch.setattr(run, "compile_algo", no)
    monkeypatch.setattr(ray_envs, "connect", no)


@pytest.fixture
def closed_port():
    """A local port nothing listens on (bound, then closed): a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_server():
    """A local port that accepts connections (the kernel's backlog) and never answers: a server that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


SMALL = ["--iterations", "1", "--num-envs", "4", "--num-steps", "8", "--quiet"]


def test_an_unreachable_mlflow_server_is_refused_in_one_line_before_anything_trains(
        capsys, monkeypatch, tmp_path, closed_port, nothing_compiles):
    """MLflow retries an unreachable server for minutes (279 s at port 1) after compiling; the probe refuses it at
    once, naming the URI (without its password), exit code 2, nothing written."""
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:secret@127.0.0.1:{closed_port}")
    start = time.monotonic()
    assert run_cli(["run", "ppo", "--track", "mlflow", *SMALL]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert err == (f"fragc: error: --track mlflow: the tracking server http://127.0.0.1:{closed_port} "
                   "(MLFLOW_TRACKING_URI) cannot be reached within 10 s: Connection refused\n")
    assert os.listdir(tmp_path) == []


def test_a_tracking_server_that_hangs_is_refused_after_track_timeout(capsys, monkeypatch, tmp_path, silent_server,
                                                                     nothing_compiles):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{silent_server}/")
    start = time.monotonic()
    assert run_cli(["run", "ppo", "--track", "mlflow", "--track-timeout", "0.5", *SMALL]) == 2
    assert time.monotonic() - start < 5
    assert capsys.readouterr().err == (f"fragc: error: --track mlflow: the tracking server "
                                       f"http://127.0.0.1:{silent_server}/ (MLFLOW_TRACKING_URI) cannot be reached "
                                       "within 0.5 s: no answer (timed out)\n")
    assert os.listdir(tmp_path) == []


def test_wandb_online_is_probed_and_offline_or_a_file_store_is_not(monkeypatch, closed_port):
    from fragc.sinks import tracking

    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port}")
    with pytest.raises(FragcError, match=rf"^--track wandb: the tracking server http://127.0.0.1:{closed_port} "
                                         r"\(WANDB_BASE_URL\) cannot be reached within 2 s"):
        tracking.sink_names("wandb", timeout=2)

    def probed(uri, timeout):
        raise AssertionError(f"probed {uri}")

    monkeypatch.setattr(tracking, "probe", probed)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for uri in ("file:///tmp/mlruns", "sqlite:///mlflow.db", "/tmp/mlruns"):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert tracking.sink_names("mlflow,wandb")[0] == ["mlflow", "wandb"]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.sink_names("mlflow")[0] == ["mlflow"]


def test_a_reachable_server_passes_the_probe_whatever_it_answers_and_is_not_probed_again_soon(monkeypatch):
    """Any HTTP answer (here a 501) means the server is there: the client decides the rest. A server that answered
    is not probed again for a while: `fragc.train` checks the sinks again with the default timeout after `fragc run`
    probed with its --track-timeout, which may be longer."""
    import http.server
    import threading

    from fragc.sinks import tracking

    pytest.importorskip("mlflow")
    monkeypatch.setattr(tracking, "_answered", {})
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert tracking.probe(uri, 5) is None
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        tracking.check_reachable(["mlflow"], 5)
    finally:
        server.shutdown()
        server.server_close()
    assert tracking.probe(uri, 5) == "Connection refused"  # gone now, but answered just before:
    tracking.check_reachable(["mlflow"], 0.1)
    monkeypatch.setattr(tracking, "_answered", {})
    with pytest.raises(FragcError, match="Connection refused"):
        tracking.check_reachable(["mlflow"], 0.1)


def test_track_timeout_must_be_a_positive_number(capsys):
    assert run_cli(["run", "ppo", "--track", "tensorboard", "--track-timeout", "0"]) == 2
    assert "argument --track-timeout: expected a positive number of seconds, got '0'" in capsys.readouterr().err


@pytest.mark.parametrize("algo,env,shown", [
    ("ppo", [], "'CartPole-v1' (gymnax)"),
    ("ppo", ["--env", "gymnax:Acrobot-v1"], "'gymnax:Acrobot-v1' (gymnax)"),
    ("ippo", [], "'jaxmarl:MPE_simple_spread_v3' (jaxmarl)"),
])
def test_an_env_fleet_for_device_environments_is_refused_before_ray_or_compiling(
        capsys, monkeypatch, tmp_path, nothing_compiles, algo, env, shown):
    """A fleet steps host environments: for a gymnax or jaxmarl one it would be ignored (and num_envs changed to
    N*E): refused in one line, Ray not started, num_envs not touched, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert run_cli(["run", algo, "--env-fleet", "ray:2x4", *env, "--iterations", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"fragc: error: --env-fleet ray:2x4: environment {shown} steps on the device, in the compiled "
                   "program; env fleets step host environments (gymnasium:ID, envpool:ID), e.g. --env "
                   "gymnasium:CartPole-v1\n")
    assert os.listdir(tmp_path) == []
    assert run_cli(["ir", algo, "--env-fleet", "ray:2", *env]) == 2
    assert capsys.readouterr().err.startswith("fragc: error: --env-fleet ray:2: environment ")


def test_an_env_fleet_for_host_environments_still_sizes_num_envs(capsys):
    from fragc.cli.algorithm import fit_fleet_envs

    args = argparse.Namespace(algo="ppo", env_fleet="ray:2x4", cfg_env="gymnasium:CartPole-v1", cfg_num_envs=None)
    fit_fleet_envs(args)
    assert args.cfg_num_envs == 8
    assert "num_envs = 8" in capsys.readouterr().err


@pytest.fixture
def backends(monkeypatch):
    """The ids of jaxmarl, envpool, pgx and the device suites as stand-ins (importing them takes 13 s, making pgx's
    games 5 s, importing Playground 10 s); envpool as not installed on request."""
    from fragc.cli import lists

    def with_envpool(installed):
        monkeypatch.setitem(lists.ID_LISTS, "jaxmarl", (lambda: ["MPE_simple_spread_v3", "SMAX_3m"], ""))
        monkeypatch.setitem(lists.ID_LISTS, "pgx", (lambda: ["connect_four", "tic_tac_toe"], " for two players"))
        for suite, ids in {"craftax": ["Craftax-Symbolic-v1"], "jumanji": ["Snake-v1"], "brax": ["ant"],
                           "playground": ["CartpoleBalance"]}.items():
            monkeypatch.setitem(lists.ID_LISTS, suite, (lambda ids=ids: ids, ""))
        monkeypatch.setitem(lists.ID_LISTS, "envpool", ((lambda: ["Pong-v5", "CartPole-v1"]) if installed
                                                        else (lambda: None), ""))
        if not installed:
            monkeypatch.setattr(lists, "backend_summary",
                                lambda b: "x; not installed: pip install 'fragc[host]'" if b == "envpool" else "x")
    return with_envpool


def test_fragc_envs_lists_every_backends_ids_grouped_by_backend(capsys, backends):
    backends(installed=True)
    assert run_cli(["envs"]) == 0
    out = capsys.readouterr().out
    groups = {block.splitlines()[0].split(":")[0]: block.splitlines()[1:] for block in out.split("\n\n")[1:]}
    assert list(groups) == ["gymnax", "jaxmarl", "envpool", "pgx", "craftax", "jumanji", "brax", "playground",
                            "gymnasium"]
    assert groups["pgx"] == ["pgx:connect_four", "pgx:tic_tac_toe"]
    assert groups["playground"] == ["playground:CartpoleBalance"] and groups["brax"] == ["brax:ant"]
    assert groups["gymnax"][0].split() == ["CartPole-v1", "actions:", "Discrete"]
    assert groups["jaxmarl"] == ["jaxmarl:MPE_simple_spread_v3", "jaxmarl:SMAX_3m"]
    assert groups["envpool"] == ["envpool:Pong-v5", "envpool:CartPole-v1"]
    assert "gymnasium:CartPole-v1" in groups["gymnasium"] and "gymnasium:LunarLander-v3" in groups["gymnasium"]
    backends(installed=False)
    assert run_cli(["envs"]) == 0
    assert "\n\nenvpool: not installed: pip install 'fragc[host]'\n\n" in capsys.readouterr().out


def test_fragc_envs_filters_ids_case_insensitively(capsys, backends):
    backends(installed=True)
    assert run_cli(["envs", "cartpole-v1"]) == 0
    out = capsys.readouterr().out
    blocks = [block.splitlines() for block in out.rstrip("\n").split("\n\n")]
    assert blocks[:2] == [["gymnax: 1 environment containing 'cartpole-v1' (a bare id is gymnax's)",
                           "CartPole-v1                actions: Discrete"],
                          ["envpool: 1 environment containing 'cartpole-v1'", "envpool:CartPole-v1"]]
    gymnasium = blocks[2]  # its registry is Gymnasium's, with what was registered in this process
    assert gymnasium[0].startswith(f"gymnasium: {len(gymnasium) - 1} environments containing 'cartpole-v1' in")
    assert "gymnasium:CartPole-v1" in gymnasium and all("cartpole-v1" in line.lower() for line in gymnasium)
    assert len(blocks) == 3
    assert run_cli(["envs", "SMAX"]) == 0
    assert capsys.readouterr().out == "jaxmarl: 1 environment containing 'SMAX'\njaxmarl:SMAX_3m\n"
    assert run_cli(["envs", "NoSuchThing"]) == 2
    assert capsys.readouterr().err == ("fragc: error: no environment id contains 'NoSuchThing' (fragc envs lists "
                                       "them all)\n")
