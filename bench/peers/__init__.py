"""Peers of the torchtpu benchmarks written in other frameworks (JAX), run by ``bench/tpu.py``.

JAX is optional: these modules import it at the top, so import them only in a worker
process that was started for a JAX measurement.
"""
