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
from typing import Optional, Sequence

import torch

F64 = torch.float64


def _grouped(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """(B, H, S, D) -> (B, Hkv, H/Hkv * S * D) in fp64: everything one kv head touches."""
    b, h = x.shape[:2]
    return x.to(F64).reshape(b, heads_kv, -1)


def _inner_scale(a1, b1, a2, b2) -> torch.Tensor:
    """|a1||b1|/sqrt(n1) + |a2||b2|/sqrt(n2) per group: the size of rounding noise in
    <a1, b1> - <a2, b2>."""
    return (a1.norm(dim=-1) * b1.norm(dim=-1) / math.sqrt(a1.shape[-1])
            + a2.norm(dim=-1) * b2.norm(dim=-1) / math.sqrt(a2.shape[-1]))


def identity_residuals(q, k, v, out, dout, dq, dk, dv, softcap: float = 0.0,
                       cu_seqlens_q: Sequence[int] = (), cu_seqlens_kv: Sequence[int] = ()
                       ) -> dict[str, float]:
    """Worst-group residual of each identity (see module docstring). NaN if inputs are not
    finite (the caller reports NaN/Inf separately).

    A packed call (``cu_seqlens_*``, tensors (1, H, T, D)): every identity holds for each
    sequence alone (its output depends on its own keys only), so each is checked per sequence,
    against the noise scale of the whole pack (a one-token document's dK is rounding noise
    only). Checked per sequence they see attention across documents without a reference."""
    if not cu_seqlens_q:
        return _residuals(q, k, v, out, dout, dq, dk, dv, softcap)
    worst: dict[str, float] = {}
    scale = _scales(q, k, v, out, dout, dq, dk, dv)
    for b in range(len(cu_seqlens_q) - 1):
        rows = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        keys = slice(cu_seqlens_kv[b], cu_seqlens_kv[b + 1])
        part = _residuals(q[:, :, rows], k[:, :, keys], v[:, :, keys], out[:, :, rows],
                          dout[:, :, rows], dq[:, :, rows], dk[:, :, keys], dv[:, :, keys],
                          softcap, scale)
        for name, value in part.items():
            worst[name] = max(worst.get(name, 0.0), value) if value == value else value
    return worst


def _scales(q, k, v, out, dout, dq, dk, dv) -> dict[str, torch.Tensor]:
    """Per-group noise scales of the three identities over the whole call."""
    heads_kv = k.shape[1]
    g = {name: _grouped(t, heads_kv) for name, t in
         dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv).items()}
    return {"dv_v": _inner_scale(g["dv"], g["v"], g["dout"], g["out"]),
            "dq_q": _inner_scale(g["dq"], g["q"], g["dk"], g["k"]),
            "dk_sum": dk.to(F64).flatten(2).norm(dim=-1)}


def _residuals(q, k, v, out, dout, dq, dk, dv, softcap: float,
               scale: Optional[dict[str, torch.Tensor]] = None) -> dict[str, float]:
    heads_kv = k.shape[1]
    g = {name: _grouped(t, heads_kv) for name, t in
         dict(q=q, k=k, v=v, out=out, dout=dout, dq=dq, dk=dk, dv=dv).items()}
    scale = scale or _scales(q, k, v, out, dout, dq, dk, dv)

    def inner(a1, b1, a2, b2, name):
        gap = ((a1 * b1).sum(-1) - (a2 * b2).sum(-1)).abs()
        return (gap / scale[name].clamp_min(1e-300)).max().item()

    result = {"dv_v": inner(g["dv"], g["v"], g["dout"], g["out"], "dv_v"),
              "dq_q": inner(g["dq"], g["q"], g["dk"], g["k"], "dq_q")}
    if not softcap:
        key_sum = dk.to(F64).sum(dim=2)  # (B, Hkv, D)
        result["dk_sum"] = (key_sum.norm(dim=-1)
                            / scale["dk_sum"].clamp_min(1e-300)).max().item()
    return result
