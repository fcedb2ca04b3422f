"""The ``parallel`` panel: context / tensor parallel scaling and parity.

Speedup: each multi-rank case against the same case at world size 1 (same GPU kind). Parity:
the ``check == "parity"`` entries of the records, the multi-rank result against the same
backend at world size 1, per tensor.
"""

from __future__ import annotations

from typing import Any

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (DIRECTION_LABELS, TENSOR_LABELS, Context, FigureFile,
                                      PanelOutput, finish_figure, new_figure, positions, setup_x)
from attnbench.report.read.reader import PARALLEL_KEY
from attnbench.report.page.style import VERDICT_COLORS
from attnbench.results.records import RAN_VERDICTS, TENSORS


def _parallel_kind(r) -> str:
    parts = []
    if r.cp > 1:
        parts.append(f"cp-{r.cp_algo}")
    if r.tp > 1:
        parts.append("tp")
    return "+".join(parts) or "single"


def draw_parallel(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    """The speedup figure and the parity figure, or a note saying why one is not drawn."""
    out = PanelOutput(panel)
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if not (df.world_size > 1).any():
        out.notes.append("No case with cp * tp > 1 in this run.")
        return out
    base, pairs = _speedup_pairs(df)
    if len(pairs) and any(pairs[f"{d}_median_ms"].notna().any() for d in panel["directions"]):
        out.figures.append(_speedup_figure(panel, ctx, base, pairs))
    else:
        out.notes.append("No speedup plot: no multi-rank case has a timed world-size-1 twin "
                         "in this run.")
    parity = run.parity
    if not parity.empty:  # the checks of the cases this panel draws
        parity = parity[parity.id.isin(set(df.id))].reset_index(drop=True)
    if parity.empty:
        out.notes.append("No parity plot: no record has a check == \"parity\".")
        return out
    out.figures.append(_parity_figure(panel, ctx, parity))
    return out


# -- speedup ----------------------------------------------------------------------------------


def _speedup_pairs(df) -> tuple[Any, Any]:
    """The ran cases at world size 1, one per case (index: the case key without gpu, cp, tp,
    cp_algo, plus the GPU kind), and the ran multi-rank cases that have such a twin."""
    keyed = [f"{key}|{kind}" for key, kind in zip(df[PARALLEL_KEY], df.gpu_kind)]
    df = df.assign(_key=keyed)
    ran = df[df.verdict.isin(RAN_VERDICTS)]
    base = ran[ran.world_size == 1].drop_duplicates("_key").set_index("_key")
    multi = ran[ran.world_size > 1]
    return base, multi[multi._key.isin(base.index)]


def _speedup_figure(panel: Panel, ctx: Context, base, pairs) -> FigureFile:
    """One axis per direction: each multi-rank case's speedup over its world-size-1 twin."""
    series, dirs = panel["series"], panel["directions"]
    fig = new_figure(4.2 * len(dirs) + 0.6, 3.6)
    axes = fig.subplots(1, len(dirs), squeeze=False)[0]
    handles: dict[str, Any] = {}
    worlds = sorted(set(pairs.world_size) | {1})
    kinds = sorted({_parallel_kind(r) for _, r in pairs.iterrows()})
    for ax, d in zip(axes, dirs):
        sp = pairs.assign(
            speedup=base.loc[pairs._key, f"{d}_median_ms"].to_numpy() / pairs[f"{d}_median_ms"],
            kind=[_parallel_kind(r) for _, r in pairs.iterrows()])
        _speedup_axis(ax, ctx, sp, series=series, worlds=worlds, kinds=kinds, handles=handles)
        ax.set_title(DIRECTION_LABELS[d])
        ax.set_ylabel("speedup over world size 1")
    caption = (f"{len(pairs)} multi-rank cases with a world-size-1 twin; lines: median per "
               "world size; dotted: linear scaling.")
    return finish_figure(fig, ctx, f"{panel.slug}-speedup", caption, legend=handles,
                         title="Speedup against world size (same case at cp = tp = 1 as baseline)")


def _speedup_axis(ax, ctx: Context, sp, *, series: str, worlds: list, kinds: list[str],
                  handles: dict[str, Any]) -> None:
    """One direction: linear scaling dotted, then per (series, parallel kind) the cases as faint
    points and their median per world size as a line from (1, 1); line style: the kind."""
    styles = ["-", "--", ":", "-."]
    pos = setup_x(ax, worlds, "world size (cp x tp)", log2=True)
    ax.plot(worlds, worlds, color="#aaaaaa", lw=1, ls=":", zorder=0)
    handles.setdefault("linear", Line2D([], [], color="#aaaaaa", lw=1, ls=":"))
    for (name, kind), s in sp.groupby([series, "kind"], sort=True):
        s = s[s.speedup.notna()]
        if s.empty:
            continue
        color = ctx.color(name)
        ls = styles[kinds.index(kind) % len(styles)]
        ax.scatter(positions(pos, s.world_size), s.speedup, s=10, color=color, alpha=0.35)
        med = s.groupby("world_size").speedup.median()
        xs, ys = [1.0] + [pos(v) for v in med.index], [1.0] + list(med.values)
        (line,) = ax.plot(xs, ys, marker="o", ms=3.5, lw=1.5, color=color, ls=ls)
        handles.setdefault(f"{name} {kind}", line)


# -- parity -----------------------------------------------------------------------------------


def _parity_figure(panel: Panel, ctx: Context, parity) -> FigureFile:
    """One axis per tensor: each parity check's error against world size."""
    tensors = [t for t in TENSORS if t in set(parity.tensor)]
    parity = parity.assign(kind=[_parallel_kind(r) for r in parity.itertuples()])
    by = panel["series"] if panel["series"] in parity else "backend"
    markers = dict(zip(sorted(set(parity.kind)), "o^sDv<>"))
    jitter = _jitter(sorted(set(parity[by].astype(str))))
    fig = new_figure(2.9 * len(tensors) + 0.4, 3.4)
    axes = fig.subplots(1, len(tensors), squeeze=False, sharey=True)[0]
    handles: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    worlds = sorted(set(parity.world_size))
    for ax, t in zip(axes, tensors):
        _parity_axis(ax, ctx, parity, t, by=by, worlds=worlds, markers=markers, jitter=jitter,
                     handles=handles, extra=extra)
    handles.update(extra)
    axes[0].set_ylabel("parity error (" + ", ".join(sorted(set(parity.metric.dropna()))) + ")")
    title = "Parity: multi-rank result against the same backend at world size 1"
    caption = f"{len(parity)} parity checks from {parity.id.nunique()} cases; red rings: over " \
        "their bound."
    return finish_figure(fig, ctx, f"{panel.slug}-parity", caption, title=title, legend=handles)


def _jitter(backends: list[str]) -> dict[str, float]:
    """A factor on x per backend, spreading them a little sideways so that points at one world
    size do not hide each other."""
    return {name: 2 ** ((k - 0.5 * (len(backends) - 1)) * 0.07) for k, name in enumerate(backends)}


def _parity_axis(ax, ctx: Context, parity, t: str, *, by: str, worlds: list,
                 markers: dict[str, str], jitter: dict[str, float], handles: dict[str, Any],
                 extra: dict[str, Any]) -> None:
    """Tensor ``t``: the median bound per world size dashed, each check a point (colour: ``by``,
    marker: parallel kind), checks over their bound ringed. Legend entries go to ``handles``
    (colours) and ``extra`` (the rest)."""
    pos = setup_x(ax, worlds, "world size (cp x tp)", log2=True)
    ax.set_xlim(min(worlds) / 1.4, max(worlds) * 1.4)
    ax.set_yscale("log")
    ax.set_title(f"{TENSOR_LABELS[t]} vs world size 1")
    s_all = parity[(parity.tensor == t) & (parity.value > 0)]
    bound = s_all.groupby("world_size").bound.median()
    if len(bound):
        (bl,) = ax.plot([pos(v) for v in bound.index], bound.values, ls="--", lw=1.2,
                        color="#444444", marker="_", ms=14)
        extra.setdefault("bound (median)", bl)
    for (name, kind), s in s_all.groupby([by, "kind"], sort=True):
        color = ctx.color(name)
        xs = positions(pos, s.world_size) * jitter.get(str(name), 1.0)
        ax.scatter(xs, s.value, s=18, color=color, alpha=0.75, lw=0, marker=markers[kind])
        handles.setdefault(str(name), Patch(color=color))
        extra.setdefault(kind, Line2D([], [], color="#555555", marker=markers[kind], ls=""))
        failed = s[s.passed == False]  # noqa: E712 (None means "not judged")
        if len(failed):
            fl = ax.scatter(positions(pos, failed.world_size) * jitter.get(str(name), 1.0),
                            failed.value, s=60, facecolors="none",
                            edgecolors=VERDICT_COLORS["fail"], lw=1.3)
            extra.setdefault("failed parity", fl)
