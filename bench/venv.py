"""Run the suite under the project's virtualenv when started by a Python that lacks its packages.

Debian's ``python3`` on a clone where ``./dev`` made ``.venv`` has no structlog or grpcio; ``python3 -m bench`` and
``python3 bench/run_all.py`` then start the same command again under ``.venv/bin/python``, so they work as the docs
write them. Only the suite's entry points call this: the device check runs on the standard library on purpose.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def run_in_the_venv() -> None:
    if importlib.util.find_spec("structlog") is not None:
        return
    venv = Path(__file__).resolve().parent.parent / ".venv"
    python = venv / "bin" / "python"
    if not python.exists() or Path(sys.prefix).resolve() == venv.resolve():
        raise SystemExit("bench: the project's Python packages are missing; run ./dev lint once (it makes .venv)")
    os.execv(python, [str(python), *sys.orig_argv[1:]])
