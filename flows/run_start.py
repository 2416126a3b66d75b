"""The first step of both flows: the store's credentials (when a block names them), then the run's run.json."""
from __future__ import annotations

from prefect import get_run_logger

from flows.store_credentials import export_store_credentials
from rl_core.agent_config import AnyRunConfig
from rl_core.config import require_shared_store
from rl_core.data.run_info import RunInfo, open_run


def start_run(cfg: AnyRunConfig, credentials_block: str | None) -> RunInfo:
    """Export the block's credentials (before anything touches the store or starts Ray, whose workers inherit them),
    then create or check the run's run.json; logs whether the run is new or continued."""
    logger = get_run_logger()
    require_shared_store(cfg.storage.url)
    if credentials_block:
        names = export_store_credentials(credentials_block)
        logger.info("store credentials from block %s: set %s", credentials_block, ", ".join(names))
    run = open_run(cfg)
    logger.info("run %s (%s) at %s", cfg.run_name, "new" if run.is_new else "continued", cfg.run_url)
    return run
