"""How the command line reports: a user's mistake as one line with its exit code, an interruption as one line,
a Python warning as one `fragc: warning:` line."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Iterator

from fragc.ir.errors import FragcError
from fragc.runtime.stopping import exit_code


def usage_error(err: FragcError) -> int:
    """One line, and the error's exit code: 2 for a user's mistake, 3 for a run that diverged."""
    print(f"fragc: error: {err}", file=sys.stderr)
    return error_exit_code(err)


def error_exit_code(err: FragcError) -> int:
    return getattr(err, "exit_code", 2)


def interrupted(stop: KeyboardInterrupt) -> int:
    """Say so in one line; the exit code is 128 + the signal that stopped the command."""
    print("fragc: interrupted", file=sys.stderr)
    return exit_code(stop)


def guarded(command: Any, *args: Any) -> Any:
    """`command(*args)`, with a user's mistake reported as one line and exit code 2."""
    try:
        return command(*args)
    except FragcError as err:
        return usage_error(err)
    except KeyboardInterrupt as stop:
        return interrupted(stop)
    except BrokenPipeError:  # `fragc envs | head`
        sys.stderr.close()
        return 0


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Python warnings (a damaged checkpoint, a shared key) as one `fragc: warning:` line each,
    without the source line Python adds (recorded warnings, as in pytest.warns, stay recorded)."""
    def one_line(message: Any, category: type, filename: str, lineno: int, line: Any = None) -> str:
        return f"fragc: warning: {message}\n"

    previous, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous
