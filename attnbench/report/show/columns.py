"""``attnbench show`` from a journal's columns: a :class:`~attnbench.results.columnar.
RecordBlock` added to a :class:`~attnbench.report.show.summary.RunSummary` as its records one by
one would add (issue 44: ~30 us of Python a record, most of it the record's objects).

Of a block's rows only those that say more than a count go through :meth:`RunSummary.add` as
records (:func:`~attnbench.results.columnar.block_records`), at their place: a failure (listed,
and what failures share) and a judged record with tensors (its error series). The others -- a
run's ~99 % -- are counted by column: verdicts per backend, and per backend each case field's
values (:meth:`Commonality.add_counts`), which is all :meth:`RunSummary.add` keeps of them.
The counts do not depend on the order, so the summary is the one of the records in order.
"""

from __future__ import annotations

import collections
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from attnbench.report.read.commonality import case_attention, value_text
from attnbench.report.show.summary import RunSummary
from attnbench.results.columnar import CASE_COLUMNS, RecordBlock, block_records
from attnbench.results.records import BAD_VERDICTS, JUDGED_VERDICTS


def summarise(summary: RunSummary, items: Iterable) -> RunSummary:
    """``summary`` with the records and blocks of
    :func:`~attnbench.results.columnar.last_record_blocks` added, in order."""
    for item in items:
        if isinstance(item, RecordBlock):
            add_block(summary, item)
        else:
            summary.add(item)
    return summary


def add_block(summary: RunSummary, block: RecordBlock) -> None:
    """:meth:`RunSummary.add` of each record of ``block``, in order (see the module docstring)."""
    table = block.table
    case = table.column("case").chunk(0)
    backends = case.field("backend")
    if not summary.common.has_room(pc.unique(backends).to_pylist()):
        for record in block_records(block):  # which backends are tallied depends on the order
            summary.add(record)
        return
    verdicts = table.column("verdict").chunk(0)
    tensors = pc.struct_field(table.column("accuracy").chunk(0), "tensors")
    told = pc.or_(pc.is_in(verdicts, value_set=pa.array(BAD_VERDICTS)),
                  pc.and_(pc.is_in(verdicts, value_set=pa.array(JUDGED_VERDICTS)),
                          pc.is_valid(tensors)))
    rows = pc.indices_nonzero(told)
    base = summary.count
    for row, record in zip(rows.to_pylist(), block_records(block, rows)):
        summary.count = base + row  # its place: failures are listed in the records' order
        summary.add(record)
    summary.count = base + table.num_rows
    counted = pc.invert(told)
    if len(rows) == table.num_rows:
        return
    _count(summary, pc.filter(case, counted), pc.filter(verdicts, counted))


def _count(summary: RunSummary, case: "pa.StructArray", verdicts: "pa.Array") -> None:
    """What :meth:`RunSummary.add` keeps of records that are neither failures nor judged
    with tensors: their verdicts per backend and their case fields' values per backend."""
    backends = case.field("backend")
    for (backend, verdict), n in _groups([backends, verdicts]):
        summary.table[backend][verdict] += n
    cases = collections.Counter(dict(_groups([backends])))
    texts: dict[str, dict[str, collections.Counter]] = collections.defaultdict(dict)
    for name in CASE_COLUMNS:
        if name == "backend":
            continue
        for (backend, value), n in _groups([backends, case.field(name)]):
            if value is not None:  # absent from these cases' records
                texts[backend].setdefault(name, collections.Counter())[value_text(value)] += n
    for (backend, heads_q, heads_kv), n in _groups([backends, case.field("heads_q"),
                                                    case.field("heads_kv")]):
        kind = case_attention({k: v for k, v in (("heads_q", heads_q), ("heads_kv", heads_kv))
                               if v is not None})
        if kind:
            texts[backend].setdefault("attention", collections.Counter())[kind] += n
    for (backend,), n in cases.items():
        summary.common.add_counts(backend, n, texts.get(backend, {}))


def _groups(arrays: list) -> list[tuple[tuple, int]]:
    """``(values, count)`` of each distinct row of ``arrays`` (nulls a value of their own)."""
    names = [f"c{i}" for i in range(len(arrays))]
    grouped = pa.table(dict(zip(names, arrays))).group_by(names).aggregate([([], "count_all")])
    columns = [grouped.column(n).to_pylist() for n in names]
    return list(zip(zip(*columns), grouped.column("count_all").to_pylist()))
