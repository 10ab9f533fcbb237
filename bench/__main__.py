"""``python3 -m bench``: run the benchmark suite (see bench/run_all.py)."""

from bench.venv import run_in_the_venv

run_in_the_venv()  # before the imports that need the project's packages

from bench.run_all import main  # noqa: E402

raise SystemExit(main())
