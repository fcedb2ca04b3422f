"""The backend contract, checked before anything is judged: what a backend returned has the
dtype and shapes the case asks for (docs/backends.md, "The protocol").

A breach is the backend's ``error`` (:class:`~attnbench.errors.ContractBreach`, a
:class:`~attnbench.errors.BackendError`), not a failing check and not a harness error: a tensor
of the wrong shape has no error against the reference to measure (judging it raised deep in our
bound code, which read as our bug), and an fp32 output for a bf16 case would be held to the bf16
bounds it was never rounded to (it passed). The case broke the protocol, as an exception raised
in the backend does; the reason is one line naming the tensor and what was expected.

Strides are not restricted: a non-contiguous tensor of the right shape is legal.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from attnbench.errors import ContractBreach
from attnbench.problem.fp8 import output_dtype


def _shape(x: Any) -> str:
    return str(tuple(x.shape))


def _is_tensor(name: str, x: Any, call: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ContractBreach(f"{call}{name} is a {type(x).__name__}; expected a torch.Tensor")


def expected_out_dtype(case) -> torch.dtype:
    """The output's dtype: the case's own, an fp8 case's declared output dtype (bf16)."""
    return output_dtype(case.dtype)


def check_forward(case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: Any,
                  lse: Any, *, call: str = "") -> None:
    """``out``: the output dtype of the case, ``q``'s layout with ``v``'s head dim --
    (B, Hq, Sq, Dv), or a packed buffer's (1, Hq, T, Dv); ``lse`` (when returned): a
    floating tensor of ``q``'s shape without the head dim. ``call``: where this call sits in a
    split run (``"CP rank 1: "``), prefixed to the reason."""
    _is_tensor("out", out, call)
    want = (*q.shape[:-1], v.shape[-1])
    if tuple(out.shape) != want:
        raise ContractBreach(f"{call}out has shape {_shape(out)}; expected {want} (q's shape "
                             f"with v's head dim {v.shape[-1]})")
    dtype = expected_out_dtype(case)
    if out.dtype != dtype:
        raise ContractBreach(f"{call}out has dtype {_name(out.dtype)}; expected {_name(dtype)} "
                             f"(the output dtype of {case.dtype} cases)")
    if lse is None:
        return
    _is_tensor("lse", lse, call)
    if tuple(lse.shape) != tuple(q.shape[:-1]):
        raise ContractBreach(f"{call}lse has shape {_shape(lse)}; expected "
                             f"{tuple(q.shape[:-1])} (q's shape without its head dim)")
    if not lse.dtype.is_floating_point:
        raise ContractBreach(f"{call}lse has dtype {_name(lse.dtype)}; expected a floating "
                             "dtype (float32)")


def check_backward(q: Any, k: Any, v: Any, grads: Any, *, call: str = "") -> None:
    """``grads`` = (dq, dk, dv) with the shapes of q, k and v: dK/dV carry the K/V head count,
    not the query's."""
    if not isinstance(grads, Sequence) or len(grads) != 3:
        got = f"{len(grads)} values" if isinstance(grads, Sequence) else type(grads).__name__
        raise ContractBreach(f"{call}backward returned {got}; expected (dq, dk, dv)")
    for name, grad, of in zip(("dq", "dk", "dv"), grads, (("q", q), ("k", k), ("v", v))):
        _is_tensor(name, grad, call)
        source, tensor = of
        if tuple(grad.shape) != tuple(tensor.shape):
            raise ContractBreach(f"{call}{name} has shape {_shape(grad)}; expected "
                                 f"{_shape(tensor)} ({source}'s shape)")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

