"""Thin Prefect tasks, one file per step: retries, cache keys, logging; the work is in rl_core/kernels."""
