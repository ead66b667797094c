"""Every built-in algorithm's parameters fingerprint after `fragc run ALGO --seed 0 --iterations 6 --json`, in one
fresh process (one CPU device, as the command runs): `python tests/fingerprints.py [ALGO ...]` prints them as JSON.
tests/test_fingerprints.py pins them, so that a refactor of the algorithms changes no bit."""

import contextlib
import io
import json
import sys

from fragc.algos import ALGOS
from fragc.cli import main


def fingerprint(algo: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["run", algo, "--seed", "0", "--iterations", "6", "--json"])
    return json.loads(out.getvalue())["params_fingerprint"] if rc == 0 else f"exit code {rc}"


if __name__ == "__main__":
    print(json.dumps({algo: fingerprint(algo) for algo in sys.argv[1:] or ALGOS}))
