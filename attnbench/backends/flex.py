"""``flex``: PyTorch's FlexAttention (``torch.nn.attention.flex_attention``), compiled.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D / Dv = head dims;
q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv).

The programmable fused attention teams prototype with (attention-gym), shipped with every torch:
causal (bottom-right), windows, ALiBi and softcap are its ``score_mod`` / ``mask_mod``
(:mod:`.flex_mods`), GQA is ``enable_gqa``, a pack is a document ``mask_mod`` on the whole pack, a
decode case a forward against its contiguous cache. It has no dropout (``unsupported``), no
paged cache here (a paged ``BlockMask`` needs the pages as a mask: not done), no fp8.

Compiled once per shape: ``torch.compile(flex_attention, fullgraph=True, dynamic=False)``. Without
compiling, FlexAttention runs an unfused reference that materializes every score -- not the kernel
anyone would ship, so never measured here. The first call of a new shape (and features) compiles;
it is the case's accuracy forward, before anything is timed, and its seconds go to the record's
``compile`` section (:meth:`FlexBackend.compile_report`), apart from the timed figures, and out
of the case's ``timeout_s`` (:func:`attnbench.backends.base.compiling`: the pool stops the case's
clock, giving a compile up to its own limit). The block mask is built once per case
(:class:`attnbench.backends.masks.Prepared`), untimed.

Dynamo keeps at most ``recompile_limit`` (8) compiled variants of one function and then -- unless
the compile is ``fullgraph`` -- silently runs it uncompiled: a long-lived rank that met 9 shapes
would time the unfused path under ``flex``. Here a rank clears dynamo's cache before the 9th
variant (:func:`torch._dynamo.reset`; inductor's on-disk cache makes a variant seen before cheap
to reload), and ``fullgraph=True`` turns a limit hit that slips through into an error, never a
silent fallback.

CPU: PyTorch compiles forward only and without the log-sum-exp ("torch.compile on CPU only
supports inference and `return_lse` is not supported yet", torch/_inductor/kernel/flex): cases
with a backward are ``unsupported`` with that reason, ``Forward.lse`` is None. GPU: forward,
backward through autograd, and the log-sum-exp (natural log). Ring CP would also need
``backward_from_stats`` (the gradients of one block from the merged softmax), which FlexAttention
has no public entry for: ring/zigzag CP is refused; all-gather CP and TP run.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

from attnbench.backends.base import Forward, Unsupported, compiling
from attnbench.backends.flex_mods import Mods, call_mods
from attnbench.backends.masks import PreparesOnce, call_key

RECOMPILE_LIMIT_FALLBACK = 8
"""torch._dynamo.config.recompile_limit's default, for a torch that does not name it."""

NO_DROPOUT = ("FlexAttention has no dropout: flex_attention() takes no dropout_p "
              "(torch.nn.attention.flex_attention)")
CPU_FORWARD_ONLY = ("FlexAttention on CPU is forward only: PyTorch says \"torch.compile on CPU "
                    "only supports inference and `return_lse` is not supported yet\"; set "
                    "backward: false for CPU cases")
CPU_NO_PARALLEL = ("FlexAttention on CPU is forward only, and a CP/TP case runs its backward "
                   "whatever backward says (the multi-rank runner has no forward-only path): "
                   "CP/TP of flex runs on a GPU")


def flex_api() -> tuple[Any, Any, Any]:
    """(flex_attention, create_block_mask, AuxRequest or None); raises ImportError on a torch
    without FlexAttention (before 2.5)."""
    from torch.nn.attention import flex_attention as module

    return module.flex_attention, module.create_block_mask, getattr(module, "AuxRequest", None)


def compile_unavailable(device: torch.device) -> Optional[str]:
    """Why torch.compile cannot build FlexAttention's kernel on ``device`` (None: it can)."""
    try:
        flex_api()
    except ImportError as exc:
        return f"this torch {torch.__version__} has no FlexAttention ({exc})"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "torch.compile needs triton for FlexAttention on CUDA"
    if device.type != "cpu":
        return f"FlexAttention is compiled for CUDA and CPU only, not {device.type}"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # inductor says why it found no C++ compiler
        return f"torch.compile on CPU needs a C++ compiler: {str(exc).splitlines()[0][:160]}"
    return None


class _Compiler:
    """The compiled FlexAttention of this process, and what it compiled since last asked."""

    def __init__(self) -> None:
        self.function = None
        self.variants: set[tuple] = set()
        self.backwards: set[tuple] = set()  # variants whose backward has run (and compiled)
        self.seconds = 0.0
        self.compiled = 0
        self.unexpected = 0

    def call(self, key: tuple, *args, **kwargs):
        if self.function is None:
            flex_attention, _, _ = flex_api()
            self.function = torch.compile(flex_attention, fullgraph=True, dynamic=False)
        graphs = _graphs_compiled()
        if key in self.variants:
            result = self.function(*args, **kwargs)
            if _graphs_compiled() != graphs:  # a guard we did not key on: say so in the record
                self.unexpected += 1
            return result
        if len(self.variants) >= recompile_limit():
            torch._dynamo.reset()  # before dynamo's limit, never at it: see the module doc
            self.variants.clear()
            self.backwards.clear()
        start = time.perf_counter()
        with compiling():  # the case's timeout stands still meanwhile (execution.pool)
            result = self.function(*args, **kwargs)
            if args[0].device.type == "cuda":
                torch.cuda.synchronize(args[0].device)
        self.seconds += time.perf_counter() - start
        self.compiled += _graphs_compiled() - graphs
        self.variants.add(key)
        return result

    def backward(self, key: tuple, out, inputs, dout):
        """The gradients of ``out``; the first backward of a variant compiles (AOTAutograd
        builds the backward graph lazily, at its first call), so it runs as compiling: its
        seconds count in the compile record, not against the case's timeout."""
        if key in self.backwards:
            return torch.autograd.grad(out, inputs, dout, retain_graph=True)
        graphs = _graphs_compiled()
        start = time.perf_counter()
        with compiling():
            grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)
            if out.device.type == "cuda":
                torch.cuda.synchronize(out.device)
        self.seconds += time.perf_counter() - start
        self.compiled += _graphs_compiled() - graphs
        self.backwards.add(key)
        return grads

    def report(self) -> dict[str, Any]:
        """The compile section since the last report, then start counting afresh."""
        note = ("the first call of each new shape and features (compile included), before "
                "anything is timed" if self.compiled else
                "nothing compiled: an earlier case of this rank compiled this shape")
        if self.unexpected:
            note += (f"; {self.unexpected} call(s) after the first recompiled (a guard the "
                     "backend did not expect): their times include compiling")
        section = {"mode": "torch.compile", "seconds": round(self.seconds, 3),
                   "kernels": self.compiled, "note": note}
        self.seconds, self.compiled, self.unexpected = 0.0, 0, 0
        return section


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def recompile_limit() -> int:
    return int(getattr(torch._dynamo.config, "recompile_limit", RECOMPILE_LIMIT_FALLBACK))


class FlexBackend(PreparesOnce):
    name = "flex"
    keep_mask = None  # no dropout at all
    supports_packed = True  # a document mask_mod on the pack (flex_mods.packed_mods)

    def __init__(self) -> None:
        self.compiler = _Compiler()

    def supports(self, case, device) -> Optional[str]:
        if case.dropout:
            return NO_DROPOUT
        reason = compile_unavailable(device)
        if reason:
            return reason
        if device.type == "cpu" and case.backward:
            return CPU_FORWARD_ONLY
        if device.type == "cpu" and case.world_size > 1:
            return CPU_NO_PARALLEL
        return None

    def compile_report(self) -> dict[str, Any]:
        """The record's ``compile`` section for the case that just ran."""
        return self.compiler.report()

    def prepared_call(self, spec, q, k) -> tuple[Mods, Any]:
        """(mods, block mask or None) of a call: built once per case, outside any timed call."""
        def build():
            mods = call_mods(spec, q.shape[1], q.device)
            if mods.mask_mod is None:
                return mods, None
            _, create_block_mask, _ = flex_api()
            # The mods depend on neither batch nor head: one (1, 1) block mask broadcasts.
            return mods, create_block_mask(mods.mask_mod, None, None, q.shape[2], k.shape[2],
                                           device=q.device)
        return self.prepared.get(call_key(spec, q, k, "flex"), build)

    def forward(self, q, k, v, spec) -> Forward:
        if q.shape[1] % k.shape[1]:
            raise Unsupported(f"heads_q={q.shape[1]} is not a multiple of heads_kv={k.shape[1]}")
        mods, block_mask = self.prepared_call(spec, q, k)
        grad = not spec.decode and q.device.type != "cpu"  # CPU: inference only
        q_in, k_in, v_in = (t.detach().requires_grad_(grad) for t in (q, k, v))
        want_lse = q.device.type != "cpu"
        _, _, aux_request = flex_api()
        extra: dict[str, Any] = {}
        if want_lse:
            extra = {"return_aux": aux_request(lse=True)} if aux_request else {"return_lse": True}
        key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, str(q.device), grad,
               want_lse, mods.score_mod is not None, block_mask is not None,
               spec.alibi_slopes is not None, spec.is_packed, mods.constants)
        with torch.set_grad_enabled(grad):
            result = self.compiler.call(key, q_in, k_in, v_in, score_mod=mods.score_mod,
                                        block_mask=block_mask, scale=spec.scale,
                                        enable_gqa=k.shape[1] != q.shape[1], **extra)
        out, lse = result if want_lse else (result, None)
        if lse is not None and not isinstance(lse, torch.Tensor):
            lse = lse.lse  # AuxOutput
        return Forward(out=out.detach(), lse=None if lse is None else lse.detach().float(),
                       ctx=(out, q_in, k_in, v_in, key))

    def backward(self, ctx, dout):
        out, q_in, k_in, v_in, key = ctx
        if not out.requires_grad:
            raise Unsupported(CPU_FORWARD_ONLY)
        return self.compiler.backward(key, out, (q_in, k_in, v_in), dout)
