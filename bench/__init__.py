"""Benchmarks (not tests): each module measures one thing and reports Rows; run them all with ``python3 -m bench``."""
