"""``neuron_kernels.integrations.transformers``: real ``transformers`` models built in code from
tiny configs (no download), patched, against the same models unpatched (``"eager"``).

What it follows: transformers 4.57.6's ``masking_utils`` (the mask function per
``attn_implementation``; ``sliding_window_overlay``: key ``j`` visible to query ``i`` iff
``j > i - W``; ``causal_mask_function``: ``j <= i``), ``integrations/sdpa_attention.py`` (the
attention-function signature) and each family's modeling file (RMSNorm casting, MLP, the
``sliding_window``/``softcap``/``s_aux`` keywords its attention passes).

The patched models run their ops on the NKI interpreter (``cpu_mode("interpret")``) where a
test compares numbers, so the kernels themselves are checked, on shapes kept tiny for time.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from neuron_kernels.errors import LimitError  # noqa: E402
from neuron_kernels.integrations import transformers as nkt  # noqa: E402
from neuron_kernels.torch_ops import cpu_mode  # noqa: E402
from neuron_kernels.torch_ops.nn import RMSNorm  # noqa: E402

VOCAB, BATCH, SEQ = 64, 2, 12
WINDOW = 4  # < SEQ: the window hides keys that causal alone would show

# Tolerances, chosen before the first run. fp32 throughout: each op agrees with fp32 torch to
# its declared fp32 tolerance (2e-5 relative for flash attention, fp32 sums for rms_norm and
# swiglu); two layers of ~6 ops each compose to a few 1e-5 on O(1) logits.
LOGITS_TOL = {"rtol": 1e-4, "atol": 1e-4}
# Gradients sum more fp32 products (dq/dk/dv over the sequence, the norm weights' over every
# row), and a parameter's gradient entries span orders of magnitude: relative 1e-3, absolute
# 1e-3 of the tensor's largest entry.
GRAD_RTOL, GRAD_ATOL_OF_MAX = 1e-3, 1e-3
# Training: AdamW's first steps move an entry by about lr * g / |g|, a step function of g at 0,
# so an entry whose gradient is within the kernels' error of 0 may move up to 2 * lr the other
# way. Losses (continuous in everything) are held to LOGITS_TOL; the parameters' total update
# to 1% of its norm (a few such entries among ~20k parameters).
UPDATE_REL_TOL = 1e-2


def _config(family: str):
    """A tiny config of ``family``: hidden 32, 2 layers, 4 query heads over 2 KV heads (GQA),
    head dim 8, vocab 64; the family's attention features switched on and made to matter."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=WINDOW)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen2_sliding":  # layer 0 full, layer 1 sliding (max_window_layers)
        return transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
        )
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=8)
    if family == "gemma2":
        # layer 0 sliding, layer 1 full (Gemma2Config's alternating layer_types); weights
        # drawn wide enough (initializer_range) that the scores reach the softcap's bend.
        return transformers.Gemma2Config(
            **common,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=30.0,
            initializer_range=0.3,
        )
    if family == "gpt_oss":
        # layer 0 sliding, layer 1 full; sinks drawn with initializer_range
        common["intermediate_size"] = 32
        return transformers.GptOssConfig(
            **common,
            head_dim=8,
            sliding_window=WINDOW,
            num_local_experts=2,
            num_experts_per_tok=1,
            initializer_range=0.3,
        )
    raise AssertionError(family)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gpt_oss"]
NEEDS_FEATURES = {"mistral", "gemma2", "gpt_oss"}  # window, softcap, sinks


def _model(config):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def _ids(seed=1, batch=BATCH, seq=SEQ):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _launched(kernel_launches) -> set[str]:
    return {getattr(k, "__name__", None) or getattr(k, "func", k).__name__ for k in kernel_launches}


def _assert_grads_close(got_model, want_model):
    got = dict(got_model.named_parameters())
    for name, want in want_model.named_parameters():
        if want.grad is None:
            assert got[name].grad is None, name
            continue
        scale = want.grad.abs().max().item()
        torch.testing.assert_close(
            got[name].grad,
            want.grad,
            rtol=GRAD_RTOL,
            atol=GRAD_ATOL_OF_MAX * scale,
            msg=lambda m, name=name: f"{name}: {m}",
        )


# -- registration --------------------------------------------------------------------------


def test_registers_attention_and_mask_functions():
    """Importing the module registers "neuron" with both interfaces (masking_utils:
    ``_preprocess_mask_arguments`` skips mask creation for names absent from the mask
    interface; ours is registered, so a padding mask is seen and passed on, not dropped)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["neuron"] is nkt.neuron_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["neuron"] is nkt.neuron_attention_mask
    assert "neuron" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


def test_from_config_with_attn_implementation_neuron():
    """``attn_implementation="neuron"`` at construction (modeling_utils
    ``get_correct_attn_implementation`` accepts registered names) gives eager's logits (the
    op's reference math: this is about the wiring; the kernels are checked below)."""
    config = _config("llama")
    want = _model(config).eval()
    torch.manual_seed(0)
    got = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="neuron")
    got.load_state_dict(want.state_dict())
    assert got.config._attn_implementation == "neuron"
    with torch.no_grad(), cpu_mode("reference"):
        torch.testing.assert_close(got(_ids()).logits, want(_ids()).logits, **LOGITS_TOL)


def test_llama_reaches_the_op_without_a_dense_mask(monkeypatch, kernel_launches):
    """Every layer's attention gets ``attention_mask=None`` and calls the op with
    ``causal=True`` and no window, and the op runs its kernel (sdpa would get ``None`` here
    too; ``flash_attention_mask`` is the model for ours)."""
    from transformers.modeling_utils import AttentionInterface

    masks, calls = [], []
    real_attention = nkt.neuron_attention_forward
    real_op = nkt._flash_attention

    def attention(module, q, k, v, attention_mask, **kwargs):
        masks.append(attention_mask)
        return real_attention(module, q, k, v, attention_mask, **kwargs)

    def op(q, k, v, causal, scale, **features):
        calls.append((tuple(q.shape), tuple(k.shape), causal, scale, features))
        return real_op(q, k, v, causal, scale, **features)

    monkeypatch.setitem(AttentionInterface._global_mapping, "neuron", attention)
    monkeypatch.setattr(nkt, "_flash_attention", op)
    model = _model(_config("llama")).eval()
    nkt.apply_neuron_kernels(model, rms_norm=False, swiglu=False)
    with torch.no_grad(), cpu_mode("interpret"):
        model(_ids())
    assert masks == [None, None]
    head_dim = 32 // 4
    assert (
        calls
        == [((BATCH, 4, SEQ, head_dim), (BATCH, 2, SEQ, head_dim), True, head_dim**-0.5, {})] * 2
    )
    assert "flash_attention_fwd_kernel" in _launched(kernel_launches)


# -- every family: logits and gradients -----------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_matches_unpatched(family, kernel_launches):
    """Logits and every parameter gradient (cross-entropy on the next token, training mode)
    of the patched model against the unpatched eager one, fp32."""
    want_model = _model(_config(family)).train()
    got_model = copy.deepcopy(want_model)
    swapped = nkt.apply_neuron_kernels(got_model)
    assert any(what.startswith("attention") for what in swapped.values())
    ids = _ids()
    want = want_model(ids, labels=ids)
    want.loss.backward()
    with cpu_mode("interpret"):
        got = got_model(ids, labels=ids)
        got.loss.backward()
    torch.testing.assert_close(got.logits, want.logits, **LOGITS_TOL)
    _assert_grads_close(got_model, want_model)
    launched = _launched(kernel_launches)
    assert "flash_attention_fwd_kernel" in launched
    assert {"rms_norm_fwd_kernel", "rms_norm_bwd_kernel"} <= launched or not any(
        "RMSNorm" in w for w in swapped.values()
    ), launched


@pytest.mark.parametrize(
    "family, without",
    [
        ("mistral", {"sliding_window": None}),
        ("qwen2_sliding", {"sliding_window": SEQ + 1}),
        ("gemma2", {"attn_logit_softcapping": None}),
        ("gemma2", {"sliding_window": SEQ + 1}),
        ("gpt_oss", {"sliding_window": SEQ + 1}),
    ],
)
def test_the_features_matter_at_these_sizes(family, without):
    """The window, softcap (and, below, sinks) change eager's logits by far more than
    LOGITS_TOL, so the comparison above would catch a feature the patch dropped."""
    config = _config(family)
    model = _model(config).eval()
    other = copy.deepcopy(model)
    for key, value in without.items():
        setattr(other.config, key, value)
        for module in other.modules():
            if key == "sliding_window" and getattr(module, "sliding_window", None) is not None:
                module.sliding_window = value
            if key == "attn_logit_softcapping" and hasattr(module, "attn_logit_softcapping"):
                module.attn_logit_softcapping = value
    with torch.no_grad():
        gap = (model(_ids()).logits - other(_ids()).logits).abs().max().item()
    assert gap > 100 * LOGITS_TOL["atol"], gap


def test_gpt_oss_sinks_matter_at_these_sizes():
    model = _model(_config("gpt_oss")).eval()
    other = copy.deepcopy(model)
    for module in other.modules():
        if hasattr(module, "sinks"):
            module.sinks.data.fill_(-1e4)  # exp(-1e4) = 0: no sink
    with torch.no_grad():
        gap = (model(_ids()).logits - other(_ids()).logits).abs().max().item()
    assert gap > 100 * LOGITS_TOL["atol"], gap


# -- the features' translation, on the op's reference mode ---------------------------------


@pytest.mark.parametrize("family", [*sorted(NEEDS_FEATURES), "qwen2_sliding"])
def test_features_translate_to_the_op(family):
    """The window, softcap and sinks each layer passes, given to the op in its reference mode
    (plain torch, fast), reproduce eager's logits: the translation (``sliding_window=W`` ->
    ``window=(W - 1, 0)``, softcap, ``s_aux`` -> sinks) is right (the tests above check the
    kernel on the interpreter). Forward, prefill and decoding past the window with the cache."""
    want_model = _model(_config(family)).eval()
    got_model = copy.deepcopy(want_model)
    nkt.apply_neuron_kernels(got_model)
    ids = _ids()
    with torch.no_grad(), cpu_mode("reference"):
        torch.testing.assert_close(got_model(ids).logits, want_model(ids).logits, **LOGITS_TOL)
        prompt = _ids(batch=1, seq=WINDOW + 2)
        kwargs = dict(
            max_new_tokens=2 * WINDOW, do_sample=False, attention_mask=torch.ones_like(prompt)
        )
        assert torch.equal(
            got_model.generate(prompt, **kwargs), want_model.generate(prompt, **kwargs)
        )


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss"])
def test_feature_flags_reach_the_op_without_a_dense_mask(family, monkeypatch):
    """Sliding and full layers alike get ``attention_mask=None``; each passes the op its own
    flags: Mistral the window on every layer, Gemma 2 the window on its sliding layer (0) and
    the softcap on both, gpt-oss the window on layer 0 and its own ``sinks`` Parameter."""
    from transformers.modeling_utils import AttentionInterface

    masks, calls = [], []
    real_attention = nkt.neuron_attention_forward

    def attention(module, q, k, v, attention_mask, **kwargs):
        masks.append(attention_mask)
        return real_attention(module, q, k, v, attention_mask, **kwargs)

    def op(q, k, v, causal, scale, **features):
        calls.append((causal, features))
        return torch.ops.neuron.flash_attention(q, k, v, causal, scale, **features)

    monkeypatch.setitem(AttentionInterface._global_mapping, "neuron", attention)
    monkeypatch.setattr(nkt, "_flash_attention", op)
    model = _model(_config(family)).eval()
    nkt.apply_neuron_kernels(model)
    with torch.no_grad(), cpu_mode("reference"):
        model(_ids())
    assert masks == [None, None]
    window = {"window": [WINDOW - 1, 0]}
    if family == "mistral":
        assert calls == [(True, window)] * 2
    elif family == "gemma2":
        assert calls == [(True, {**window, "softcap": 2.0}), (True, {"softcap": 2.0})]
    else:
        sinks = [layer.self_attn.sinks for layer in model.model.layers]
        assert [(c, {k: v for k, v in f.items() if k != "sinks"}) for c, f in calls] == [
            (True, window),
            (True, {}),
        ]
        assert len(calls) == len(sinks)
        assert all(f["sinks"] is s for (_, f), s in zip(calls, sinks))  # the Parameters


# -- what apply_neuron_kernels swaps ----------------------------------------------------------

# family -> (RMSNorm modules, casting mode, offset, SwiGLU MLPs swapped, attention features by
# layer). Two layers: input/post-attention norms per layer and the final norm; Qwen3 adds the
# per-head q_norm and k_norm; Gemma 2 pre/post feed-forward norms.
EXPECTED = {
    "llama": (5, "llama", 0.0, 2, ["causal, GQA 4/2"] * 2),
    "mistral": (5, "llama", 0.0, 2, ["causal, GQA 4/2, window (3, 0)"] * 2),
    "qwen2": (5, "llama", 0.0, 2, ["causal, GQA 4/2"] * 2),
    "qwen3": (9, "llama", 0.0, 2, ["causal, GQA 4/2"] * 2),
    "gemma2": (
        9,
        "gemma",
        1.0,
        0,
        ["causal, GQA 4/2, window (3, 0), softcap 2.0", "causal, GQA 4/2, softcap 2.0"],
    ),
    "gpt_oss": (
        5,
        "gemma",
        0.0,
        0,
        ["causal, GQA 4/2, window (3, 0), sinks", "causal, GQA 4/2, sinks"],
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_patching_reports_what_it_swapped(family):
    """The returned dict names every swapped module; RMSNorm modules keep their weight
    Parameter object (so an optimizer built before patching still holds it) and the state
    dict keeps its keys; gpt-oss's MoE MLP and Gemma 2's GeGLU MLP are not swapped."""
    model = _model(_config(family))
    params_before = dict(model.named_parameters())
    keys_before = list(model.state_dict())
    swapped = nkt.apply_neuron_kernels(model)
    norms, casting, offset, mlps, attention = EXPECTED[family]
    norm_names = [n for n, w in swapped.items() if w.startswith("RMSNorm")]
    assert len(norm_names) == norms
    for name in norm_names:
        module = model.get_submodule(name)
        assert isinstance(module, RMSNorm)
        assert (module.casting_mode, module.offset) == (casting, offset)
        assert module.weight is params_before[f"{name}.weight"]
    mlp_names = [n for n, w in swapped.items() if w.startswith("SwiGLU")]
    assert len(mlp_names) == mlps
    assert all(isinstance(model.get_submodule(n), nkt.SwiGLUMLP) for n in mlp_names)
    kept = {n: w for n, w in swapped.items() if w.startswith("kept")}
    assert list(kept) == ([] if mlps else ["model.layers.0.mlp", "model.layers.1.mlp"])
    if family == "gemma2":
        assert set(kept.values()) == {"kept: act_fn GELUTanh is not SiLU"}
    if family == "gpt_oss":
        assert all("mixture of experts" in w for w in kept.values())
    got_attention = [w for w in swapped.values() if w.startswith("attention")]
    assert got_attention == [f"attention: flash_attention ({a})" for a in attention]
    assert model.config._attn_implementation == "neuron"
    assert list(model.state_dict()) == keys_before
    assert dict(model.named_parameters()) == params_before  # the same objects, by identity


# RMSNorm classes and the casting each rounds with (transformers 4.57.6 modeling files).
NORMS = [
    ("llama", "LlamaRMSNorm", "llama", 0.0),
    ("mistral", "MistralRMSNorm", "llama", 0.0),
    ("qwen2", "Qwen2RMSNorm", "llama", 0.0),
    ("qwen3", "Qwen3RMSNorm", "llama", 0.0),
    ("gemma2", "Gemma2RMSNorm", "gemma", 1.0),
    ("gpt_oss", "GptOssRMSNorm", "gemma", 0.0),
]


@pytest.mark.parametrize("family, cls, casting, offset", NORMS)
def test_each_family_norm_rounds_as_the_family_does(family, cls, casting, offset):
    """In bf16 the casting modes differ ("llama" rounds before the weight multiply, "gemma"
    after), so fp32 model tests cannot tell them apart: here the swapped norm's reference
    math (the op's casting-mode roundings) equals the family's own module bit for bit, and the
    other casting mode does not."""
    assert nkt.FAMILIES[family].casting_mode == casting
    assert nkt.FAMILIES[family].offset == offset
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=[cls])
    theirs = getattr(modeling, cls)(64, eps=1e-6)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(64, generator=torch.Generator().manual_seed(3)) * 0.5)
    theirs = theirs.bfloat16()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    ours = nkt._neuron_rms_norm(theirs, nkt.FAMILIES[family])
    other = RMSNorm(
        64, eps=1e-6, casting_mode={"llama": "gemma", "gemma": "llama"}[casting], offset=offset
    )
    other.weight = theirs.weight
    with torch.no_grad(), cpu_mode("reference"):
        want = theirs(x)
        torch.testing.assert_close(ours(x), want, rtol=0, atol=0)
        assert not torch.equal(other(x), want)


def test_unknown_family_is_refused():
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB)
    model = transformers.GPT2LMHeadModel(config)
    with pytest.raises(LimitError) as err:
        nkt.apply_neuron_kernels(model)
    assert err.value.arg == "model.config.model_type"
    assert err.value.value == "'gpt2'"


# -- training -----------------------------------------------------------------------------


def test_llama_training_steps_match(kernel_launches):
    """Two AdamW steps on the patched model (the optimizer built before patching: it holds
    the same Parameters) against the unpatched run."""
    steps, lr = 2, 1e-3
    want_model = _model(_config("llama")).train()
    got_model = copy.deepcopy(want_model)
    start = [p.detach().clone() for p in want_model.parameters()]
    want_opt = torch.optim.AdamW(want_model.parameters(), lr=lr)
    got_opt = torch.optim.AdamW(got_model.parameters(), lr=lr)
    nkt.apply_neuron_kernels(got_model)
    ids = _ids(batch=1, seq=8)
    for _ in range(steps):
        want_loss = want_model(ids, labels=ids).loss
        want_loss.backward()
        want_opt.step()
        want_opt.zero_grad()
        with cpu_mode("interpret"):
            got_loss = got_model(ids, labels=ids).loss
            got_loss.backward()
        got_opt.step()
        got_opt.zero_grad()
        torch.testing.assert_close(got_loss, want_loss, **LOGITS_TOL)
    want_update = torch.cat([(p - s).flatten() for p, s in zip(want_model.parameters(), start)])
    got_update = torch.cat([(p - s).flatten() for p, s in zip(got_model.parameters(), start)])
    gap = (got_update - want_update).norm() / want_update.norm()
    assert gap <= UPDATE_REL_TOL, gap.item()
    assert want_update.norm() > 0
    assert "swiglu_bwd_kernel" in _launched(kernel_launches)


# -- caches: generation ------------------------------------------------------------------------


def test_llama_generate_with_cache_matches_eager():
    """Greedy decoding with the KV cache: one query against the cached keys is the op's
    bottom-right causal alignment (ops' reference math here: the alignment is the test)."""
    want_model = _model(_config("llama")).eval()
    got_model = copy.deepcopy(want_model)
    nkt.apply_neuron_kernels(got_model)
    ids = _ids(batch=1, seq=5)
    kwargs = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids))
    with cpu_mode("reference"):
        got = got_model.generate(ids, **kwargs)
    assert torch.equal(got, want_model.generate(ids, **kwargs))


def test_mistral_generate_past_the_window_matches_eager():
    """Decoding past the window: the sliding cache and the op's window, both bottom-right."""
    want_model = _model(_config("mistral")).eval()
    got_model = copy.deepcopy(want_model)
    nkt.apply_neuron_kernels(got_model)
    ids = _ids(batch=1, seq=WINDOW + 2)
    kwargs = dict(max_new_tokens=2 * WINDOW, do_sample=False, attention_mask=torch.ones_like(ids))
    with cpu_mode("reference"):
        got = got_model.generate(ids, **kwargs)
    assert torch.equal(got, want_model.generate(ids, **kwargs))


# -- what is refused, in one line ----------------------------------------------------------


def _patched_llama(**config_overrides):
    config = _config("llama")
    for key, value in config_overrides.items():
        setattr(config, key, value)
    model = _model(config)
    nkt.apply_neuron_kernels(model)
    return model


def _record_op(monkeypatch):
    """Wrap the integration's one call into the op: a list of (causal, features) per call."""
    calls = []
    real_op = nkt._flash_attention

    def op(q, k, v, causal, scale, **features):
        calls.append((causal, features))
        return real_op(q, k, v, causal, scale, **features)

    monkeypatch.setattr(nkt, "_flash_attention", op)
    return calls


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_padding_mask_reaches_the_op_as_a_key_row_and_matches_eager(family, monkeypatch):
    """A left-padded batch (row 0's first 3 tokens padding): the mask function gives the op
    a bool [B, 1, 1, S] key row (never a dense [B, 1, S, S] mask; Mistral keeps its window
    flag), and the kernels' logits equal eager's at every token that is not padding (a pad
    query sees no key: the op gives 0 there, eager an average of V; padding either way).
    A mask that attends every token reaches the op as no mask at all."""
    want_model = _model(_config(family)).eval()
    model = copy.deepcopy(want_model)
    nkt.apply_neuron_kernels(model)
    calls = _record_op(monkeypatch)
    ids = _ids()
    full = torch.ones_like(ids)
    padded = full.clone()
    padded[0, :3] = 0
    with torch.no_grad(), cpu_mode("interpret"):
        model(ids, attention_mask=full)
        assert all("attn_mask" not in f for _, f in calls)
        calls.clear()
        got = model(ids, attention_mask=padded).logits
    want = want_model(ids, attention_mask=padded).logits
    window = {"window": [WINDOW - 1, 0]} if family == "mistral" else {}
    assert [(c, {k: v for k, v in f.items() if k != "attn_mask"}) for c, f in calls] == [
        (True, window)
    ] * 2
    for _, f in calls:
        assert f["attn_mask"].dtype == torch.bool
        assert torch.equal(f["attn_mask"], padded.bool()[:, None, None, :])
    keep = padded.bool()
    torch.testing.assert_close(got[keep], want[keep], **LOGITS_TOL)


def test_dense_4d_mask_is_refused():
    """A 4D mask with a query dim passed to the model (transformers hands it to every
    layer as is) is refused: the op takes causal and the window from its flags."""
    model = _patched_llama().eval()
    mask = torch.zeros(BATCH, 1, SEQ, SEQ)
    with torch.no_grad(), cpu_mode("reference"), pytest.raises(LimitError) as err:
        model(_ids(), attention_mask=mask)
    assert err.value.arg == "attention_mask"
    assert f"a {(BATCH, 1, SEQ, SEQ)} tensor" in str(err.value)


def test_attention_dropout_in_training_reaches_the_op(monkeypatch):
    """``attention_dropout=0.1``: in training the layers pass the op ``dropout_p=0.1`` (in
    eval none), the dropout changes the logits, and the kernels' training-mode logits and
    gradients equal the op's reference math with the same torch seed (the op draws its
    dropout seed from torch's default generator, so both draw the same keep mask:
    README, attention dropout)."""
    model = _patched_llama(attention_dropout=0.1)
    calls = _record_op(monkeypatch)
    ids = _ids()
    with torch.no_grad(), cpu_mode("reference"):
        plain = model.eval()(ids).logits
    assert [f for _, f in calls] == [{}, {}]
    calls.clear()

    def train_step(mode):
        model.zero_grad()
        torch.manual_seed(7)
        with cpu_mode(mode):
            out = model.train()(ids, labels=ids)
            out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach(), grads

    got, got_grads = train_step("interpret")
    assert [f for _, f in calls] == [{"dropout_p": 0.1}] * 2
    want, want_grads = train_step("reference")
    assert not torch.allclose(got, plain, **LOGITS_TOL)  # dropout was applied
    torch.testing.assert_close(got, want, **LOGITS_TOL)
    assert got_grads.keys() == want_grads.keys()
    for name, want_grad in want_grads.items():
        scale = want_grad.abs().max().item()
        torch.testing.assert_close(
            got_grads[name], want_grad, rtol=GRAD_RTOL, atol=GRAD_ATOL_OF_MAX * scale
        )


def test_position_ids_without_cache_plain_or_packed():
    """``position_ids`` without a cache make transformers check for packed sequences
    (``find_packed_sequence_indices``; ``allow_is_causal_skip=False``): positions
    0..S-1 are plain causal and run; positions restarting inside a row are refused."""
    want_model = _model(_config("llama")).eval()
    model = copy.deepcopy(want_model)
    nkt.apply_neuron_kernels(model)
    ids = _ids()
    plain = torch.arange(SEQ).expand(BATCH, SEQ)
    with torch.no_grad(), cpu_mode("reference"):
        got = model(ids, position_ids=plain, use_cache=False).logits
        want = want_model(ids, position_ids=plain, use_cache=False).logits
        torch.testing.assert_close(got, want, **LOGITS_TOL)
        packed = torch.cat([torch.arange(5), torch.arange(SEQ - 5)]).expand(BATCH, SEQ)
        with pytest.raises(LimitError) as err:
            model(ids, position_ids=packed, use_cache=False)
    assert err.value.arg == "attention pattern"


def test_static_cache_is_refused():
    """A static cache holds keys past the current position (masked by transformers), which a
    bottom-right causal op would attend: refused."""
    model = _patched_llama().eval()
    ids = _ids(batch=1, seq=5)
    with torch.no_grad(), cpu_mode("reference"), pytest.raises(LimitError) as err:
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=2,
            cache_implementation="static",
        )
    assert err.value.arg == "kv_length"
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad(), cpu_mode("reference"), pytest.raises(LimitError) as err:
        model(ids, past_key_values=cache, use_cache=True)
    assert err.value.arg == "kv_length"
    assert "keys [0, 16) for queries ending at 5" in str(err.value)


# -- import without transformers ------------------------------------------------------------

_BLOCK_TRANSFORMERS = """
import sys

class NoTransformers:
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NoTransformers())
import neuron_kernels.integrations.transformers
"""


def test_import_without_transformers_says_which_extra():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", _BLOCK_TRANSFORMERS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        "ImportError: neuron_kernels.integrations.transformers needs Hugging Face "
        "transformers: pip install neuron-kernels[transformers]"
    )
    assert "During handling" not in done.stderr  # one error, not a chain
