"""Thin Prefect tasks, one file per step: retries, cache keys, logging; the work is in rl_core/ and the kernels
package (kernels/gymflow_kernels)."""
