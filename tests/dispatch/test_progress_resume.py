"""The progress line of a resumed run (``run`` or ``submit``'s driver) counts what the run
directory holds, not only this run's verdicts: it read ``[24/24] pass 12`` after resuming a run
whose first 12 cases had passed."""

import io

from attnbench.dispatch.loop import Progress
from attnbench.dispatch.run import SweepRun
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import parse_sweep

SWEEP = """name: resumed
defaults: {batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {backend: [naive, sdpa], seed: [0, 1, 2]}
"""


class _NoWorkers:
    def workers(self):
        return []


def test_a_resumed_run_counts_the_journal_it_resumes(tmp_path):
    # Mutant: counts from this run only (the line before) reads "[6/6] pass 2".
    sweep = parse_sweep(SWEEP, "resumed.yaml")
    store = RunStore(tmp_path / "run", sweep, command=["test"])
    first, again, *rest = sweep.cases
    store.append(make_record(first, verdict="fail", reason="on purpose"))
    store.append(make_record(again, verdict="lost", reason="run again on resume"))
    for case in rest[:2]:
        store.append(make_record(case, verdict="pass", reason=""))
    stream = io.StringIO()
    progress = Progress(0, len(store.done), stream)
    run = SweepRun(store, _NoWorkers(), progress)
    assert [c.id for c in run.cases] == [again.id, *(c.id for c in rest[2:])]
    for case in run.cases:
        progress.update(make_record(case, verdict="pass", reason=""))
    store.close()
    assert stream.getvalue().splitlines()[-1].startswith("[6/6] fail 1 pass 5 ")
