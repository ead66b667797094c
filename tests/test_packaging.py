"""The installed package as a user's script sees it: a script saved beside a clone of the repository named `fragc`
imports the installed fragc, not the clone's folder (the src layout: the clone's root is no package)."""

import pathlib
import subprocess
import sys


def test_a_script_beside_a_clone_named_fragc_imports_the_package(tmp_path: pathlib.Path):
    clone = tmp_path / "fragc"
    (clone / "src" / "fragc").mkdir(parents=True)  # what a clone's root holds: no __init__.py of its own
    (clone / "pyproject.toml").write_text("[project]\nname = 'fragc'\n")
    script = tmp_path / "quickstart.py"
    script.write_text("import fragc\nprint(fragc.fragment.__module__, fragc.__version__)\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["fragc.ir.frontend", __import__("fragc").__version__]
