"""Package names that load on first use (PEP 562): `fragc` and `fragc.ir` list their public names without
importing the modules behind them, so that `fragc launch` and `fragc --help` start without JAX."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, tuple[str, ...]],
               submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """(`__getattr__`, `__dir__`, `__all__`) for `package`: each name in `homes[module]` is read from `module`
    (relative to `package` when it starts with a dot) the first time it is asked for, then kept in the package's
    namespace; each of `submodules` is the package's submodule of that name."""
    home = {name: module for module, names in homes.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[name], package), name)
        namespace[name] = value  # later uses are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home, *submodules})

    return __getattr__, __dir__, sorted([*home, *submodules])
