"""Running statistics merged from batches equal the statistics of all the data at once."""
from __future__ import annotations

import numpy as np

from rl_core.policies.normalizer import Moments, ObservationNormalizer


def test_merged_moments_equal_whole_data() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 5))
    merged = Moments(0.0, np.zeros(5), np.zeros(5))
    for part in np.split(data, [10, 300, 301, 999]):
        merged = merged.merge(Moments.of(part))
    whole = Moments.of(data)
    assert merged.count == whole.count
    np.testing.assert_allclose(merged.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.m2, whole.m2, rtol=1e-10)


def test_normalizer_state_round_trip() -> None:
    norm = ObservationNormalizer(3)
    assert np.array_equal(norm.normalize(np.ones((2, 3))), np.ones((2, 3), np.float32))
    norm.update(Moments.of(np.random.default_rng(1).normal(size=(50, 3))))
    other = ObservationNormalizer(3)
    other.load_state(norm.state())
    x = np.random.default_rng(2).normal(size=(4, 3))
    assert np.array_equal(norm.normalize(x), other.normalize(x))
