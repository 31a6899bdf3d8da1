"""``FusedAdamW``: a drop-in ``torch.optim.AdamW`` whose step is ``torch.ops.neuron.fused_adamw_``.

    optimizer = FusedAdamW(model.parameters(), lr=1e-3, weight_decay=0.01)   # was AdamW(...)

Same constructor, defaults, param groups, ``state_dict`` layout (``step``, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq``; loadable into ``AdamW`` and back), LR schedulers,
``zero_grad`` and ``torch.amp.GradScaler``: like ``AdamW(fused=True)`` it declares
``_step_supports_amp_scaling``, so the scaler hands it ``grad_scale`` and ``found_inf``
and the kernel unscales the gradients and skips the step on its own, without a host sync.

Each step groups a param group's tensors by (device, dtype) and makes one op call per
group (the op cuts it into launches). Like ``torch.optim.AdamW(fused=True)``, the
optimizer increments ``state_steps`` before the call and subtracts ``found_inf`` after
it; the op reads the already incremented steps and never writes them.

State is fp32 whatever the params' dtype. ``master_weights=True`` (opt-in) keeps an fp32
copy of every low-precision param in its state (``master_param``, saved in
``state_dict``): the kernel updates the copy from the low-precision gradient and the
param is its rounding, so bf16 training follows the fp32 trajectory.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import fused_adamw

__all__ = ["FusedAdamW"]

MASTER = "master_param"


_POSITION = re.compile(r"^(\w+)\[(\d+)\](.*)$")
_POSITION_IN_RULE = re.compile(r"(\w+)\[(\d+)\]")


def _in_user_terms(exc: LimitError, where: list) -> LimitError:
    """``exc`` with a position inside one (device, dtype) bucket (``grads[1]``) said as the
    user's: the param group and the index in its ``params``."""
    match = _POSITION.match(exc.arg)
    if not match or int(match.group(2)) >= len(where):
        return exc
    group, index = where[int(match.group(2))]
    arg = f"{match.group(1)} of param_groups[{group}]['params'][{index}]{match.group(3)}"

    def in_rule(m):
        i = int(m.group(2))
        return f"{m.group(1)} of param {where[i][1]}" if i < len(where) else m.group(0)

    rule = _POSITION_IN_RULE.sub(in_rule, exc.rule)
    return LimitError("FusedAdamW.step", arg, rule, exc.value, limit=exc.limit, hint=exc.hint)


def _check_hyperparameters(lr, betas, eps, weight_decay) -> None:
    """AdamW's own checks and messages (ValueError), so code that catches them still works."""
    lr_value = float(lr) if isinstance(lr, torch.Tensor) else lr
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr_value or not math.isfinite(lr_value):
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps or not math.isfinite(eps):
        raise ValueError(f"Invalid epsilon value: {eps}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair, got {betas}")
    for i, beta in enumerate(betas):
        value = float(beta)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
    if not 0.0 <= weight_decay or not math.isfinite(weight_decay):
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class FusedAdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW`` with the step in one fused NKI kernel launch per device/dtype group.

    Args: as ``torch.optim.AdamW`` (``foreach``, ``capturable`` and ``fused`` are accepted
    and recorded for ``state_dict`` compatibility; the step is always fused), plus
    ``master_weights``: keep fp32 master copies of low-precision params in the state;
    ``stochastic_rounding_seed``: round bf16 params (without master copies) stochastically,
    reproducibly for the seed (the bits hash the seed, the step and the element index).

    Raises:
        ValueError: a learning rate, eps or weight decay below 0, betas outside [0, 1),
            ``differentiable=True`` (the fused step is not differentiable).
        neuron_kernels.LimitError: at ``step()``, before any tensor is touched, for tensors
            the kernel cannot take (non-contiguous params, unsupported dtypes).
    """

    _step_supports_amp_scaling = True  # GradScaler passes grad_scale/found_inf instead of unscaling

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        master_weights: bool = False,
        stochastic_rounding_seed: int | None = None,
    ) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if differentiable:
            raise ValueError("FusedAdamW does not support differentiable=True")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
            master_weights=master_weights,
            stochastic_rounding_seed=stochastic_rounding_seed,
        )
        super().__init__(params, defaults)

    def __setstate__(self, state) -> None:
        """Fill in keys an ``AdamW`` state_dict (or an older one) lacks."""
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("capturable", False)
            group.setdefault("differentiable", False)
            group.setdefault("fused", None)
            group.setdefault("decoupled_weight_decay", True)
            group.setdefault("master_weights", False)
            group.setdefault("stochastic_rounding_seed", None)

    # -- state ----------------------------------------------------------------------------

    def _state_for(self, p: torch.Tensor, group: dict) -> dict:
        """The param's state, created on first use and normalised after a load: fp32
        moments on the param's device, the step an fp32 tensor there, the master copy."""
        state = self.state[p]
        fp32 = torch.float32
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=fp32, device=p.device)
            state["exp_avg"] = torch.zeros(p.shape, dtype=fp32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=fp32, device=p.device)
        step = state["step"]
        if not torch.is_tensor(step):
            state["step"] = torch.tensor(float(step), dtype=fp32, device=p.device)
        elif step.device != p.device or step.dtype != fp32:
            state["step"] = step.to(device=p.device, dtype=fp32)
        keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
        for key in keys:
            if key not in state:  # amsgrad switched on after some steps
                state[key] = torch.zeros(p.shape, dtype=fp32, device=p.device)
            t = state[key]
            if t.dtype != fp32 or t.device != p.device or not t.is_contiguous():
                state[key] = t.to(device=p.device, dtype=fp32).contiguous()
        if group["master_weights"] and p.dtype != fp32:
            master = state.get(MASTER)
            if master is None or master.shape != p.shape:
                state[MASTER] = p.detach().to(fp32).contiguous()
            elif master.dtype != fp32 or master.device != p.device:
                state[MASTER] = master.to(device=p.device, dtype=fp32).contiguous()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """As ``Optimizer.load_state_dict``, but floating state (moments, master copies,
        the step) is fp32 on the param's device (torch casts moments to the param's dtype)
        and copied, never shared with the source (which would count its steps twice)."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if torch.is_tensor(value) and value.is_floating_point():
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)

    # -- the step ---------------------------------------------------------------------------

    def _buckets(self) -> list[tuple[dict, dict]]:
        """Per param group, the tensors with a gradient grouped by (device, dtype)."""
        out = []
        for group_index, group in enumerate(self.param_groups):
            buckets: dict = defaultdict(lambda: defaultdict(list))
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedAdamW does not support sparse gradients")
                state = self._state_for(p, group)
                b = buckets[(p.device, p.dtype)]
                master = state.get(MASTER) if group["master_weights"] else None
                b["params"].append(p)
                b["where"].append((group_index, index))
                b["targets"].append(master if master is not None else p)
                b["masters"].append(master)
                b["grads"].append(p.grad)
                b["exp_avgs"].append(state["exp_avg"])
                b["exp_avg_sqs"].append(state["exp_avg_sq"])
                if group["amsgrad"]:
                    b["max_exp_avg_sqs"].append(state["max_exp_avg_sq"])
                b["state_steps"].append(state["step"])
            out.extend((group, b) for b in buckets.values())
        return out

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step for every param with a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # set by GradScaler.step
        found_inf = getattr(self, "found_inf", None)
        had_state = {id(p) for p in self.state}
        try:
            calls = self._checked_calls(grad_scale, found_inf)
        except Exception:
            # A refused step changes nothing: not even the state it began to create.
            for p in [p for p in self.state if id(p) not in had_state]:
                del self.state[p]
            raise
        for b, lists, kwargs in calls:
            steps = b["state_steps"]
            torch._foreach_add_(steps, 1)  # the caller's side, as torch's fused AdamW
            torch.ops.neuron.fused_adamw_(*lists, **kwargs)
            if kwargs["found_inf"] is not None:  # a skipped step does not count
                torch._foreach_sub_(steps, [kwargs["found_inf"].reshape(())] * len(steps))
            masters = [(p, m) for p, m in zip(b["params"], b["masters"]) if m is not None]
            if masters:
                torch._foreach_copy_([p for p, _ in masters], [m for _, m in masters])
        return loss

    def _checked_calls(self, grad_scale, found_inf) -> list:
        """(bucket, tensor lists, kwargs) of every fused_adamw_ call of this step, each
        checked before the first one touches a tensor; a refusal names the user's param
        group and index, not a position inside an internal (device, dtype) bucket."""
        calls = []
        for group, b in self._buckets():
            _check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            device = b["params"][0].device
            kwargs = dict(
                lr=float(group["lr"]),
                beta1=float(group["betas"][0]),
                beta2=float(group["betas"][1]),
                weight_decay=float(group["weight_decay"]),
                eps=float(group["eps"]),
                amsgrad=bool(group["amsgrad"]),
                maximize=bool(group["maximize"]),
                grad_scale=None if grad_scale is None else grad_scale.to(device),
                found_inf=None if found_inf is None else found_inf.to(device),
                stochastic_rounding_seed=(
                    group["stochastic_rounding_seed"]
                    if b["targets"][0].dtype == torch.bfloat16
                    else None
                ),
            )
            lists = (
                b["targets"], b["grads"], b["exp_avgs"], b["exp_avg_sqs"],
                b["max_exp_avg_sqs"], b["state_steps"],
            )  # fmt: skip
            try:
                fused_adamw.validate(*lists, *kwargs.values())
            except LimitError as exc:
                raise _in_user_terms(exc, b["where"]) from None
            calls.append((b, lists, kwargs))
        return calls
