"""Deliberately wrong backends for the harness's own tests (each is a plausible bug)."""

from attnbench.backends.base import Forward
from attnbench.backends.naive import NaiveBackend


class ScaledDq(NaiveBackend):
    """dQ off by 5% while out, dK and dV are right (a stale or wrong softmax scale in dQ)."""

    name = "scaled_dq"
    factor = 1.05

    def backward(self, ctx, dout):
        dq, dk, dv = super().backward(ctx, dout)
        return dq * self.factor, dk, dv


class HiddenMask(NaiveBackend):
    """A correct backend whose dropout mask is not exposed and cannot be replayed: every forward
    draws a new one from a counter of its own (not from torch's generator), so probing cannot
    recover it and the dropout statistics and the identities decide."""

    name = "hidden_mask"
    keep_mask = None
    calls = 0

    def forward(self, q, k, v, spec):
        HiddenMask.calls += 1
        return super().forward(q, k, v, spec.replace(dropout_seed=spec.dropout_seed
                                                      + 7919 * HiddenMask.calls))


class FreshMaskBackward(HiddenMask):
    """Backward recomputes attention with a fresh dropout mask instead of replaying forward's
    (seed bug 1's class). The mask is hidden, so only the identities can tell."""

    name = "fresh_mask_backward"

    def forward(self, q, k, v, spec):
        fwd = NaiveBackend.forward(self, q, k, v, spec)
        return Forward(out=fwd.out, lse=fwd.lse, ctx=(q, k, v, spec))

    def backward(self, ctx, dout):
        q, k, v, spec = ctx
        redo = NaiveBackend.forward(self, q, k, v,
                                    spec.replace(dropout_seed=spec.dropout_seed + 1))
        return super().backward(redo.ctx, dout)


class StaleStatsBackward(HiddenMask):
    """Explicit backward whose softmax statistic D = rowsum(dO * O) uses the output *before*
    dropout (a stale statistic): right without dropout, wrong with it. MHA, no masks."""

    name = "stale_stats"

    def forward(self, q, k, v, spec):
        fwd = NaiveBackend.forward(self, q, k, v, spec)  # the spec's own mask: backward rebuilds it
        return Forward(out=fwd.out, lse=fwd.lse, ctx=(q, k, v, spec))

    def backward(self, ctx, dout):
        import torch

        from attnbench.backends.masks import dense_masks

        q, k, v, spec = ctx
        qf, kf, vf, dof = (t.float() for t in (q, k, v, dout))
        probs = torch.softmax(qf @ kf.transpose(-1, -2) * spec.scale, dim=-1)
        _, _, keep = dense_masks(spec, q.shape[0], q.shape[1], q.shape[2], k.shape[2],
                                 torch.float32, q.device)
        drop = keep.float() / (1 - spec.dropout_p) if keep is not None else 1.0
        stale_out = probs @ vf                      # bug: should be (probs * drop) @ v
        delta = (dof * stale_out).sum(-1, keepdim=True)
        dv = (probs * drop).transpose(-1, -2) @ dof
        dp = (dof @ vf.transpose(-1, -2)) * drop
        ds = probs * (dp - delta) * spec.scale
        return (ds @ kf).to(q.dtype), (ds.transpose(-1, -2) @ qf).to(k.dtype), dv.to(v.dtype)


class TopLeftCausal(NaiveBackend):
    """Causal mask aligned top-left where bottom-right is the convention (Sq != Sk)."""

    name = "top_left_causal"

    def forward(self, q, k, v, spec):
        if spec.is_causal and q.shape[2] != k.shape[2]:
            shift = spec.seqlen_q_total - spec.seqlen_kv_total
            spec = spec.replace(window_right=shift)
        return super().forward(q, k, v, spec)


class ScaledDqHidden(HiddenMask):
    """ScaledDq with a dropout mask that is hidden and cannot be replayed: only the identities
    can see the bad dQ."""

    name = "scaled_dq_hidden"

    def backward(self, ctx, dout):
        dq, dk, dv = super().backward(ctx, dout)
        return dq * ScaledDq.factor, dk, dv


class NanGrad(NaiveBackend):
    """NaN in dK when the length is not a multiple of 64 (an unmasked tail block)."""

    name = "nan_grad"

    def backward(self, ctx, dout):
        dq, dk, dv = super().backward(ctx, dout)
        if dk.shape[2] % 64:
            dk = dk.clone()
            dk[..., -1, :] = float("nan")
        return dq, dk, dv
