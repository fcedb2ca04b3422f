"""Reference-free gradient identities of attention.

They hold for any dropout mask as long as backward used forward's mask, for any mask or ALiBi
bias, and at sequence lengths where no fp64 reference fits:

* ``dv_v``:   <dV, V> = <dO, O>      out is linear in V
* ``dq_q``:   <dQ, Q> = <dK, K>      scores are bilinear in Q and K (both equal sum dS * S)
* ``dk_sum``: sum over keys of dK = 0 per head, because softmax ignores a shift added to all
  keys' scores (rows of dS sum to zero). Not with softcap, whose tanh breaks the shift.

Each is evaluated per (batch, kv head) and the worst group is reported. Normalisation makes the
value read like a relative error: rounding noise of size eps in the tensors gives ~eps, while a
backward with the wrong mask or a scaled dQ gives a large fraction. For the inner products, an
error vector of relative size eps in random directions moves <a, b> by about
eps * |a| |b| / sqrt(n), so residuals are divided by |a| |b| / sqrt(n) summed over both sides;
for ``dk_sum`` the norm of the sum of Sk per-key errors is about the Frobenius norm of the
error itself, so it is divided by |dK|_F.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def _grouped(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, H, S, D) -> (B, Hkv, H/Hkv * S * D) in fp64: everything one kv head touches."""
    b, h = x.shape[:2]
    return x.to(F64).reshape(b, heads_kv, -1)


def _inner_residual(a1, b1, a2, b2) -> torch.Tensor:
    """|<a1, b1> - <a2, b2>| / (|a1||b1|/sqrt(n1) + |a2||b2|/sqrt(n2)) per group."""
    lhs = (a1 * b1).sum(-1)
    rhs = (a2 * b2).sum(-1)
    scale = (a1.norm(dim=-1) * b1.norm(dim=-1) / math.sqrt(a1.shape[-1])
             + a2.norm(dim=-1) * b2.norm(dim=-1) / math.sqrt(a2.shape[-1]))
    return (lhs - rhs).abs() / scale.clamp_min(1e-300)


def identity_residuals(q, k, v, out, dout, dq, dk, dv, softcap: float = 0.0) -> dict[str, float]:
    """Worst-group residual of each identity (see module docstring). NaN if inputs are not
    finite (the caller reports NaN/Inf separately)."""
    heads_kv = k.shape[1]
    g = {name: _grouped(t, heads_kv) for name, t in
         dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv).items()}
    result = {
        "dv_v": _inner_residual(g["dv"], g["v"], g["dout"], g["out"]).max().item(),
        "dq_q": _inner_residual(g["dq"], g["q"], g["dk"], g["k"]).max().item(),
    }
    if not softcap:
        dk64 = dk.to(F64)
        key_sum = dk64.sum(dim=2)  # (B, Hkv, D)
        result["dk_sum"] = (key_sum.norm(dim=-1)
                            / dk64.flatten(2).norm(dim=-1).clamp_min(1e-300)).max().item()
    return result
