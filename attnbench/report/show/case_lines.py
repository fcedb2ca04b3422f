"""``attnbench show RUN --all``: one line per case, with what a reader compares kernels by.

    pass  8d51d813c1  sdpa bf16 b1 s128/128 h8/2 d64 GQA causal seed0  fwd 0.212 ms 41.2 TFLOP/s
    4.2% peak | bwd 0.655 ms 33.4 TFLOP/s 3.4% peak

(one line per case, so ``grep`` and ``sort`` work on it; a judged case adds its tensor closest
to its bound, ``| error 0.45 of bound (dq 1.9e-03 / 4.1e-03)``; an fp8 case its error split:
kernel vs quantization, :mod:`attnbench.accuracy.fp8_split`)

``% peak`` is against the datasheet peak of the exact GPU kind (``timing.<d>.pct_peak``), else
against the matmul peak the worker measured (``% measured``); ``?`` where neither is known (a
CPU). A timing that cannot carry a comparison says why (:mod:`attnbench.report.read.doubt`: too few
samples, too noisy), so an AMBIGUOUS in ``attnbench compare`` is expected before it appears.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

from attnbench.report.read.doubt import timing_doubt
from attnbench.report.show.sorted_lines import SortedLines


def _number(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def direction_text(name: str, stats: dict, memory_bound: bool = False) -> str:
    """``fwd 0.212 ms 41.2 TFLOP/s 4.2% peak`` (and why it cannot be compared, if so);
    ``fwd 0.05 ms 812 GB/s 17.0% bandwidth`` for a memory-bound (forward-only, decode) case."""
    median = _number(stats.get("median_ms"))
    if not math.isfinite(median):
        return ""
    doubt = timing_doubt(stats)
    if memory_bound:
        gbps, pct = _number(stats.get("gbps")), _number(stats.get("pct_peak_bandwidth"))
        parts = [f"{name} {median:.3g} ms",
                 f"{gbps:.3g} GB/s" if math.isfinite(gbps) else "? GB/s",
                 f"{pct:.1f}% bandwidth" if math.isfinite(pct) else "?% bandwidth"]
        return " ".join(parts) + (f" [{doubt}]" if doubt else "")
    tflops = _number(stats.get("tflops"))
    parts = [f"{name} {median:.3g} ms",
             f"{tflops:.3g} TFLOP/s" if math.isfinite(tflops) else "? TFLOP/s"]
    peak, measured = _number(stats.get("pct_peak")), _number(stats.get("pct_measured_peak"))
    parts.append(f"{peak:.1f}% peak" if math.isfinite(peak) else
                 f"{measured:.1f}% measured" if math.isfinite(measured) else "?% peak")
    return " ".join(parts) + (f" [{doubt}]" if doubt else "")


def case_lines(records: Iterable[dict]) -> Iterator[str]:
    """One line per case, sorted by label (equal labels in the records' order): verdict, id,
    label, times, reason. The records are not held: their lines are sorted
    (:class:`~attnbench.report.show.sorted_lines.SortedLines`: on disk beyond a chunk)."""
    with SortedLines() as lines:
        for r in records:
            lines.add(*label_and_line(r))
        yield from lines


def label_and_line(r: dict) -> tuple[str, str]:
    """A record's sort key in :func:`case_lines` (its label) and its line."""
    timing = r.get("timing") or {}
    # decode reads a cache for a handful of queries: memory-bound, GB/s is its figure
    # (a forward-only fp8 or backward: false case is still compute-bound: TFLOP/s)
    memory_bound = (r.get("case") or {}).get("decode") is True
    times = " | ".join(t for t in (direction_text(d, timing.get(d) or {}, memory_bound)
                                   for d in ("fwd", "bwd")) if t)
    reason = f"  {r['reason']}" if r.get("reason") else ""
    return str(r.get("label", "")), (
        f"  {r['verdict']:<11} {str(r['id'])[:10]}  {r.get('label', '')}  {times}"
        f"{error_text(r)}{fp8_text(r)}{reason}")


def error_text(record: dict) -> str:
    """`` | error 0.45 of bound (dq 1.9e-03 / 4.1e-03)``: the judged tensor closest to its
    bound, for passing cases too (issue 27: ``--all`` showed no error for a pass, so the
    backend with the lowest error could not be told from one at its limit)."""
    tensors = (record.get("accuracy") or {}).get("tensors")
    worst = None
    for name, m in (tensors.items() if isinstance(tensors, dict) else ()):
        err, bound = (_number(m.get(k)) for k in ("rel_l2", "bound")) if isinstance(m, dict) \
            else (math.nan, math.nan)
        if math.isfinite(err) and math.isfinite(bound) and bound > 0 and \
                (worst is None or err / bound > worst[0]):
            worst = (err / bound, str(name)[:8], err, bound)
    if worst is None:
        return ""
    return f" | error {worst[0]:.2g} of bound ({worst[1]} {worst[2]:.2g} / {worst[3]:.2g})"


def fp8_text(record: dict) -> str:
    """`` | fp8 error: kernel 0.016 (sm_90 accumulator model 0.018), quantization 0.040`` for an
    fp8 case (accuracy.fp8; the model's figure when the record has one)."""
    split = (record.get("accuracy") or {}).get("fp8")
    if not isinstance(split, dict):
        return ""
    kernel, quant = _number(split.get("kernel_rel_l2")), _number(split.get("quantization_rel_l2"))
    if not (math.isfinite(kernel) and math.isfinite(quant)):
        return ""
    model = _number(split.get("accumulation_rel_l2"))
    shown = f" (sm_90 accumulator model {model:.2g})" if math.isfinite(model) else ""
    return f" | fp8 error: kernel {kernel:.2g}{shown}, quantization {quant:.2g}"
