"""What ``attnbench backends`` says of each backend: ready, ready for forward cases only, or
unavailable -- and the whole reason, never cut mid-word.

A backend that refuses a plain bf16 case only because it has no backward here (FlexAttention on a
CPU: torch.compile compiles inference only) still runs every forward case, so it is "ready,
forward only", not "unavailable": that is what a sweep with ``backward: false`` gets from it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

READY, FORWARD_ONLY, UNAVAILABLE = "ready", "ready, forward only", "unavailable"
REASON_LIMIT = 600
"""Characters of a reason shown (a whole sentence or two; a traceback's first line is shorter)."""


@dataclass(frozen=True)
class Readiness:
    name: str
    state: str
    reason: str = ""

    def lines(self, width: int = 100, name_width: int = 20) -> list[str]:
        """``  name  state: reason``, the reason wrapped at word boundaries under the state."""
        head = f"  {self.name:<{name_width}} "
        text = self.state + (f": {self.reason}" if self.reason else "")
        return textwrap.wrap(text, width=max(40, width), initial_indent=head,
                             subsequent_indent=" " * len(head), break_long_words=False,
                             break_on_hyphens=False) or [head.rstrip()]


def backend_readiness(name: str, device) -> Readiness:
    """Probe ``name`` with a plain bf16 case on ``device``; when that is refused, with the same
    case forward only. Nothing runs: the backend's own ``supports`` answers."""
    from attnbench.backends import get_backend
    from attnbench.sweep.case import make_case

    try:
        backend = get_backend(name)
        full = backend.supports(make_case("backends", {"backend": name, "dtype": "bf16"}),
                                device)
        if full is None:
            return Readiness(name, READY)
        forward = backend.supports(make_case("backends", {"backend": name, "dtype": "bf16",
                                                          "backward": False}), device)
    except Exception as exc:  # an import or probe error is the reason, stated in full
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Readiness(name, UNAVAILABLE, _bounded(f"{type(exc).__name__}: {first}"
                                                     if first else type(exc).__name__))
    if forward is None:
        return Readiness(name, FORWARD_ONLY, _bounded(full))
    return Readiness(name, UNAVAILABLE, _bounded(full))


def prepare_interpreter() -> None:
    """Set up the Triton kernels before any backend imports triton (FlexAttention's compiler
    does): without a GPU they need TRITON_INTERPRET=1 set first, as every worker does. Without
    this, ``backends`` called triton unavailable on a CPU where its cases run."""
    try:
        import attnbench.kernels  # noqa: F401  (sets TRITON_INTERPRET=1 when no GPU is visible)
    except Exception:  # the triton backend's own probe reports it
        pass


def _bounded(reason: str) -> str:
    reason = " ".join(str(reason).split())
    if len(reason) <= REASON_LIMIT:
        return reason
    return textwrap.shorten(reason, width=REASON_LIMIT, placeholder=" ...")
