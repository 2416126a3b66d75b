"""S3 credentials for a run's store from a Prefect block, for deployments that keep secrets in Prefect.

The block's values are exported as the standard AWS_* variables of this process, which s3fs reads and which the
Ray workers this process starts inherit. They never enter the run's config (run.json, task parameters, cache
keys) and are never logged: only the names of the variables set are.

Blocks accepted, by slug (`<block type>/<name>`):
- `aws-credentials/<name>`: prefect-aws's AwsCredentials (when prefect-aws is installed);
- `secret/<name>`: a Secret block holding a JSON object with `key`, `secret` and optionally `token`,
  `endpoint_url` (an S3-compatible endpoint) and `region`.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from prefect.blocks.core import Block

from rl_core.config.common import ConfigError

CREDENTIALS_BLOCK = {"store_credentials_block": (
    Optional[str], None, "Prefect block with the store's S3 credentials: secret/<name> or aws-credentials/<name> "
    "(never logged or stored in the run's config)")}
"""The flows' parameter (beside their launch options) naming such a block."""

ENV_BY_FIELD = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region": "AWS_DEFAULT_REGION",
}


def export_store_credentials(block_slug: str) -> list[str]:
    """Load the block and set the AWS_* variables it provides; returns the names set (never the values)."""
    try:
        block = Block.load(block_slug)
    except (ValueError, KeyError) as err:
        raise ConfigError(f"store_credentials_block: no Prefect block {block_slug!r} ({type(err).__name__}); "
                          "use <block type>/<name>, e.g. secret/my-store or aws-credentials/my-store") from None
    fields = _fields(block, block_slug)
    missing = [k for k in ("key", "secret") if not fields.get(k)]
    if missing:
        raise ConfigError(f"store_credentials_block: block {block_slug!r} lacks {', '.join(missing)}")
    names = []
    for field, value in fields.items():
        if value:
            os.environ[ENV_BY_FIELD[field]] = str(value)
            names.append(ENV_BY_FIELD[field])
    return names


def _fields(block: Any, slug: str) -> dict[str, Any]:
    """The credential fields of an AwsCredentials or Secret block."""
    if hasattr(block, "aws_access_key_id"):  # prefect-aws AwsCredentials
        secret = block.aws_secret_access_key
        token = getattr(block, "aws_session_token", None)
        params = getattr(block, "aws_client_parameters", None)
        return {
            "key": block.aws_access_key_id,
            "secret": secret.get_secret_value() if secret is not None else None,
            "token": token.get_secret_value() if hasattr(token, "get_secret_value") else token,
            "endpoint_url": getattr(params, "endpoint_url", None),
            "region": getattr(block, "region_name", None),
        }
    value = block.get() if hasattr(block, "get") else None
    if not isinstance(value, dict) or not set(value) <= set(ENV_BY_FIELD):
        raise ConfigError(f"store_credentials_block: {slug!r} must hold a JSON object with keys among "
                          f"{', '.join(ENV_BY_FIELD)}")
    return value
