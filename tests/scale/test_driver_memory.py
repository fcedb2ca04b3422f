"""The driver's memory per case (issue 29): at 10^6 cases every byte a case costs is a MB.

Measured with tracemalloc through the driver's own path (lanes): the sweep's cases expanded,
the run loop's tables and the lanes' queues built (:meth:`RunLoop.plan`, ``_queue_todo``), then
every case handed out and its answer taken (:meth:`RunLoop.accept`: checked, appended, counted,
shown), with records shaped like the simulated workers' (benchmarks/scale_simulation.py). Each
figure is the growth per added case between a run of ``CASES`` and one of twice as many, so
that fixed costs (imports, buffers, the read buffer's size) cancel.
"""

import io
import json
import tracemalloc

import pytest

import attnbench.results.store as store_module
import attnbench.sweep.case as case_module
from attnbench.cluster.connect import WorkerInfo, plan_case
from attnbench.dispatch.lanes import LaneRun
from attnbench.dispatch.loop import Progress
from attnbench.resources import DEVICE, kind_resource
from attnbench.results.store import RunStore
from attnbench.sweep.load import parse_sweep
from helpers import in_fresh_interpreter, simulated_record

CASES = 1200
"""Cases of the smaller run (the larger has twice as many); from 12,000 to 36,000 cases the
same stages measured 332, 18 and 61 B a case (dict tables double with the cases)."""
CASE_BOUND = 480
"""Bytes per case the sweep's expanded cases may hold (10^6 cases: under half of the driver's
1 GiB). Measured 330 B (a slotted Case, 27 slots, and its 16-character id); the mutant that
caches each case's ``to_dict()`` as the id is cached measured 1,192 B."""
TABLE_BOUND = 96
"""Bytes per pending case the run loop's tables and the lanes' queues may add. Measured 17 B
(list and deque slots); the dense tables of before (``attempts``, ``before`` and lanes'
``group_of`` over every case) measured 228 B."""
RECORD_BOUND = 1024
"""Bytes per recorded case the ledger may add. Measured 63-72 B (an Entry and its dict slot;
the key is the case's own id string); the mutant that keeps each record measured 7,514 B."""

SWEEP = """name: memory
defaults: {backend: naive, batch: 1, heads_q: 8, head_dim: 64, dtype: bf16}
axes: {gpu: [SIM-A, SIM-B, SIM-C], seqlen_q: [512, 1024], seed: {range: [0, %d]}}
"""


class _Workers:
    """One worker of 32 simulated devices per kind (no Dask: the lanes are not started)."""

    client = None

    def workers(self):
        return [WorkerInfo(f"sim-{k}", f"sim-{k}", {DEVICE: 32, kind_resource(k): 32})
                for k in ("SIM-A", "SIM-B", "SIM-C")]


def _held(tmp_path, cases: int, run_class=LaneRun) -> tuple[int, int, int]:
    """Bytes held after expanding the sweep, after building the run's tables, after recording
    every case."""
    run_dir = tmp_path / f"run{cases}"
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        sweep = parse_sweep(SWEEP % (cases // 6 - 1), "memory.yaml")
        expanded = tracemalloc.get_traced_memory()[0]
        store = RunStore(run_dir, sweep, command=["test"])
        try:
            opened = tracemalloc.get_traced_memory()[0]
            run = run_class(store, _Workers(), Progress(0, 0, io.StringIO(), quiet=True))
            run.plan()
            run._queue_todo()
            planned = tracemalloc.get_traced_memory()[0]
            answers = 0
            for queue in run.queues.values():
                while queue:
                    case = queue.popleft()
                    run.accept(case, json.dumps(simulated_record(case)))  # as lanes hand it
                    answers += 1
                    if answers % 100 == 0:  # the loop flushes once per batch
                        store.flush()
            store.flush()
            recorded = tracemalloc.get_traced_memory()[0]
            assert run.summary.written == len(sweep.cases) == cases
        finally:
            store.close()
    finally:
        tracemalloc.stop()
    return expanded - start, planned - opened, recorded - planned


def _per_case(tmp_path, run_class=LaneRun) -> tuple[float, float, float]:
    _held(tmp_path, 12, run_class)  # what the first run allocates once (dask's config, imports)
    small, large = _held(tmp_path, CASES, run_class), _held(tmp_path, 2 * CASES, run_class)
    return tuple((b - a) / CASES for a, b in zip(small, large))


def fresh_per_case(tmp: str) -> tuple[float, float, float]:
    """:func:`_per_case` in a fresh interpreter (helpers.in_fresh_interpreter)."""
    from pathlib import Path

    return _per_case(Path(tmp))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return in_fresh_interpreter("test_driver_memory", "fresh_per_case",
                                str(tmp_path_factory.mktemp("driver")))


def test_the_cases_are_slotted_and_carry_only_their_id(measured):
    assert measured[0] < CASE_BOUND, f"{measured[0]:.0f} B per expanded case"


def test_the_run_loop_keeps_no_dense_table_per_pending_case(measured):
    assert measured[1] < TABLE_BOUND, f"{measured[1]:.0f} B per pending case"


def test_the_driver_keeps_a_ledger_entry_per_case_not_the_record(measured):
    assert measured[2] < RECORD_BOUND, f"{measured[2]:.0f} B per recorded case"


class _DenseTables(LaneRun):
    """Mutant: the tables of before issue 29's second step, over every pending case: the
    attempts, the ledger entries (mostly None), each queued case's resource group."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.attempts = {c.id: self.attempt(c) for c in self.cases}
        self.before = {c.id: self.store.done.get(c.id) for c in self.cases}

    def _queue_todo(self) -> None:
        self.group_of = {c.id: tuple(sorted(plan_case(c, self.workers)[0].items()))
                         for c in self.todo}
        super()._queue_todo()


def test_the_bound_catches_dense_tables(tmp_path):
    per_case = _per_case(tmp_path, _DenseTables)[1]
    assert per_case > 2 * TABLE_BOUND, f"the mutant grew only {per_case:.0f} B per case"


class _KeepsTheRecord:
    """Mutant: the store keeps each record (what it did before issue 29)."""

    @staticmethod
    def of(record):
        return record


def test_the_bound_catches_a_store_that_keeps_records(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "Entry", _KeepsTheRecord)
    per_case = _per_case(tmp_path)[2]
    assert per_case > 3 * RECORD_BOUND, f"the mutant grew only {per_case:.0f} B per case"


def test_the_bound_catches_cases_that_cache_their_dict(tmp_path, monkeypatch):
    kept = {}
    real = case_module._case_id

    def caching_id(case):  # mutant: to_dict() kept per case, as the id is
        kept[case] = case.to_dict()
        return real(case)

    monkeypatch.setattr(case_module, "_case_id", caching_id)
    per_case = _per_case(tmp_path)[0]
    assert per_case > 2 * CASE_BOUND, f"the mutant grew only {per_case:.0f} B per case"
