"""The Llama example: one setting moves norms, attention, projections, the SwiGLU activation
and the optimizer to the library, each piece that claims a kernel launches one, both
settings start from the same parameters and data, the rollback switch runs no kernel, and the script runs as a
user would run it.

Tolerance, chosen before any run: 2e-3 (absolute loss) between the plain and the kernel
(or rolled-back) path over a few steps, the parity acceptance bound: the paths differ only
by fp32 summation order.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from neuron_kernels.cli import parity
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.torch_ops import routing

TOLERANCE = 2e-3
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama"
TRAIN = parity.load_example()
MODEL = importlib.import_module(f"{parity.EXAMPLE_PACKAGE}.model")
DATA = importlib.import_module(f"{parity.EXAMPLE_PACKAGE}.data")
# The op behind each switchable piece.
PIECE_OPS = {
    "projections": "matmul",
    "norms": "rms_norm",
    "attention": "flash_attention",
    "activation": "swiglu",
    "optimizer": "fused_adamw_",
}
SMALL = dict(seed=0, device="cpu", batch_size=1, seq_len=64)


def test_the_setting_switches_every_piece_the_library_has():
    plain = MODEL.kernel_pieces(False)
    assert set(plain) == set(PIECE_OPS) and not any(p.kernel for p in plain.values())
    pieces = MODEL.kernel_pieces(True)
    has_fused_adamw = importlib.util.find_spec("neuron_kernels.torch_ops.optim") is not None
    for name, op in PIECE_OPS.items():
        available = op in REGISTRY and (name != "optimizer" or has_fused_adamw)
        assert pieces[name].kernel == available, (name, pieces[name])
        if not pieces[name].kernel:
            assert "not" in pieces[name].why  # says why it is not a kernel
    assert pieces["projections"].kernel  # matmul is always registered


def test_both_settings_start_from_the_same_parameters():
    cfg = MODEL.LlamaConfig()
    plain = MODEL.Llama(cfg, kernels=False, seed=3).state_dict()
    kernel = MODEL.Llama(cfg, kernels=True, seed=3).state_dict()
    assert plain.keys() == kernel.keys()
    assert all(torch.equal(plain[k], kernel[k]) for k in plain)
    other = MODEL.Llama(cfg, kernels=False, seed=4).state_dict()
    assert not torch.equal(plain["embed"], other["embed"])


def test_data_is_the_same_batches_in_the_same_order():
    a, b = DATA.SyntheticTokens(256, 16, 2, seed=1), DATA.SyntheticTokens(256, 16, 2, seed=1)
    assert torch.equal(a.batch(5), b.batch(5)) and a.batch(5).shape == (2, 17)
    assert not torch.equal(a.batch(5), a.batch(6))
    assert not torch.equal(a.batch(0), DATA.SyntheticTokens(256, 16, 2, seed=2).batch(0))


def test_kernel_path_runs_a_kernel_for_every_claimed_piece(kernel_launches):
    plain = TRAIN.train(2, kernels=False, **SMALL)
    result = TRAIN.train(2, kernels=True, **SMALL)
    launched = {k.fn for k in kernel_launches}  # kernel[lnc] launches: compare the functions
    for name, piece in result.pieces.items():
        if piece["kernel"]:
            op = PIECE_OPS[name]  # the op and its parts (rms_norm_fwd/_bwd, ...)
            parts = [n for n in REGISTRY if n == op or n.startswith(op.rstrip("_") + "_")]
            op_kernels = {k.fn for n in parts for k in REGISTRY[n].kernels}
            assert launched & op_kernels, f"{name} claims {piece['runs']} but launched none"
    assert max(abs(k - r) for k, r in zip(result.losses, plain.losses)) <= TOLERANCE


def test_rollback_switch_runs_no_kernel(kernel_launches, monkeypatch):
    monkeypatch.setenv(routing.DISABLE_ENV, "1")
    plain = TRAIN.train(2, kernels=False, **SMALL)
    rolled_back = TRAIN.train(2, kernels=True, **SMALL)
    assert kernel_launches == []
    assert max(abs(k - r) for k, r in zip(rolled_back.losses, plain.losses)) <= TOLERANCE


def test_plain_training_learns():
    losses = TRAIN.train(20, kernels=False, **SMALL).losses
    assert len(losses) == 20 and losses[-1] < losses[0] - 0.5  # ~6.0 -> ~5.0 nats at batch 1


def test_device_comes_from_one_place(monkeypatch):
    monkeypatch.setenv(TRAIN.DEVICE_ENV, "meta")
    assert TRAIN.resolve_device(None).type == "meta"
    assert TRAIN.resolve_device("cpu").type == "cpu"  # --device wins
    monkeypatch.delenv(TRAIN.DEVICE_ENV)
    assert TRAIN.resolve_device(None).type == "cpu"


def _run_script(args, tmp_path, **env):
    return subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), *args],
        cwd=tmp_path,  # a user's own folder, not the repo
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_script_runs_as_a_user_would(tmp_path):
    done = _run_script(["--steps", "3", "--losses", "out.json"], tmp_path, TORCH_DEVICE="cpu")
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert len(doc["losses"]) == 3 and doc["device"] == "cpu"
    assert "step    3  loss" in done.stdout and "plain PyTorch" in done.stdout


def test_script_refuses_a_bad_device_in_one_line(tmp_path):
    done = _run_script(["--steps", "1"], tmp_path, TORCH_DEVICE="quantum")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "device 'quantum'" in done.stderr
