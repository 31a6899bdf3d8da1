"""NKI kernels, one module per op. Each module declares its op once (an ``OpSpec``) and
registers it; importing this package registers every op."""

from neuron_kernels.kernels.spec import (
    REGISTRY,
    OpSpec,
    Tolerance,
    TunableConfig,
    get_spec,
    register,
)

__all__ = ["REGISTRY", "OpSpec", "Tolerance", "TunableConfig", "get_spec", "register"]

# The op registry: one line per kernel module.
from neuron_kernels.kernels import (
    flash_attention,  # noqa: E402,F401
    flash_attention_bwd,  # noqa: E402,F401
    flash_attention_varlen,  # noqa: E402,F401
    fused_adamw,  # noqa: E402,F401
    matmul,  # noqa: E402,F401
    rms_norm,  # noqa: E402,F401
    rms_norm_bwd,  # noqa: E402,F401
    swiglu,  # noqa: E402,F401
)
