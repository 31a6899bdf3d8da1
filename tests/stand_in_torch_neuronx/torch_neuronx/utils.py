"""The double's platform and LNC queries (``torch_neuronx/utils.py`` of the public copy).

The real ``get_platform_target()`` and ``get_lnc_setting()`` ask the Neuron runtime for the
instance type and map it through one table (``torch_neuronx/csrc/core/utils/
PlatformUtils.cpp`` lines 29-31); here the instance type comes from
``STAND_IN_TORCH_NEURONX_INSTANCE`` (default ``trn2``), mapped through the same table.
"""

from __future__ import annotations

import os

__all__ = ["INSTANCE_ENV", "get_logical_neuron_cores", "get_lnc_setting", "get_platform_target"]

INSTANCE_ENV = "STAND_IN_TORCH_NEURONX_INSTANCE"

# PlatformUtils.cpp:29-31: instance type -> (platform target, default logical cores).
_PLATFORMS = {
    "inf1": ("inf1", "1"),
    "trn1": ("trn1", "1"),
    "trn1n": ("trn1", "1"),
    "inf2": ("trn1", "1"),
    "trn2": ("trn2", "2"),
    "trn2n": ("trn2", "2"),
    "trn2u": ("trn2", "2"),
    "trn3": ("trn3", "2"),
    "trn3u": ("trn3", "2"),
}


def _platform() -> tuple[str, str]:
    instance = os.environ.get(INSTANCE_ENV, "trn2")
    if instance not in _PLATFORMS:  # PlatformUtils.cpp:36-38
        raise RuntimeError(
            f"Unknown instance type: {instance}. Supported types: inf1, trn1, trn1n, inf2, "
            "trn2, trn2n, trn2u, trn3"
        )
    return _PLATFORMS[instance]


def get_platform_target() -> str:
    """The platform target NKI kernels compile for (utils.py:254-258)."""
    return _platform()[0]


def get_lnc_setting() -> str:
    """The instance family's default LNC, a string (utils.py:261-265)."""
    return _platform()[1]


def get_logical_neuron_cores() -> str:
    """``NEURON_LOGICAL_NC_CONFIG`` when set, else the instance default; a string
    (utils.py:137-144; PlatformUtils.cpp GetLogicalNeuronCores)."""
    return os.environ.get("NEURON_LOGICAL_NC_CONFIG", get_lnc_setting())
