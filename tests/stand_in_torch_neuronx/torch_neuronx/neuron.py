"""The double's ``torch.neuron`` device module (the real one is registered by
``torch_neuronx/__init__.py`` line 122). No device exists here: CPU tensors play it (see
``cpu_plays_neuron.py``), so nothing is available to ``torch.accelerator``."""

from __future__ import annotations


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def current_device() -> int:
    return 0


def manual_seed_all(seed: int) -> None:
    """Nothing to seed: no device."""


def _is_in_bad_fork() -> bool:
    return False
