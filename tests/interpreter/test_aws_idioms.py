"""Kernels in aws-neuron/nki-library's style run with correct numbers (issue 14 item 8).

Written after reading nki-library's kernels and the nisa docstring examples, not copied:
a frozen ``@dataclass`` NKIObject config and a plain NKIObject one, ``is None`` /
``is not None`` on optional tensor and scalar arguments, an indirect row gather
(``.ap(vector_offset=...)``), ``nl.broadcast_to`` of a weight row across partitions, and a
helper in the same module. Each is compared with a NumPy reference; a tensor used with
``is`` (other than against None) is still refused.

Tolerances, chosen before running: the gather and broadcast only move bits (exact). RMSNorm
in fp32: a 64-term fp32 sum of squares (about 64 * 2**-24 relative), one rsqrt and two
products, so ``rtol=2e-5, atol=1e-6``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from neuron_kernels.interpreter import NkiValidationError, nki

nl, nisa = nki.language, nki.isa
RNG = np.random.default_rng(2026)


@dataclass(frozen=True)
class NormConfig(nl.NKIObject):
    eps: float = 1e-6
    rows_per_tile: int = 128


class GatherConfig(nl.NKIObject):  # no @dataclass: the language guide's other form
    tokens_per_tile: int = 128
    scale: float = None


def _load(src, rows, cols, dtype):
    """A helper, as nki-library factors DMA loads out of its kernels."""
    tile = nl.ndarray((rows, cols), dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


@nki.jit
def rmsnorm_kernel(x, gamma=None, config=None):
    if config is None:
        config = NormConfig()
    n, h = x.shape
    out = nl.ndarray((n, h), x.dtype, buffer=nl.shared_hbm)
    g = None
    if gamma is not None:
        row = _load(gamma, 1, h, gamma.dtype)
        g = nl.broadcast_to(row, (config.rows_per_tile, h))
    for r in range(0, n, config.rows_per_tile):
        p = min(config.rows_per_tile, n - r)
        t = _load(x[r : r + p, :], p, h, nl.float32)
        sq = nl.ndarray((p, h), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq, data1=t, data2=t, op=nl.multiply)
        ms = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=ms, op=nl.add, data=sq, axis=1, keepdims=True)
        nisa.tensor_scalar(
            dst=ms, data=ms, op0=nl.multiply, operand0=1.0 / h, op1=nl.add, operand1=config.eps
        )
        inv = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=inv, op=nl.rsqrt, data=ms)
        y = nl.ndarray((p, h), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=inv)
        if g is not None:
            nisa.tensor_tensor(dst=y, data1=y, data2=g[0:p, :], op=nl.multiply)
        nisa.dma_copy(dst=out[r : r + p, :], src=y)
    return out


def _rmsnorm_ref(x, gamma, eps):
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + eps)
    return y if gamma is None else y * gamma.astype(np.float64)


@pytest.mark.parametrize("with_gamma", [False, True])
@pytest.mark.parametrize("config", [None, NormConfig(eps=1e-3, rows_per_tile=64)])
def test_rmsnorm_optional_weight_and_config(with_gamma, config):
    x = RNG.standard_normal((200, 64)).astype(np.float32)
    gamma = RNG.standard_normal((1, 64)).astype(np.float32) if with_gamma else None
    got = rmsnorm_kernel(x, gamma, config)
    eps = (config or NormConfig()).eps
    np.testing.assert_allclose(got, _rmsnorm_ref(x, gamma, eps), rtol=2e-5, atol=1e-6)


@nki.jit
def embedding_kernel(table, token_ids, config):
    t, d = token_ids.shape[0], table.shape[1]
    out = nl.ndarray((t, d), table.dtype, buffer=nl.shared_hbm)
    for start in range(0, t, config.tokens_per_tile):
        p = min(config.tokens_per_tile, t - start)
        ids = _load(token_ids[start : start + p, :], p, 1, nl.int32)
        rows = nl.ndarray((p, d), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(
            dst=rows, src=table.ap(pattern=[[d, p], [1, d]], vector_offset=ids, indirect_dim=0)
        )
        if config.scale is not None:
            nisa.tensor_scalar(dst=rows, data=rows, op0=nl.multiply, operand0=config.scale)
        nisa.dma_copy(dst=out[start : start + p, :], src=rows)
    return out


@pytest.mark.parametrize("scale", [None, 0.5])
def test_embedding_gather(scale):
    table = RNG.standard_normal((1000, 48)).astype(np.float32)
    ids = RNG.integers(0, 1000, (300, 1)).astype(np.int32)
    config = GatherConfig(scale=scale)  # tokens_per_tile from the class default
    got = embedding_kernel(table, ids, config)
    want = table[ids[:, 0]] * (1.0 if scale is None else np.float32(scale))
    np.testing.assert_array_equal(got, want)


@nki.jit
def aliasing_check_kernel(x, y):
    if x is y:  # identity of two tensors: no trace-time meaning, refused
        return None
    return None


def test_tensor_identity_is_still_refused():
    a = np.zeros((2, 2), np.float32)
    with pytest.raises(NkiValidationError, match="'is' at .*test_aws_idioms.py:"):
        aliasing_check_kernel(a, a + 1)
