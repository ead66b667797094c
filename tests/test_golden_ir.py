"""Printed IR against golden text. To update after a deliberate change:
FRAGC_UPDATE_GOLDEN=1 pytest tests/test_golden_ir.py, then review the diff."""

import os
import pathlib

import pytest

import fragc
from fragc.algos import ppo
from fragc.ir import to_dot
from toy_algos import Regression

GOLDEN = pathlib.Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FRAGC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with FRAGC_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("after", ["trace", "canonicalize", "place", "pipeline", "insert_transfers", "fuse", "loop"])
def test_regression_ir_after_each_pass(after):
    prog = fragc.compile(Regression(), "single")
    check_golden(f"regression_{after}.fir", prog.ir(after=after))


def test_ppo_traced_ir():
    check_golden("ppo_trace.fir", str(fragc.trace(ppo.PPO())))


def test_regression_dot():
    check_golden("regression.dot", to_dot(fragc.trace(Regression())))


def test_bodies_are_printed_on_request():
    from fragc.ir import format_module

    text = format_module(fragc.trace(Regression()), bodies=True)
    assert "psum[" in text  # the pmean inside @learn, traced with one replica (ir/collectives.py)
    assert "random_split" in text
