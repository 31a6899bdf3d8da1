"""Switch a training loop from ``torch.optim.AdamW`` to ``FusedAdamW``: one line changes.

The loop below is ordinary PyTorch mixed-precision training: a GradScaler (the scale and
the inf check go to the fused kernel, as with ``AdamW(fused=True)``), a warm-up then
cosine LR schedule, param groups (no weight decay on biases), ``zero_grad`` and a
``state_dict`` checkpoint. ``train()`` takes the optimizer class; nothing else differs::

    optimizer = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    optimizer = FusedAdamW(groups, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)

Run it anywhere::

    python examples/train_with_fused_adamw.py [--steps 30] [--reference]

On CPU the fused step runs the NKI kernel on the portable interpreter (``--reference``:
the op's plain-torch math instead); on a ``neuron`` device it runs the kernel itself. The
script trains once with each optimizer and checks both runs agree (an inf gradient is
injected at step 5, so both must skip that step), exiting non-zero if not.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

import torch

from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.torch_ops.optim import FusedAdamW

INJECT_INF_AT = 5  # a step whose gradients overflow: GradScaler must skip it


def train(optimizer_cls, steps: int, seed: int = 0):
    """A small regression MLP trained with ``optimizer_cls``; returns the model and losses."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]

    optimizer = optimizer_cls(groups, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)

    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * s / steps)),
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    data = torch.Generator().manual_seed(seed + 1)
    target = torch.nn.Linear(16, 4)
    losses = []
    for step in range(steps):
        x = torch.randn(32, 16, generator=data)
        with torch.no_grad():
            y = torch.tanh(target(x))
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if step == INJECT_INF_AT:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        losses.append(loss.item())
    checkpoint = optimizer.state_dict()  # loadable into either optimizer class
    return model, losses, checkpoint


class OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one line (``--help`` shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrors(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=30, help="default 30")
    parser.add_argument(
        "--reference", action="store_true", help="on CPU, the op's torch math, not the kernel"
    )
    args = parser.parse_args(argv)
    if args.steps <= INJECT_INF_AT:
        parser.error(f"--steps must be > {INJECT_INF_AT} (the step with an inf), got {args.steps}")

    ref_model, ref_losses, _ = train(torch.optim.AdamW, args.steps)
    where = contextlib.nullcontext() if args.reference else cpu_mode("interpret")
    with where:
        model, losses, checkpoint = train(FusedAdamW, args.steps)

    worst = max(
        float((p - q).detach().abs().max())
        for p, q in zip(model.parameters(), ref_model.parameters())
    )
    steps = {int(s["step"]) for s in checkpoint["state"].values()}
    # Same gradients, fp32 math in both: a few fp32 ulps per step (bound chosen beforehand).
    ok = worst <= 1e-5 and steps == {args.steps - 1}
    print(
        f"{args.steps} steps, GradScaler + warm-up/cosine LR, inf injected at step "
        f"{INJECT_INF_AT}: loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f} (AdamW), "
        f"{losses[0]:.4f} -> {losses[-1]:.4f} (FusedAdamW, "
        f"{'reference math' if args.reference else 'NKI kernel on the interpreter'}); "
        f"max param diff {worst:.2g} (<= 1e-05), steps counted {sorted(steps)} "
        f"-> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
