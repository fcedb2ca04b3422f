"""The small protocol every attention implementation is measured through.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D / Dv = head dims.
q: (B, Hq, Sq, D), k: (B, Hkv, Sk, D), v: (B, Hkv, Sk, Dv), out and dout: (B, Hq, Sq, Dv),
all in the case's dtype on the case's device. Semantics (masks, ALiBi, softcap, dropout, GQA
head mapping, alignment) are fixed by :mod:`attnbench.problem.attn_spec`.

A backend::

    class MyBackend:
        name = "mine"
        keep_mask = None            # or a KeepMaskFn rebuilding the exact dropout mask it used

        def supports(self, case, device) -> str | None: ...   # None, or why it cannot run
        def forward(self, q, k, v, spec) -> Forward: ...
        def backward(self, ctx, dout) -> tuple[dq, dk, dv]: ...

``backward`` must use the dropout mask of the ``forward`` that made ``ctx`` and may be called
several times on one ``ctx`` (the timer does). What ``forward`` derives from the case (masks,
bias, tables) should be built once per case, not per call (:mod:`attnbench.backends.masks`):
every call is timed. A backend that finds at run time that it cannot handle a case raises
:class:`Unsupported`.

Dropout: the harness owns the seed. A backend that hides its mask (``keep_mask = None``) may
draw it from the device's generator (torch's RNG, as flash-attn and SDPA do) or from
``spec.dropout_seed`` and the spec's global offsets (as a kernel that takes a seed argument
does); both are judged fairly. Calls the harness means as independent draws (the dropout
statistics' repeats) differ in both the generator's state and ``dropout_seed``; calls that must
replay a forward's mask (probes, backward, CP/TP steps) repeat both. So a seeded mask must
follow ``dropout_seed`` (the same seed, the same mask; another seed, another mask), and under
CP/TP the harness recovers it from a single-device call with the same seed
(:mod:`attnbench.accuracy.dropout_probe`).

Everything else a backend may declare -- ``keep_mask`` above, packed, packed CP chunks, paged
KV, fp8, input precision, determinism, ``backward_from_stats`` for ring CP, its own CP/TP split --
is a plain attribute or method, listed and documented once, with what declaring it means and who
reads it, in :class:`attnbench.backends.capabilities.Capabilities`; whether a backend can run a
case at all is decided by :func:`attnbench.backends.capabilities.refusal`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from attnbench.problem.attn_spec import AttnSpec, KeepMaskFn
    from attnbench.sweep.case import Case


class Unsupported(Exception):
    """Raised by a backend for a case it cannot run; the case is recorded as ``unsupported``."""


@dataclass
class Forward:
    out: "torch.Tensor"
    """(B, Hq, Sq, Dv) in the input dtype."""
    lse: Optional["torch.Tensor"]
    """(B, Hq, Sq) float32 natural-log log-sum-exp of the final (scaled, capped, biased, masked)
    scores, -inf for rows that see no key; None if the backend does not expose it."""
    ctx: Any
    """Whatever backward needs."""


@runtime_checkable
class Backend(Protocol):
    name: str
    keep_mask: Optional["KeepMaskFn"]

    def supports(self, case: "Case", device: "torch.device") -> Optional[str]: ...

    def forward(self, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor",
                spec: "AttnSpec") -> Forward: ...

    def backward(self, ctx: Any, dout: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor",
                                                                 "torch.Tensor"]: ...




# -- what a backend may tell the harness -----------------------------------------------------

_compile_listeners: list[Callable[[bool], None]] = []


@contextmanager
def compiling() -> Iterator[None]:
    """Around a backend's own compile (``torch.compile``'s first call of a new shape): the case's
    ``timeout_s`` stops counting meanwhile -- a rank process tells its pool
    (:mod:`attnbench.execution.child`), which gives the compile up to its own limit
    (:data:`attnbench.execution.call_clock.COMPILE_GRACE_S`). Outside a rank process: nothing."""
    for listener in list(_compile_listeners):
        listener(True)
    try:
        yield
    finally:
        for listener in list(_compile_listeners):
            listener(False)


def on_compile(listener: Callable[[bool], None]) -> None:
    """Call ``listener(True)`` when a backend starts compiling, ``listener(False)`` when it
    stops (the rank process registers one)."""
    if listener not in _compile_listeners:
        _compile_listeners.append(listener)
