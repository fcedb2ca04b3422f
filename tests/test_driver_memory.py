"""The driver's memory does not grow with the journal (issue 29): what a run keeps of a recorded
case is a ledger entry (verdict, attempt), never the record. Measured with tracemalloc through
the run loop's own path for a worker's answer (:meth:`RunLoop.accept`: checked, appended,
counted, shown), with records shaped like the simulated workers' (benchmarks/scale_simulation.py).
"""

import io
import json
import tracemalloc

import attnbench.results.store as store_module
from attnbench.dispatch.loop import Progress
from attnbench.dispatch.run import SweepRun
from attnbench.results.store import RunStore
from attnbench.sweep.load import parse_sweep
from helpers import simulated_record

CASES = 1200
"""Enough records that per-case growth dwarfs one-off allocations (the journal's write buffer,
the progress line): 1,200 cases measured 137 B a case, 3,000 measured 149 B; ~2 s with
tracemalloc on."""
BOUND_BYTES = 1024
"""Per-case growth allowed. Measured 137-149 B (a ledger entry, its dict slot and the id
string); the mutant that keeps each record grew 7,559-7,592 B: the bound is ~7x above the
first and ~7x below the second."""

SWEEP = """name: memory
defaults: {backend: naive, batch: 1, heads_q: 8, head_dim: 64, dtype: bf16}
axes: {gpu: [SIM-A, SIM-B, SIM-C], seqlen_q: [512, 1024], seed: [%s]}
"""


class _NoWorkers:
    def workers(self):
        return []


def _answer(case) -> str:
    """A worker's answer as the lanes deliver it (JSON text)."""
    return json.dumps(simulated_record(case))


def _growth_per_case(tmp_path) -> float:
    seeds = ", ".join(str(s) for s in range(CASES // 6))
    sweep = parse_sweep(SWEEP % seeds, "memory.yaml")
    store = RunStore(tmp_path / "run", sweep, command=["test"])
    try:
        run = SweepRun(store, _NoWorkers(), Progress(0, 0, io.StringIO(), quiet=True))
        answers = [(case, _answer(case)) for case in run.cases]  # made before measuring
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for number, (case, text) in enumerate(answers):
                run.accept(case, text)
                if number % 100 == 99:  # the loop flushes once per batch
                    store.flush()
            store.flush()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert run.summary.written == len(answers)
        return grown / len(answers)
    finally:
        store.close()


def test_the_driver_keeps_a_ledger_entry_per_case_not_the_record(tmp_path):
    per_case = _growth_per_case(tmp_path)
    assert per_case < BOUND_BYTES, f"the driver grew {per_case:.0f} B per recorded case"


class _KeepsTheRecord:
    """Mutant: the store keeps each record (what it did before issue 29)."""

    @staticmethod
    def of(record):
        return record


def test_the_bound_catches_a_store_that_keeps_records(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "Entry", _KeepsTheRecord)
    per_case = _growth_per_case(tmp_path)
    assert per_case > 3 * BOUND_BYTES, f"the mutant grew only {per_case:.0f} B per case"
