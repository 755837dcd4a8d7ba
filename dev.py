#!/usr/bin/env python3
"""The two quickstart commands, needing nothing but Python 3.11+.

python3 dev.py demo   # install into .venv and walk through the product
python3 dev.py test   # install into .venv, then ruff, mypy --strict and the test suite
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"


def _run(*args: str | Path) -> None:
    result = subprocess.run([str(a) for a in args], cwd=ROOT, check=False)
    if result.returncode != 0:
        sys.exit(result.returncode)


def _install() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"deleatur needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    if not (BIN / "python").exists():
        print("creating .venv", flush=True)
        venv.create(VENV, with_pip=True)
    stamp = VENV / ".installed"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        print("installing deleatur and its development tools into .venv", flush=True)
        _run(BIN / "python", "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        _run(BIN / "python", "-m", "pip", "install", "--quiet", "-e", ".[dev]")
        stamp.touch()


def _interop_python() -> None:
    """The interop tests check our formats with aics-tlog, which needs Python >= 3.12:
    give it an environment of its own when such a Python is on this machine."""
    if (ROOT / ".venv-interop" / "bin" / "python").exists():
        return
    home = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    # pyenv's shims answer to names they cannot run: try each candidate for real.
    candidates = [str(p) for p in sorted(home.glob("versions/3.1[2-9]*/bin/python3"))] + ["python3.12", "python3.13"]
    for candidate in candidates:
        probe = [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            print("creating .venv-interop for the aics-tlog interop tests", flush=True)
            _run(candidate, "-m", "venv", ROOT / ".venv-interop")
            _run(ROOT / ".venv-interop" / "bin" / "python", "-m", "pip", "install", "--quiet", "aics-tlog")
            return


def demo() -> None:
    _install()
    _run(BIN / "python", ROOT / "examples" / "walkthrough.py")


def test() -> None:
    _install()
    _interop_python()
    _run(BIN / "ruff", "check", "src", "tests", "bench", "examples", "dev.py")
    _run(BIN / "ruff", "format", "--check", "src", "tests", "bench", "examples", "dev.py")
    _run(BIN / "mypy")
    _run(BIN / "pytest", *sys.argv[2:])


if __name__ == "__main__":
    commands = {"demo": demo, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit("usage: python3 dev.py demo | test [pytest arguments]")
    commands[sys.argv[1]]()
