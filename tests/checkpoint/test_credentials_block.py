"""Store credentials from a Prefect block reach s3fs through the environment, and are never logged."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from flows.run.store_credentials import ENV_BY_FIELD, export_store_credentials
from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import ConfigError


@pytest.fixture
def clean_aws_env(monkeypatch):
    for name in ENV_BY_FIELD.values():
        monkeypatch.delenv(name, raising=False)  # restored (removed) after the test whatever export sets


def test_a_secret_block_gives_the_store_its_s3_credentials_unlogged(
    s3_endpoint, prefect_api, clean_aws_env, caplog
) -> None:
    import fsspec
    from prefect.blocks.system import Secret

    Secret(value={"key": "block-key", "secret": "block-secret-value", "endpoint_url": s3_endpoint}).save(
        "gymflow-store-creds", overwrite=True)
    with caplog.at_level(logging.DEBUG):
        names = export_store_credentials("secret/gymflow-store-creds")
        assert set(names) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir("creds-bucket")
        store = CheckpointStore("s3://creds-bucket/run")  # no storage_options: the environment only
        store.commit({"w": np.arange(6.0)}, {"i": 1})
        assert np.array_equal(CheckpointStore("s3://creds-bucket/run").load().tensors["w"], np.arange(6.0))
    assert "block-secret-value" not in caplog.text


def test_a_missing_or_malformed_block_is_a_clear_error(prefect_api, clean_aws_env) -> None:
    from prefect.blocks.system import Secret

    with pytest.raises(ConfigError, match="no Prefect block 'secret/nope'"):
        export_store_credentials("secret/nope")
    Secret(value={"key": "k"}).save("gymflow-half-creds", overwrite=True)
    with pytest.raises(ConfigError, match="lacks secret"):
        export_store_credentials("secret/gymflow-half-creds")
    Secret(value="just a string").save("gymflow-bad-creds", overwrite=True)
    with pytest.raises(ConfigError, match="JSON object"):
        export_store_credentials("secret/gymflow-bad-creds")
