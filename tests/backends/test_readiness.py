"""``attnbench backends``' verdict per backend: ready, ready forward only, or unavailable, with
the whole reason wrapped at word boundaries (it was cut at 100 characters, mid-word)."""

from __future__ import annotations

import torch

from attnbench.backends.readiness import (FORWARD_ONLY, READY, REASON_LIMIT, UNAVAILABLE,
                                          Readiness, backend_readiness)

CPU = torch.device("cpu")


class _Probe:
    """A backend whose answer depends only on whether the case has a backward."""

    def __init__(self, full, forward):
        self.full, self.forward = full, forward

    def supports(self, case, device):
        return self.full if case.backward else self.forward


def _with(monkeypatch, backend):
    import attnbench.backends as backends

    def get_backend(name):
        if isinstance(backend, Exception):
            raise backend
        return backend
    monkeypatch.setattr(backends, "get_backend", get_backend)


def test_forward_only_backend_is_ready_forward_only(monkeypatch):
    _with(monkeypatch, _Probe("no backward on this device", None))
    got = backend_readiness("naive", CPU)
    assert (got.state, got.reason) == (FORWARD_ONLY, "no backward on this device")


def test_a_backend_refusing_both_is_unavailable_with_the_full_case_reason(monkeypatch):
    _with(monkeypatch, _Probe("needs CUDA", "needs CUDA"))
    assert backend_readiness("naive", CPU) == Readiness("naive", UNAVAILABLE, "needs CUDA")
    _with(monkeypatch, _Probe(None, None))
    assert backend_readiness("naive", CPU).state == READY


def test_an_import_error_is_stated_in_full_not_cut_mid_word(monkeypatch):
    text = ("attnbench.kernels: no GPU, so the Triton kernels must run under TRITON_INTERPRET=1, "
            "but triton was imported before that was set (its library functions are compiled-mode)")
    _with(monkeypatch, ImportError(text + "\nsecond line"))
    got = backend_readiness("triton", CPU)
    assert got.state == UNAVAILABLE and got.reason == f"ImportError: {text}"
    lines = got.lines(width=80)
    assert all(len(line) <= 80 for line in lines) and len(lines) > 1
    assert " ".join(" ".join(line.split()) for line in lines).endswith("compiled-mode)")
    # every word survives the wrapping whole
    assert " ".join(lines).split()[-3:] == ["functions", "are", "compiled-mode)"]


def test_a_huge_reason_is_bounded_at_a_word():
    from attnbench.backends.readiness import _bounded

    reason = _bounded("word " * 1000)
    assert len(reason) <= REASON_LIMIT and reason.endswith("word ...")


def test_a_triton_older_than_the_kernels_need_is_named_not_a_type_error():
    # triton 3.1 (PyPI torch 2.5's pin) failed at import: jit() got an unexpected keyword
    # argument 'do_not_specialize_on_alignment' (tried: /tmp/tri-t/3.1.0, issue 40 item 8)
    from attnbench.backends.triton_entry import TritonUnavailable, triton_too_old

    reason = triton_too_old("3.1.0")
    assert reason and "triton 3.1.0 is older than 3.2" in reason
    assert triton_too_old("3.2.0") is None and triton_too_old("3.9.0+git1") is None
    assert TritonUnavailable(reason).supports(None, CPU) == reason
