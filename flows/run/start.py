"""The first step of both flows: the store's credentials (when a block names them), then the run's run.json."""
from __future__ import annotations

from prefect import get_run_logger
from prefect.runtime import flow_run

from flows.run.store_credentials import export_store_credentials
from rl_core.algos.base import algorithm_of
from rl_core.algos.preflight import preflight
from rl_core.config.agent import AnyRunConfig
from rl_core.config.common import require_shared_store
from rl_core.data.run_info import RunInfo, open_run
from rl_core.data.run_lease import RunLease


def start_run(cfg: AnyRunConfig, credentials_block: str | None) -> tuple[RunInfo, RunLease]:
    """Check what the config needs of the world (`preflight`), export the block's credentials (before anything
    touches the store or starts Ray, whose workers inherit them), create or check the run's run.json, and take the
    run's lease (one flow run trains a run at a time: RunBusy names the holder); logs whether the run is new or
    continued. The flow releases the lease when it ends."""
    logger = get_run_logger()
    preflight(cfg)  # once per process: free after the command line's
    require_shared_store(cfg.storage.url)
    if credentials_block:
        names = export_store_credentials(credentials_block)
        logger.info("store credentials from block %s: set %s", credentials_block, ", ".join(names))
    rests_on = algorithm_of(cfg).rests_on
    run = open_run(cfg, rests_on(cfg) if rests_on is not None else None)
    lease = RunLease(cfg.run_url, cfg.run_name, flow_run.id)
    lease.acquire()
    logger.info("run %s (%s) at %s", cfg.run_name, "new" if run.is_new else "continued", cfg.run_url)
    return run, lease
