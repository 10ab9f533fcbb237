"""``python3 -m bench``: run the benchmark suite (see bench/run_all.py)."""

from bench.run_all import main

raise SystemExit(main())
