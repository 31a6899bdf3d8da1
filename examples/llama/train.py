"""Train the small Llama on synthetic tokens, with plain PyTorch or with the NKI kernels.

    python examples/llama/train.py --steps 20                 # plain PyTorch
    python examples/llama/train.py --steps 20 --kernels       # torch.ops.neuron.* + FusedAdamW
    TORCH_DEVICE=neuron python examples/llama/train.py --kernels   # on a Trn node

The device comes from one place: ``--device``, else ``TORCH_DEVICE``, else ``cpu``. With
``--kernels`` on CPU tensors the NKI kernels run on the interpreter (``cpu_mode("interpret")``);
on the ``neuron`` device they run compiled. The loss of every step is printed and, with
``--losses PATH`` (or ``NEURON_KERNELS_PARITY_LOSSES``, which ``neuron-kernels parity``
sets), written as JSON: ``{"losses": [...], "pieces": {...}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

try:  # imported as a package (neuron-kernels parity) or run as a script
    from .data import SyntheticTokens
    from .model import Llama, LlamaConfig, make_optimizer
except ImportError:
    from data import SyntheticTokens
    from model import Llama, LlamaConfig, make_optimizer

__all__ = ["DEVICE_ENV", "LOSSES_ENV", "TrainResult", "main", "resolve_device", "train"]

DEVICE_ENV = "TORCH_DEVICE"
LOSSES_ENV = "NEURON_KERNELS_PARITY_LOSSES"


def resolve_device(flag: str | None = None) -> torch.device:
    """``--device``, else ``$TORCH_DEVICE``, else cpu; ``neuron`` loads TorchNeuron first."""
    name = flag or os.environ.get(DEVICE_ENV) or "cpu"
    if name.split(":")[0] == "neuron":
        try:
            import torch_neuronx  # noqa: F401  (registers the neuron device)
        except ImportError:
            raise SystemExit(
                f"device {name!r} needs TorchNeuron (torch-neuronx), which is not installed here"
            ) from None
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise SystemExit(f"device {name!r} is not a torch device ({exc})") from None


@dataclass
class TrainResult:
    losses: list[float]  # loss of step 1..steps, each before that step's update
    pieces: dict = field(default_factory=dict)  # piece -> what ran it (model.Piece as a dict)
    device: str = "cpu"
    kernel_path: str = ""  # where the kernels ran, in words


def train(
    steps: int,
    kernels: bool = False,
    device: torch.device | str = "cpu",
    seed: int = 0,
    batch_size: int = 2,
    seq_len: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    config: LlamaConfig | None = None,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train for ``steps`` steps; identical seed, data and order for both settings.

    ``on_step(step)`` is called before each step (1-based): tests use it to change what
    runs from a given step on.
    """
    device = torch.device(device)
    cfg = config or LlamaConfig(max_seq_len=max(seq_len, 1))
    model = Llama(cfg, kernels=kernels, seed=seed).to(device)
    optimizer = make_optimizer(model, lr=lr, weight_decay=weight_decay)
    data = SyntheticTokens(cfg.vocab_size, seq_len, batch_size, seed=seed)

    interpret = kernels and device.type == "cpu"
    if interpret:
        from neuron_kernels.torch_ops import cpu_mode

        routing = cpu_mode("interpret")
        where = "NKI kernels on the interpreter (CPU tensors, cpu_mode('interpret'))"
    else:
        routing = contextlib.nullcontext()
        where = f"NKI kernels on the {device.type} device" if kernels else "plain PyTorch"

    losses: list[float] = []
    with routing:
        for step in range(1, steps + 1):
            if on_step is not None:
                on_step(step)
            tokens = data.batch(step - 1, device)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach().cpu()))
    pieces = {name: asdict(p) for name, p in model.pieces.items()}
    return TrainResult(losses, pieces, str(device), where)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_positive, default=20)
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="run attention, norms, projections, SwiGLU, optimizer on the NKI kernels",
    )
    parser.add_argument(
        "--device", default=None, help=f"torch device (default ${DEVICE_ENV}, else cpu)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=_positive, default=2)
    parser.add_argument("--seq-len", type=_positive, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--losses", default=None, help=f"write losses as JSON here (or ${LOSSES_ENV})"
    )
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    result = train(
        args.steps,
        kernels=args.kernels,
        device=device,
        seed=args.seed,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
    )
    print(f"device {result.device}: {result.kernel_path}")
    for name, piece in result.pieces.items():
        note = "kernel" if piece["kernel"] else f"not a kernel ({piece['why']})"
        print(f"  {name:<12} {piece['runs']}: {note}")
    for step, loss in enumerate(result.losses, start=1):
        print(f"step {step:>4}  loss {loss:.6f}")
    out = args.losses or os.environ.get(LOSSES_ENV)
    if out:
        with open(out, "w") as f:
            json.dump(asdict(result), f, indent=1)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
