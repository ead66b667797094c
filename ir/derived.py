"""What fragc derives from one algorithm object, kept for the next compile of the same object.

Compiling one algorithm under several policies (`fragc bench`, the auto search's candidates, a test of every
policy) traced its iteration and compiled its init once per program: tracing and lowering are Python work, as
long as XLA's compile of the program itself on small models. `derived(algo)` is a dict of such results for the
last few algorithm objects. It is dropped when an attribute the object had is reassigned
(`algo.config = ...`): that object is then another algorithm. What it does not see is a change made inside an
attribute's own object (a list appended to); an algorithm that changes that way between compiles should be a new
object.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

KEPT = 8
"""Algorithm objects whose results are kept (the least recently compiled goes first)."""

_CACHE: collections.OrderedDict[int, tuple[Any, dict[str, int], dict[str, Any]]] = collections.OrderedDict()
_LOCK = threading.Lock()


def derived(algo: Any) -> dict[str, Any]:
    """The results kept for `algo` (empty the first time, or after one of its attributes was reassigned)."""
    now = _attributes(algo)
    with _LOCK:
        entry = _CACHE.get(id(algo))
        if entry is not None and entry[0] is algo and all(now.get(k) == v for k, v in entry[1].items()):
            _CACHE.move_to_end(id(algo))
            return entry[2]
        results: dict[str, Any] = {}
        _CACHE[id(algo)] = (algo, now, results)  # the object itself: its id is not reused while it is kept
        _CACHE.move_to_end(id(algo))
        while len(_CACHE) > KEPT:
            _CACHE.popitem(last=False)
        return results


def _attributes(algo: Any) -> dict[str, int]:
    """Each instance attribute's value, by identity. Attributes added later (a `cached_property` filled while
    tracing) do not count as a change."""
    return {name: id(value) for name, value in getattr(algo, "__dict__", {}).items()}
