"""Benchmarks of relay_flow_projection against the raw drivers (run ``benchmarks/run.py``)."""
