"""FusedAdamW against torch.optim.AdamW: trajectories for every flag combination (the NKI
kernel on the interpreter), GradScaler skips, LR schedulers without rebuilds, state_dict
both ways, master weights and bad input."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.fused_adamw_)
from neuron_kernels.errors import LimitError
from neuron_kernels.torch_ops import cpu_mode, routing
from neuron_kernels.torch_ops.optim import FusedAdamW

# Tolerances, fixed before looking at results. Both optimizers compute in fp32 from the
# same gradients; they differ only in operation order (torch: lerp, sqrt(v) / sqrt(bc2);
# the kernel: fused multiply-adds, sqrt(v / bc2)), a few ulps per step, and AdamW's
# contraction (beta < 1) keeps 20 steps of such differences from growing: 2^-18
# relative (~4 ulps x 4) with an absolute floor for entries that pass through ~0.
PARAM_TOL = dict(rtol=2**-18, atol=1e-6)
EXP_AVG_TOL = dict(rtol=2**-18, atol=1e-7)
EXP_AVG_SQ_TOL = dict(rtol=2**-18, atol=1e-10)
# bf16 params with fp32 master weights: the param is the master rounded once to bf16
# (0.5 ulp = 2^-9 relative), compared with torch's fp32 trajectory: 2x margin.
BF16_PARAM_TOL = dict(rtol=2**-8, atol=1e-6)

STEPS = 20


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _groups(model, **extra):
    """Two param groups with their own hyperparameters."""
    return [
        {"params": list(model[0].parameters())},
        {"params": list(model[2].parameters()), "lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6},
    ]


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


FLAGS = list(itertools.product([False, True], [False, True], [0.0, 0.05], ["float32", "bfloat16"]))


@pytest.mark.parametrize(
    "amsgrad, maximize, weight_decay, dtype",
    FLAGS,
    ids=[f"ams{int(a)}-max{int(m)}-wd{w}-{d}" for a, m, w, d in FLAGS],
)
def test_twenty_steps_match_torch_adamw(amsgrad, maximize, weight_decay, dtype):
    """Params and state within tolerance of torch.optim.AdamW at every one of 20 steps.
    bf16 runs keep fp32 master weights and are compared with AdamW on fp32 params fed the
    same (bf16-rounded) gradients."""
    ref_model = _model()
    model = copy.deepcopy(ref_model).to(getattr(torch, dtype))
    hyper = dict(lr=1e-2, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
    ref = torch.optim.AdamW(_groups(ref_model), **hyper)
    opt = FusedAdamW(_groups(model), master_weights=dtype != "float32", **hyper)
    pairs = list(zip(model.parameters(), ref_model.parameters()))
    with torch.no_grad():
        for p, q in pairs:  # the same starting point: bf16-rounded for bf16 runs
            q.copy_(p.float())
    for step in range(STEPS):
        x, y = _batch(step)
        ref.zero_grad()
        ((ref_model(x) - y) ** 2).mean().backward()
        for p, q in pairs:
            p.grad = q.grad.to(p.dtype)
            q.grad = p.grad.float()  # both see the same gradient values
        with cpu_mode("interpret"):
            opt.step()
        ref.step()
        for p, q in pairs:
            ours, theirs = opt.state[p], ref.state[q]
            if dtype == "float32":
                torch.testing.assert_close(p, q, **PARAM_TOL)
            else:
                torch.testing.assert_close(ours["master_param"], q, **PARAM_TOL)
                torch.testing.assert_close(p.float(), q, **BF16_PARAM_TOL)
            torch.testing.assert_close(ours["exp_avg"], theirs["exp_avg"], **EXP_AVG_TOL)
            torch.testing.assert_close(ours["exp_avg_sq"], theirs["exp_avg_sq"], **EXP_AVG_SQ_TOL)
            if amsgrad:
                torch.testing.assert_close(
                    ours["max_exp_avg_sq"], theirs["max_exp_avg_sq"], **EXP_AVG_SQ_TOL
                )
            assert ours["step"].item() == theirs["step"].item() == step + 1


def _scaled_training(optimizer_cls, inject_at, steps=6, **kwargs):
    """A GradScaler loop; at step ``inject_at`` one gradient gets an inf."""
    model = _model()
    opt = optimizer_cls(model.parameters(), lr=1e-2, **kwargs)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    history = []
    for step in range(steps):
        x, y = _batch(step)
        opt.zero_grad()
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        if step == inject_at:
            model[0].weight.grad[0, 0] = float("inf")
        with cpu_mode("interpret"):
            scaler.step(opt)
        scaler.update()
        history.append([p.detach().clone() for p in model.parameters()])
    return model, opt, history


def test_grad_scaler_skips_exactly_the_step_with_an_inf():
    model, opt, history = _scaled_training(FusedAdamW, inject_at=2)
    ref_model, ref_opt, ref_history = _scaled_training(torch.optim.AdamW, inject_at=2)
    for a, b in zip(history[2], history[1]):  # the skipped step changed nothing, bit for bit
        assert torch.equal(a, b)
    for ours, theirs in zip(history, ref_history):
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, **PARAM_TOL)
    steps = {opt.state[p]["step"].item() for p in model.parameters()}
    assert steps == {5.0}  # 6 steps, one skipped: the step count does not count it
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")


def test_lr_scheduler_changes_lr_every_step_without_a_new_build(monkeypatch):
    builds = set()
    real = routing.interpreter_runner

    def recording(kernel, *args, **kwargs):
        shapes = tuple(
            tuple(tuple(t.shape) for t in a) if isinstance(a, tuple) else a
            for a in args
            if not isinstance(a, torch.Tensor)
        )
        builds.add(((kernel.fn, kernel.grid), shapes))  # kernel[lnc] is a new object per launch
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(routing, "interpreter_runner", recording)
    model, ref_model = _model(), _model()
    opt = FusedAdamW(model.parameters(), lr=1e-2)
    ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    schedules = [torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.7) for o in (opt, ref)]
    lrs = []
    for step in range(5):
        x, y = _batch(step)
        for m, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
        with cpu_mode("interpret"):
            opt.step()
        ref.step()
        for s in schedules:
            s.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert len(set(lrs)) == 5
    assert len(builds) == 1, builds
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, **PARAM_TOL)


def _train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        x, y = (t.to(next(model.parameters()).dtype) for t in _batch(step))
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize(
    "first, second", [(FusedAdamW, torch.optim.AdamW), (torch.optim.AdamW, FusedAdamW)]
)
def test_state_dict_round_trip_then_identical_steps(first, second):
    """Train with one, load its state into the other, then both take the same next steps."""
    kwargs = dict(lr=1e-2, amsgrad=True, weight_decay=0.1)
    model = _model()
    opt = first(_groups(model), **kwargs)
    _train(model, opt, 3)
    moved = copy.deepcopy(model)
    other = second(_groups(moved), **kwargs)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.save + torch.load
    for p in other.state:
        assert other.state[p]["exp_avg"].dtype == torch.float32
    _train(model, opt, 2, start=3)
    _train(moved, other, 2, start=3)
    for p, q in zip(model.parameters(), moved.parameters()):
        torch.testing.assert_close(p, q, **PARAM_TOL)
    assert [g["lr"] for g in other.param_groups] == [1e-2, 3e-3]


def test_master_weights_live_in_the_state_dict():
    model = _model().to(torch.bfloat16)
    opt = FusedAdamW(model.parameters(), lr=1e-2, master_weights=True)
    _train(model, opt, 2)
    state = opt.state_dict()["state"]
    assert all(s["master_param"].dtype == torch.float32 for s in state.values())
    restored = copy.deepcopy(model)
    again = FusedAdamW(restored.parameters(), lr=1e-2, master_weights=True)
    again.load_state_dict(opt.state_dict())  # copies what it loads: nothing is shared
    _train(model, opt, 1, start=2)
    _train(restored, again, 1, start=2)
    for p, q in zip(model.parameters(), restored.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lr=-1e-3), "learning rate"),
        (dict(eps=-1.0), "epsilon"),
        (dict(betas=(1.0, 0.999)), "beta parameter at index 0"),
        (dict(betas=(0.9, -0.1)), "beta parameter at index 1"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ],
)
def test_bad_hyperparameters_raise_like_adamw(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FusedAdamW(_model().parameters(), **kwargs)
    with pytest.raises(ValueError, match=message):
        torch.optim.AdamW(_model().parameters(), **kwargs)


def test_a_bad_group_leaves_every_tensor_untouched():
    """The second group's lr turned negative, or a non-contiguous param: step() raises before
    the first group is updated, and no step count moves."""
    model = _model()
    opt = FusedAdamW(_groups(model), lr=1e-2)
    _train(model, opt, 1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch(5)
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    opt.param_groups[1]["lr"] = 1e-2
    opt.state[model[2].weight]["exp_avg"] = torch.zeros(3, 6)  # a corrupted state tensor
    with pytest.raises(LimitError, match="exp_avgs"):
        opt.step()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    assert {opt.state[p]["step"].item() for p in model.parameters()} == {1.0}


def test_stochastic_rounding_of_bf16_params_is_reproducible():
    """bf16 params without master copies, rounded stochastically by the kernel: the same
    seed gives the same bits, another seed other bits; fp32 params ignore the seed (the op
    itself refuses one for fp32 params: see the contract's bad inputs)."""

    def run(seed):
        model = _model().to(torch.bfloat16)
        opt = FusedAdamW(model.parameters(), lr=1e-2, stochastic_rounding_seed=seed)
        with cpu_mode("interpret"):
            _train(model, opt, 4)
        return [p.detach().clone() for p in model.parameters()]

    first, again, other = run(1), run(1), run(2)
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(first, again))
    assert any(not torch.equal(a, b) for a, b in zip(first, other))
    plain, seeded = _model(), _model()  # fp32 params: nothing to round, the seed is unused
    _train(plain, FusedAdamW(plain.parameters()), 2)
    _train(seeded, FusedAdamW(seeded.parameters(), stochastic_rounding_seed=1), 2)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), seeded.parameters()))


def test_unscale_and_clip_before_the_step_match_adamw():
    """scaler.unscale_() then gradient clipping: the scaler hands over found_inf only (the
    grads are already unscaled); a NaN step is skipped as AdamW skips it."""

    def run(optimizer_cls):
        model = _model()
        opt = optimizer_cls(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        for step in range(4):
            x, y = _batch(step)
            opt.zero_grad()
            scaler.scale(((model(x) - y) ** 2).mean()).backward()
            if step == 1:
                model[2].bias.grad[0] = float("nan")
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            with cpu_mode("interpret"):
                scaler.step(opt)
            scaler.update()
        return model

    for p, q in zip(run(FusedAdamW).parameters(), run(torch.optim.AdamW).parameters()):
        torch.testing.assert_close(p, q, **PARAM_TOL)
