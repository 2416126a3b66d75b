"""The oneDNN linear layer: torch's values and gradients within rounding, and, what the generator's parity rests on,
each row's bits independent of the rows that share its call, of packing and of the thread count."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rl_core.policies.onednn_linear import Linear, onednn_available

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear (plain F.linear)")


def layer(in_dim: int = 576, out_dim: int = 1536, seed: int = 0) -> Linear:
    linear = nn.utils.skip_init(Linear, in_dim, out_dim, bias=False)
    with torch.no_grad():
        linear.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(seed))
    return linear


def test_values_and_gradients_are_torchs_within_rounding() -> None:
    linear = layer()
    x = torch.randn(3, 40, 576, generator=torch.Generator().manual_seed(1), requires_grad=True)
    ours = linear(x)
    theirs = F.linear(x, linear.weight)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2))
    ours_x, ours_w = torch.autograd.grad(ours, (x, linear.weight), grad)
    theirs_x, theirs_w = torch.autograd.grad(theirs, (x, linear.weight), grad)
    torch.testing.assert_close(ours_x, theirs_x)
    torch.testing.assert_close(ours_w, theirs_w)


def test_a_rows_bits_do_not_depend_on_its_call() -> None:
    """Rows alone, in small calls, in a large call, with and without autograd, on 1 and 2 threads: the same bits."""
    linear = layer()
    x = torch.randn(300, 576, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = linear(x)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                for rows in (1, 2, 3, 5, 16, 17, 64):
                    assert torch.equal(linear(x[:rows]), whole[:rows]), f"{rows} rows on {count} threads"
                assert torch.equal(linear(x[7]), whole[7])  # a single vector
            assert torch.equal(linear(x.requires_grad_()), whole)  # the autograd path
            x.requires_grad_(False)
    finally:
        torch.set_num_threads(threads)


def test_the_packed_weight_follows_in_place_updates() -> None:
    linear = layer(64, 32)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = linear(x)
        linear.weight.mul_(2)  # as an optimizer step or a weight update does
        after = linear(x)
    torch.testing.assert_close(after, 2 * before)


def test_other_dtypes_take_torchs_own_linear() -> None:
    linear = layer(64, 32).double()
    x = torch.randn(4, 64, dtype=torch.float64)
    assert torch.equal(linear(x), F.linear(x, linear.weight))


def test_a_used_layer_deep_copies_and_pickles() -> None:
    """The packed copy (an opaque oneDNN tensor) stays behind: GRPO deep-copies its reference model, Ray pickles."""
    linear = layer(64, 32)
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = linear(x)
        for twin in (copy.deepcopy(linear), pickle.loads(pickle.dumps(linear))):
            assert torch.equal(twin(x), expected)


def test_the_probe_answers_the_same_when_first_asked_under_inference_mode() -> None:
    """A generator's first call runs under `torch.inference_mode`; the probe, cached per process, must not answer
    False there (a process's trainer and generator would then compute different functions)."""
    import subprocess
    import sys

    code = ("import torch\nfrom rl_core.policies.onednn_linear import onednn_available\n"
            "with torch.inference_mode():\n    print(onednn_available())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"
