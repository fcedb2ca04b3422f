"""``attnbench submit | status | attach | cancel``: a sweep that runs without its submitter.

``submit`` checks everything a run would check (the sweep, the run directory, the scheduler
and its workers) and claims the run directory (its lock, before it says anything: a second
submit or run is refused from then on), then hands the sweep to a driver task on the cluster
(:func:`attnbench.dispatch.driver.drive`, ``fire_and_forget``), which adopts the claim, and
returns once the driver holds the run directory. ``status`` and ``attach`` read what the driver
leaves in the run directory (:mod:`attnbench.dispatch.driver_state`) and the journal; ``cancel``
asks the lock holder to stop (a driver or a plain ``attnbench run``), which it does within
about a second (its next tick, then the cases in flight are let go: measured 1-2 s), leaving
the journal valid; a driver not started yet loses its claim at once and runs nothing when it
starts. All four need only the run directory, on the filesystem the cluster shares.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from attnbench.dispatch.driver_state import (FINAL, LOG, load_state, read_state,
                                             request_cancel, write_state)
from attnbench.errors import (EXIT_CLUSTER, EXIT_OK, MESSAGE_LIMIT, ClusterError, RunDirError,
                              UsageError, UserError, printable)
from attnbench.resources import DISPATCHES
from attnbench.results.journal import MAX_LINE_BYTES, journal_lines
from attnbench.results.lock import RunLock, describe_holder
from attnbench.results.outcome import REASON_CHARS, nothing_ran, ran_count
from attnbench.results.records import NOT_RUN_VERDICTS
from attnbench.results.store import load_manifest, sweep_case_ids
from attnbench.validation import positive_int_argument, read_span


# -- submit -------------------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    from attnbench.backends import check_backend_name
    from attnbench.cluster.connect import check_connection_arguments, connect, make_security
    from attnbench.dispatch.preflight import check_workers_import
    from attnbench.sweep.load import load_sweep
    from attnbench.results.store import RunStore, default_run_dir

    sweep = load_sweep(args.sweep, check_backend_name)
    security = make_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    if not args.scheduler:
        raise UsageError("submit needs --scheduler tcp://host:8786 (a scheduler that outlives "
                         "this command; see docs/cluster.md, Submit and walk away)")
    check_connection_arguments(args.scheduler, None, security)
    # Absolute: the driver runs elsewhere, in another working directory.
    run_dir = Path(args.out or default_run_dir(sweep)).absolute()
    conn = connect(args.scheduler, args.workers, security=security,
                   worker_wait_s=args.worker_wait)
    try:
        check_workers_import(conn.client, (c.backend for c in sweep.cases))
        # What a run would refuse is refused here, in one line (the lock included); the
        # directory and its manifest are made by the user, on the shared filesystem. The lock
        # taken here is the driver's claim: held until the driver adopts it, so exactly one
        # of two submits to one --out is accepted (issue 25: both were, in 2 of 3 tries).
        submission = uuid.uuid4().hex[:12]
        store = RunStore(run_dir, sweep, command=sys.argv, retry=args.retry or (),
                         submission=submission, claim=True)
        cases, done = store.pending(), len(store.done)
        pending = len(cases)
        # No connected worker can run any of them (a plain `dask worker`): the driver would
        # record every case skipped and finish "successfully"; say so now, start nothing.
        refused = pending and no_worker_runs_any(cases, conn.workers())
        store.close(discard_unused=not pending or bool(refused),
                    keep_lock=bool(pending) and not refused)
        print(f"attnbench: sweep {sweep.name!r}: {len(sweep.cases)} cases, {done} already in "
              f"{run_dir}, {pending} to run")
        if refused:
            print(f"attnbench: nothing ran: no connected worker can run any of the {pending} "
                  f"cases ({printable(refused, REASON_CHARS)}); no driver was started")
            return EXIT_CLUSTER
        if not pending:
            print(f"attnbench: nothing to run; see attnbench status {run_dir}")
            return _ran_anything(*journal_outcome(run_dir)[::2])
        return _hand_over(conn, sweep, run_dir, args, store.lock, submission)
    finally:
        conn.close()


def no_worker_runs_any(cases, workers) -> str:
    """Why no one of ``workers`` can run any of ``cases`` (the first case's reason), or "" when
    one can run some. Asked once per (GPU kind, cp, tp): what placing a case depends on."""
    from attnbench.cluster.connect import plan_case

    workers, first, seen = list(workers), "", set()
    for case in cases:
        shape = (case.gpu, case.cp, case.tp)
        if shape in seen:
            continue
        seen.add(shape)
        resources, reason = plan_case(case, workers)
        if resources is not None:
            return ""
        first = first or reason
    return first


def _hand_over(conn, sweep, run_dir: Path, args: argparse.Namespace, claim: RunLock,
               submission: str) -> int:
    """Start the driver with ``claim`` (this submit's lock) to adopt; wait for it to start.
    The claim is let go without removing it once the driver may adopt it (it holds the run
    directory for a driver still queued: a run may take it over once stale), and removed only
    when the driver is known not to run."""
    from distributed import fire_and_forget

    from attnbench.dispatch.driver import drive

    future = None
    try:
        write_state(run_dir, {"submission": submission, "state": "submitted",
                              "host": socket.gethostname(), "pid": os.getpid(),
                              "run_dir": str(run_dir), "started": time.time()})
        future = conn.client.submit(drive, sweep.source, sweep.path, str(run_dir), submission,
                                    [str(a) for a in sys.argv], tuple(args.retry or ()),
                                    args.worker_wait, args.dispatch, claim=claim.token,
                                    key=f"attnbench-driver-{submission}", pure=False)
        fire_and_forget(future)
        return _wait_for_driver(future, run_dir, submission, args.start_wait)
    finally:
        if future is None or future.done():
            claim.release()  # only if still the claim: a driver that adopted it keeps it
        else:
            claim.hand_over()


def _wait_for_driver(future, run_dir: Path, submission: str, start_wait: float) -> int:
    deadline = time.monotonic() + start_wait
    while time.monotonic() < deadline:
        state = read_state(run_dir) or {}
        # "starting" is not enough: a driver that fails as its run loop starts (its lanes'
        # listener, say) must not have been reported as submitted (issue #25, item 3).
        if state.get("submission") == submission and state.get("state") not in (
                "submitted", "starting"):
            if state.get("state") == "failed":
                print(f"attnbench: error: the driver failed: {printable(state.get('message'), 2000)}",
                      file=sys.stderr)
                return EXIT_CLUSTER
            if state.get("state") == "cancelled":
                print(f"attnbench: driver {submission} was cancelled before it ran a case "
                      f"(attnbench cancel); the same submit resumes")
                return EXIT_OK
            print(f"attnbench: submitted: driver {submission} runs on worker "
                  f"{printable(state.get('worker'))} ({printable(state.get('host'))}, pid "
                  f"{state.get('pid')}); this machine may go now")
            _print_follow_up(run_dir)
            return EXIT_OK
        if future.done():
            result = (future.result() if future.status == "finished" else None) or {}
            message = result.get("message") or f"driver task {future.status}"
            done = result.get("done")
            if isinstance(done, int) and done > 0:  # it ran, then ended before driver.json
                if result.get("state") == "finished":  # said so (a full disk refuses it)
                    print(f"attnbench: submitted: driver {submission} finished, {done} cases "
                          "recorded")
                    _print_follow_up(run_dir)
                    return EXIT_OK
                print(f"attnbench: error: the driver {printable(result.get('state'), 20)} after "
                      f"recording {done} cases: {printable(message, 2000)}; the same submit "
                      "resumes", file=sys.stderr)
                return EXIT_CLUSTER
            print(f"attnbench: error: the driver did not start: {printable(message, 2000)}",
                  file=sys.stderr)
            return EXIT_CLUSTER
        time.sleep(0.2)
    print(f"attnbench: the driver has not started after {start_wait:g} s (no free worker "
          "thread?); it stays submitted and starts when the scheduler places it")
    _print_follow_up(run_dir)
    return EXIT_OK


def _print_follow_up(run_dir: Path) -> None:
    print(f"  attnbench status {run_dir}     progress, ETA, who runs what\n"
          f"  attnbench attach {run_dir}     the live progress lines (Ctrl-C detaches); "
          "the dashboard when the run ends\n"
          f"  attnbench cancel {run_dir}     stop; the same submit --out resumes")


def _draw_dashboard(draw: Optional[Callable[[Path], Path]], run_dir: Path) -> None:
    """The dashboard of a finished run, drawn by the client that saw it end: the driver, a
    task of this package, cannot draw it (the report package sits above dispatch), so the CLI
    hands its drawing function to ``attach`` (:func:`add_detach_commands`)."""
    if draw is None:
        return
    try:
        print(f"attnbench: dashboard {draw(run_dir)}")
    except UserError as exc:  # a run with nothing to draw yet, a full disk: say it, go on
        print(f"attnbench: warning: no dashboard: {printable(exc, 2000)}", file=sys.stderr)


# -- status -------------------------------------------------------------------------------------
def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def driver_line(run_dir: Path) -> tuple[str, Optional[dict], bool]:
    """One line on who drives the run, the driver's last state, and whether a holder is
    alive."""
    lock = RunLock(run_dir)
    holder = lock.holder()
    state = load_state(run_dir)  # checked: a bad driver.json is one line (exit 2)
    alive = holder is not None and not lock.stale_reason(holder)
    if holder is not None and holder.get("claim"):
        left = "" if alive else "; its submit has left"
        return (f"driver: submitted, not started yet (submission "
                f"{printable(holder.get('submission'), 40)}: it starts when the scheduler "
                f"places it{left})", state, alive)
    if alive:
        age = lock.heartbeat_age() or 0.0
        who = describe_holder(holder)
        if holder.get("worker"):
            who = f"worker {printable(holder['worker'])}, {who}"
        return f"driver: running ({who}; heartbeat {_age(age)} ago)", state, True
    if holder is not None:
        return (f"driver: gone ({lock.stale_reason(holder)}; {describe_holder(holder)}); "
                "resubmit with the same --out to resume", state, False)
    if state and state.get("scheduler_lost"):
        return (f"driver: gone ({printable(state.get('message'), 500)}); resubmit with the same "
                "--out to resume", state, False)
    if state and state.get("state") not in FINAL and not state.get("submission"):
        return ("driver: not running (an `attnbench run` that stopped without finishing; rerun "
                "it with this --out to resume)", state, False)
    if state and state.get("state") not in FINAL:
        return ("driver: not running (submitted or between workers; last state "
                f"{printable(state.get('state'))}, {_age(time.time() - state.get('updated', 0))} "
                "ago)", state, False)
    if state:
        message = f": {printable(state['message'], 500)}" if state.get("message") else ""
        return f"driver: {printable(state.get('state'))}{message}", state, False
    return "driver: none (not running)", state, False


def journal_verdicts(run_dir: Path, notes: Optional[dict] = None,
                     ids: Optional[frozenset[str]] = None) -> tuple[collections.Counter, int]:
    """Verdict of each case's last record, and lines that are not a record. A quick look for
    ``status`` while a driver appends (1.3 s for 100,000 records here; ``show`` and ``report``
    check every field, ~60 s at that size). Streamed: memory is an id and a shared verdict
    string per case (1M records: 25-40 s, 241 MiB peak RSS, on 2 loaded cores). ``ids``: the
    sweep's cases, where known (others are not counted); ``notes`` gets ``first_bad`` (the
    first line that is not a record) and ``foreign`` (cases recorded that are not ``ids``)."""
    counts, unreadable, _ = journal_outcome(run_dir, notes, ids)
    return counts, unreadable


def journal_outcome(run_dir: Path, notes: Optional[dict] = None,
                    ids: Optional[frozenset[str]] = None
                    ) -> tuple[collections.Counter, int, dict[str, str]]:
    """:func:`journal_verdicts`, and the last reason read of each verdict that means a case
    never started (skipped, unsupported): what ``status`` quotes when nothing ran. One string
    per such verdict, so memory stays as it was."""
    last: dict[str, str] = {}
    reasons: dict[str, str] = {}
    unreadable = first_bad = 0
    if notes is not None:
        notes.update(first_bad=0, foreign=0)
    if not (run_dir / "records.jsonl").exists():
        return collections.Counter(), 0, reasons
    for line in journal_lines(run_dir / "records.jsonl"):  # a line at a time, each capped
        try:
            record = None if line.oversize else json.loads(line.data)
        except (ValueError, RecursionError):  # 100,000 nested lists: too deep for json
            record = None
        if isinstance(record, dict) and isinstance(record.get("id"), str) \
                and isinstance(record.get("verdict"), str):
            if ids is not None and record["id"] not in ids:
                last[record["id"]] = ""  # counted as foreign below, never as a verdict
                continue
            # One string per verdict, not per line: 1M records held 303 MiB, interned 241
            # (benchmarks/make_journal.py; NOTES-wt-scale.md).
            last[record["id"]] = sys.intern(record["verdict"])
            if record["verdict"] in NOT_RUN_VERDICTS and isinstance(record.get("reason"), str):
                reasons[record["verdict"]] = record["reason"][:MESSAGE_LIMIT]
        elif (line.oversize or line.data.strip()) and line.ended:  # not one being written
            unreadable += 1
            first_bad = first_bad or line.number
    foreign = sum(1 for v in last.values() if not v)
    if notes is not None:
        notes.update(first_bad=first_bad, foreign=foreign)
    return collections.Counter(v for v in last.values() if v), unreadable, reasons


def cmd_status(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    manifest = load_manifest(run_dir)
    notes: dict = {}
    counts, unreadable, reasons = journal_outcome(run_dir, notes, sweep_case_ids(manifest))
    sweep = manifest.get("sweep") or {}
    total = sweep.get("cases") or 0
    parts = ", ".join(f"{n} {printable(v, 20)}" for v, n in sorted(counts.items())) or "none yet"
    print(printable(f"run {manifest.get('run_id')}: sweep {sweep.get('name')!r}: "
                    f"{sum(counts.values())}/{total} cases recorded ({parts}), "
                    f"{ran_count(counts)} ran", 2000))
    if notes["foreign"]:
        print(f"note: {notes['foreign']} more cases recorded are not cases of this sweep (an "
              "earlier version of it, or added by hand); not counted")
    if unreadable:
        print(f"warning: {unreadable} lines of records.jsonl are not records (the first: "
              f"{printable(str(run_dir / 'records.jsonl'), 1000)}:{notes['first_bad']}); "
              f"attnbench show {printable(str(run_dir), 1000)} says why")
    line, state, alive = driver_line(run_dir)
    print(line)
    if not alive and state and state.get("state") == "finished":
        index = run_dir / "dashboard" / "index.html"  # where run and attach draw it
        if index.is_file():
            print(f"dashboard: {printable(str(index), 2000)}")
        else:
            print(f"dashboard: attnbench attach {run_dir} (or attnbench report {run_dir}) "
                  "draws it")
    if alive and state and state.get("state") == "running":
        eta = state.get("eta_s")
        print(f"progress: {state.get('done', 0)} done by this driver at "
              f"{state.get('rate', 0):.1f} cases/s, ETA {_age(eta) if eta is not None else '?'}; "
              f"{state.get('in_flight', 0)} in flight, {state.get('queued', 0)} queued; "
              f"{state.get('workers', 0)} workers with {state.get('devices', 0)} devices "
              f"(scheduler {printable(state.get('scheduler'))})")
        for worker, cases in sorted((state.get("running") or {}).items())[:args.limit]:
            print(printable(f"  {worker}: {'; '.join(cases)}", 2000))
    return _ran_anything(counts, reasons) if _over(state, alive) else EXIT_OK


def _over(state: Optional[dict], alive: bool) -> bool:
    """The run ended by itself: its driver (or ``run``) finished. A cancelled or failed one
    says so in its driver line and keeps its exit status."""
    return not alive and (state or {}).get("state") == "finished"


def _ran_anything(counts: collections.Counter, reasons: dict[str, str]) -> int:
    """0, or the exit status of a run that ran no case, its one line said on standard output
    (:mod:`attnbench.results.outcome`)."""
    idle = nothing_ran(counts, reasons)
    if idle is None:
        return EXIT_OK
    print(idle.line)
    return idle.exit_status


# -- attach -------------------------------------------------------------------------------------
def cmd_attach(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    load_manifest(run_dir)  # a run directory, or one line and exit 2
    log = run_dir / LOG
    position = 0
    text, size = _read_log(log, -MAX_LINE_BYTES)  # the last lines (of the last MiB), then more
    position = max(0, size - MAX_LINE_BYTES) + len(text)
    for line in text.decode("utf-8", "replace").splitlines()[-args.lines:] if args.lines else []:
        print(printable(line, 2000))
    line, state, alive = driver_line(run_dir)
    print(line, flush=True)
    try:
        while True:
            chunk, size = _read_log(log, position)
            if size < position:  # a new log (truncated or replaced): from its start
                position = 0
                chunk, size = _read_log(log, position)
            cut = chunk.rfind(b"\n") + 1  # whole lines only
            if not cut and len(chunk) == MAX_LINE_BYTES:
                cut = len(chunk)  # a line longer than a read: shown in pieces, not waited on
            for text in chunk[:cut].decode("utf-8", "replace").splitlines():
                print(printable(text, 2000), flush=True)
            position += cut
            line, state, alive = driver_line(run_dir)
            if not alive and (state is None or state.get("state") in FINAL):
                print(line)
                if (state or {}).get("state") == "finished":
                    counts, _, reasons = journal_outcome(run_dir)
                    if nothing_ran(counts, reasons) is not None:  # nothing to draw
                        return _ran_anything(counts, reasons)
                    _draw_dashboard(getattr(args, "draw", None), run_dir)
                return EXIT_OK if (state or {}).get("state") != "failed" else EXIT_CLUSTER
            time.sleep(args.poll)
    except KeyboardInterrupt:
        print(f"\nattnbench: detached; the run goes on (attnbench status {run_dir})")
        return EXIT_OK


def _read_log(log: Path, offset: int) -> tuple[bytes, int]:
    """At most a MiB of ``driver.log`` from ``offset`` (from the end when negative) and the
    log's size: never waiting on a FIFO, never reading ``/dev/zero`` whole
    (:func:`~attnbench.validation.read_span`). What is not a regular file is one line, exit 2."""
    try:
        return read_span(log, offset, MAX_LINE_BYTES)
    except FileNotFoundError:
        return b"", 0  # none yet (a driver not started), or none at all (a plain run)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{log}: cannot read: {getattr(exc, 'strerror', None) or exc}; the "
                          "driver's log must be a regular file") from None


# -- cancel -------------------------------------------------------------------------------------
def cmd_cancel(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    load_manifest(run_dir)
    lock = RunLock(run_dir)
    holder = lock.holder()
    state = read_state(run_dir) or {}
    tokens = [(holder or {}).get("token"), (holder or {}).get("submission")]
    if state.get("state") not in FINAL:
        tokens.append(state.get("submission"))  # a driver queued or between workers
    tokens = [t for t in tokens if isinstance(t, str)]
    if not tokens:
        print(f"attnbench: nothing runs in {run_dir}")
        return EXIT_OK
    request_cancel(run_dir, tokens)
    if holder is not None and holder.get("claim") and lock.withdraw(holder.get("token")):
        print(f"attnbench: cancelled before it started: the driver of submission "
              f"{printable(holder.get('submission'), 40)} runs nothing when the scheduler "
              f"places it; {run_dir} is free")
        return EXIT_OK
    holder = lock.holder() if holder is not None and holder.get("claim") else holder
    if holder is None or lock.stale_reason(holder):
        print(f"attnbench: no driver holds {run_dir} now; a driver that starts for it will "
              "stop at once")
        return EXIT_OK
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        now = lock.holder()
        if now is None or now.get("token") != holder.get("token"):
            count = sum(journal_verdicts(run_dir)[0].values())
            print(f"attnbench: cancelled; {count} records in {run_dir}; the same "
                  "`attnbench submit` (or `run`) with this --out resumes")
            return EXIT_OK
        time.sleep(0.2)
    raise ClusterError(f"{run_dir}: asked the driver ({describe_holder(holder)}) to stop; it "
                       f"still holds the run after {args.wait:g} s")


# -- registration -------------------------------------------------------------------------------
def add_detach_commands(sub, seconds, verdicts,
                        draw: Optional[Callable[[Path], Path]] = None) -> None:
    """Register the four commands (``seconds``, ``verdicts``: the CLI's argument types;
    ``draw(run_dir) -> index.html``: the dashboard ``attach`` draws when the driver finishes)."""
    submit = sub.add_parser("submit", help="run a sweep on a cluster without staying connected")
    submit.add_argument("sweep", help="sweep file (YAML)")
    submit.add_argument("--scheduler", help="a running Dask scheduler (tcp://host:8786)")
    submit.add_argument("--out", help="run directory on a filesystem the workers share "
                                      "(default results/<sweep>-<UTC time>); same --out resumes")
    submit.add_argument("--workers", type=positive_int_argument, default=1,
                        help="workers to wait for before planning (default 1)")
    submit.add_argument("--worker-wait", type=seconds, default=60.0, metavar="SECONDS",
                        help="how long to wait for workers (default 60)")
    submit.add_argument("--start-wait", type=seconds, default=60.0, metavar="SECONDS",
                        help="how long to wait for the driver to start (default 60)")
    submit.add_argument("--retry", type=verdicts, metavar="VERDICTS",
                        help="also run again the cases recorded with these verdicts")
    submit.add_argument("--dispatch", choices=DISPATCHES, default="lanes",
                        help="lanes (default): each device pulls its next case from the driver; "
                             "tasks: one Dask task per case")
    for flag in ("--tls-ca-file", "--tls-cert", "--tls-key"):
        submit.add_argument(flag, metavar="PEM", help="TLS (see attnbench run --help)")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", help="progress of a run: verdicts, ETA, who runs what")
    status.add_argument("run", help="run directory")
    status.add_argument("--limit", type=positive_int_argument, default=20, help="workers shown (default 20)")
    status.set_defaults(func=cmd_status)

    attach = sub.add_parser("attach", help="follow a run's progress lines (Ctrl-C detaches)")
    attach.add_argument("run", help="run directory")
    attach.add_argument("--lines", type=int, default=10, help="earlier lines shown (default 10)")
    attach.add_argument("--poll", type=float, default=0.5, help=argparse.SUPPRESS)
    attach.set_defaults(func=cmd_attach, draw=draw)

    cancel = sub.add_parser("cancel", help="stop a run cleanly (the journal stays valid)")
    cancel.add_argument("run", help="run directory")
    cancel.add_argument("--wait", type=seconds, default=60.0, metavar="SECONDS",
                        help="how long to wait for the driver to stop (default 60)")
    cancel.set_defaults(func=cmd_cancel)

