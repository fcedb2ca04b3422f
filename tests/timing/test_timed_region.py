"""Only the kernel is timed: what a backend derives from the case (masks, ALiBi bias, slopes,
dropout keep-masks) is built before timing, never inside the timed calls -- for every built-in
backend. Third-party adapters run here against stand-in modules that record how they are
called (the packages need a GPU)."""

import sys
import types

import pytest
import torch

from attnbench.accuracy.evaluate import timed_only
from attnbench.backends import Unsupported, get_backend, masks
from attnbench.execution.case_runner import run_case
from attnbench.problem import dropout as dropout_mod
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

FEATURES = [
    {"mask": "causal", "bias": "alibi"},
    {"mask": "causal", "seqlen_kv": 48},                         # bottom-right, Sq != Sk
    {"mask": "window", "window_left": 7, "window_right": 0, "dropout": 0.1},
    {"dropout": 0.2, "heads_kv": 1},
]


class Counter:
    """Counts every call of the mask builders while installed."""

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        self.monkeypatch = monkeypatch

    def wrap(self, owner, name):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls.append(name)
            return original(*args, **kwargs)

        self.monkeypatch.setattr(owner, name, counted)

    def install(self):
        from attnbench.backends import adapters, naive, sdpa

        self.wrap(AttnSpec, "visible")
        self.wrap(AttnSpec, "alibi_bias")
        for module in (masks, naive, sdpa, adapters):  # wherever the builder is called from
            self.wrap(module, "dense_masks")
        self.wrap(dropout_mod, "uniform01")  # every hash keep-mask is drawn through it
        return self


def _case(backend, **fields):
    base = dict(backend=backend, seqlen_q=32, heads_q=4, heads_kv=2, head_dim=16, dtype="fp32")
    return make_case("t", {**base, **fields})


@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("backend", ["naive", "sdpa", "sdpa_math", "sdpa_flash", "triton",
                                     "mutant.base"])
def test_timed_calls_build_no_masks(backend, feature, monkeypatch):
    case = _case(backend, **feature)
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    impl = get_backend(backend)
    try:
        fwd = impl.forward(q, k, v, spec)  # the accuracy run (or the warm-up) prepares
    except Unsupported as exc:  # PyTorch's CPU flash kernel: no explicit mask, no dropout
        pytest.skip(str(exc))
    impl.backward(fwd.ctx, dout)
    counter = Counter(monkeypatch).install()
    for _ in range(2):  # what the timer calls, over and over
        again = impl.forward(q, k, v, spec)
        impl.backward(again.ctx, dout)
    assert counter.calls == [], f"{backend} rebuilt {counter.calls} inside timed calls"


def test_the_counter_sees_masks_built_inside_a_timed_call(monkeypatch):
    """The check's own mutant: naive without its cache, as the old sdpa was (dense_masks inside
    forward), must be seen."""
    from attnbench.backends.naive import NaiveBackend

    class Unprepared(NaiveBackend):
        def masks(self, spec, q, k):
            return self.build_masks(spec, q, k)

    case = _case("naive", mask="causal", bias="alibi", dropout=0.1)
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    impl = Unprepared()
    impl.forward(q, k, v, spec)
    counter = Counter(monkeypatch).install()
    impl.forward(q, k, v, spec)
    assert {"dense_masks", "visible", "alibi_bias", "uniform01"} <= set(counter.calls)


def test_the_reference_is_exempt_because_its_masks_are_its_computation():
    """The fp64 reference is the specification: it evaluates masks block by block as part of
    the math (O(S·D) memory, no S x S tensor). Documented here so the exemption is visible."""
    ref = get_backend("reference")
    assert not hasattr(ref, "prepared")


def test_prepared_masks_are_released_when_the_case_ends():
    case = _case("naive", mask="causal", bias="alibi")
    run_case(case, RunOptions(timing=TimingOptions(enabled=False)))
    assert len(get_backend("naive").prepared) == 0


def test_sdpa_keeps_its_fused_kernels_for_bottom_right_causal():
    from torch.nn.attention.bias import CausalBias

    from attnbench.backends.sdpa import attention_mask

    case = _case("sdpa", mask="causal", seqlen_q=16, seqlen_kv=48)
    q, k, _, _ = make_inputs(case)
    mask, is_causal = attention_mask(AttnSpec.from_case(case), q, k)
    assert isinstance(mask, CausalBias) and not is_causal
    square = _case("sdpa", mask="causal")
    q, k, _, _ = make_inputs(square)
    assert attention_mask(AttnSpec.from_case(square), q, k) == (None, True)


def test_sdpa_never_builds_a_dropout_keep_mask(monkeypatch):
    case = _case("sdpa", dropout=0.3, mask="window", window_left=5, window_right=0)
    counter = Counter(monkeypatch).install()
    record = run_case(case, RunOptions(timing=TimingOptions(warmup_ms=0, max_seconds=0.01)))
    assert record["verdict"] == "pass", record["reason"]
    # The identities judge sdpa (its mask is hidden); the keep-masks drawn here are naive's,
    # the baseline's, never sdpa's own calls (which build only a visibility mask, once).
    assert counter.calls.count("dense_masks") <= 3


def test_packed_sdpa_builds_its_offsets_once_and_passes_the_lengths(monkeypatch):
    """Packed sdpa copied ``cu_seqlens`` from the host in every timed call, and its jagged
    tensors knew no lengths, so SDPA read them back with ``.item()`` (a device sync) on a GPU.
    Now: the offsets are built once per case (no ``torch.tensor`` in later calls; mutant: build
    them in the call -> 3 per call) and every jagged tensor gets its side's shortest and longest
    sequence (mutant: drop them -> None), K and V sharing one offsets tensor."""
    case = _case("sdpa", seqlens_q=[37, 1, 70], batch=3, seqlen_q=108, heads_kv=4)
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    backend = get_backend("sdpa")
    backend.prepared.clear()
    seen, made = [], []
    jagged = torch.nested.nested_tensor_from_jagged

    def recording(values, offsets=None, *args, min_seqlen=None, max_seqlen=None, **kwargs):
        seen.append((offsets, min_seqlen, max_seqlen))
        return jagged(values, offsets, *args, min_seqlen=min_seqlen, max_seqlen=max_seqlen,
                      **kwargs)

    monkeypatch.setattr(torch.nested, "nested_tensor_from_jagged", recording)
    first = backend.forward(q, k, v, spec)
    backend.backward(first.ctx, dout)
    counting = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **kw: made.append(a) or counting(*a, **kw))
    again = backend.forward(q, k, v, spec)  # a timed call
    backend.backward(again.ctx, dout)
    assert made == []
    assert [(lo, hi) for _, lo, hi in seen] == [(1, 70)] * 6
    offsets = [o for o, _, _ in seen]
    assert offsets[:3] == offsets[3:] and offsets[0] is offsets[1] is offsets[2]
    assert offsets[0].tolist() == [0, 37, 38, 108] and offsets[0].dtype == torch.int64
    assert torch.allclose(first.out, again.out)


# -- third-party adapters against stand-ins -------------------------------------------------------


@pytest.fixture
def fake_flash_attn(monkeypatch):
    calls = []

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        return_attn_probs=False, **_):
        calls.append({"dropout_p": dropout_p, "return_attn_probs": return_attn_probs,
                      "alibi_slopes": alibi_slopes})
        out = torch.zeros_like(q) + 0 * q
        if return_attn_probs:
            lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
            return out, lse, None
        return out

    module = types.ModuleType("flash_attn")
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    return calls


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_flash_attn_never_returns_probabilities_with_dropout(fake_flash_attn, dropout):
    from attnbench.backends.adapters import FlashAttnBackend

    case = _case("flash_attn", dropout=dropout, bias="alibi", dtype="bf16")
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    backend = FlashAttnBackend()
    first = backend.forward(q, k, v, spec)
    backend.forward(q, k, v, spec)
    assert [c["return_attn_probs"] for c in fake_flash_attn] == [dropout == 0] * 2
    assert (first.lse is None) == (dropout > 0)
    # the slopes tensor is built once and handed to every call
    assert fake_flash_attn[0]["alibi_slopes"] is fake_flash_attn[1]["alibi_slopes"]


def test_xformers_bias_is_built_once(monkeypatch):
    built = []

    class LowerTriangularFromBottomRightMask:
        pass

    def memory_efficient_attention(q, k, v, attn_bias=None, p=0.0, scale=None):
        built.append(attn_bias)
        return torch.zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1]) + 0 * q.sum()

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = memory_efficient_attention
    ops.fmha = types.SimpleNamespace(attn_bias=types.SimpleNamespace(
        LowerTriangularFromBottomRightMask=LowerTriangularFromBottomRightMask))
    xformers = types.ModuleType("xformers")
    xformers.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", xformers)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    from attnbench.backends.adapters import XformersBackend

    backend = XformersBackend()
    for fields, kind in (({"bias": "alibi", "mask": "causal"}, torch.Tensor),
                         ({"mask": "causal", "seqlen_kv": 48}, LowerTriangularFromBottomRightMask)):
        built.clear()
        case = _case("xformers", **fields)
        spec = AttnSpec.from_case(case)
        q, k, v, _ = make_inputs(case)
        backend.forward(q, k, v, spec)
        counter = Counter(monkeypatch).install()
        backend.forward(q, k, v, spec)
        monkeypatch.undo()
        monkeypatch.setitem(sys.modules, "xformers", xformers)
        monkeypatch.setitem(sys.modules, "xformers.ops", ops)
        assert counter.calls == [] and isinstance(built[0], kind) and built[0] is built[1]


# -- the `timed` verdict: accuracy off is never a pass, and NaN still fails ------------------------


def test_accuracy_off_gives_timed_not_pass():
    case = _case("naive", mask="causal")
    record = run_case(case, RunOptions(accuracy=False,
                                       timing=TimingOptions(warmup_ms=0, max_seconds=0.01)))
    assert record["verdict"] == "timed"
    assert record["timing"]["fwd"]["median_ms"] > 0
    assert {c["check"] for c in record["checks"]} == {"nonfinite"}


def test_timed_case_with_nan_output_fails():
    out = torch.ones(1, 2, 4, 8)
    grads = [torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8)]
    assert timed_only(out, grads).verdict == "timed"
    grads[0][0, 0, 0, 0] = float("nan")
    judgement = timed_only(out, grads)
    assert judgement.verdict == "fail" and "dq has 1 NaN/Inf" in judgement.reason


def test_timed_verdict_through_the_harness_with_a_nan_backend():
    record = run_case(_case("buggy_backends:NanGrad", seqlen_q=113),
                      RunOptions(accuracy=False, timing=TimingOptions(enabled=False)))
    assert record["verdict"] == "fail" and "NaN/Inf" in record["reason"]


def test_sdpa_causal_lower_right_then_triton_in_one_rank_process():
    """PyTorch imports triton on its own (torch.nn.attention.bias, for causal_lower_right):
    without a GPU the rank must still choose the interpreter first, or every triton case after
    an sdpa one fails to load (and a CP case with it hangs on the other rank)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    code = ("from attnbench.execution.case_runner import run_case\n"
            "from attnbench.sweep.case import make_case\n"
            "from attnbench.sweep.options import RunOptions, TimingOptions\n"
            "o = RunOptions(timing=TimingOptions(enabled=False))\n"
            "for f in [dict(backend='sdpa', mask='causal', seqlen_q=16, seqlen_kv=48),\n"
            "          dict(backend='triton', seqlen_q=16)]:\n"
            "    r = run_case(make_case('t', dict(heads_q=2, head_dim=16, **f)), o)\n"
            "    assert r['verdict'] == 'pass', r['reason']\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
