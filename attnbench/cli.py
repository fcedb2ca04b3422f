"""The ``attnbench`` command: run, validate, show, report, compare, submit and the rest.

Exit status: see :mod:`attnbench.errors` (0 success; 1 failing cases or a regression; 2 bad
input; 3 the cluster failed, resume later; 4 an accuracy-trend finding; 130 interrupted; 141
standard output closed early, as by ``| head``).
"""

from __future__ import annotations

import argparse
import collections
import logging
import math
import shlex
import sys
from pathlib import Path
from typing import Iterable, Optional

from attnbench import __version__
from attnbench.backends import check_backend_name, public_names
from attnbench.errors import (EXIT_BAD_INPUT, EXIT_CLUSTER, EXIT_INTERRUPTED,
                              EXIT_STATUS_HELP, ClusterError, DiskError,
                              UserError, os_error_text, printable, quiet_broken_pipe, short_repr)
from attnbench.report.show.summary import RunSummary
from attnbench.resources import DISPATCHES
from attnbench.results.outcome import nothing_ran
from attnbench.results.records import NOT_RUN_VERDICTS, VERDICTS
from attnbench.results.store import (RunStore, default_run_dir, latest_run_dir, load_manifest,
                                     stream_record_blocks, stream_records, sweep_case_ids)
from attnbench.sweep.load import load_sweep, single_case_sweep
from attnbench.validation import positive_int_argument


# -- run --------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from attnbench.cluster.connect import make_security
    from attnbench.cluster.scheduler_address import check_choice, choose_scheduler

    sweep = load_sweep(args.sweep, check_backend_name, args.set or ())
    if args.case:
        sweep = single_case_sweep(sweep, args.case)
    # Every argument is checked before the run directory is made: bad input creates nothing.
    security = make_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    scheduler = choose_scheduler(args.scheduler, args.scheduler_file, args.cluster,
                                 args.worker_wait)
    check_choice(scheduler, args.cluster, security)
    if args.out:
        run_dir = Path(args.out)
    elif args.resume:
        run_dir = latest_run_dir(sweep) or default_run_dir(sweep)
    else:
        run_dir = default_run_dir(sweep)
    early = None
    if not run_dir.exists():  # every case of a fresh run is pending: start the cluster now
        early = _start_cluster(args, scheduler, security)
    try:
        store = RunStore(run_dir, sweep, command=sys.argv, retry=args.retry or ())
        try:
            return _run_store(args, sweep, store, run_dir, scheduler, security, early)
        finally:
            store.close()  # never raises; the lock goes whatever happened (a full disk included)
    finally:
        if early is not None:
            early.discard()  # taken (then closed already) or not needed: a no-op, or a close


def _start_cluster(args: argparse.Namespace, scheduler, security):
    """The cluster, started now in the background (:mod:`attnbench.cluster.early`), said at
    once: it takes seconds (7.8 s under load), and a run must never be silent (issue 40)."""
    from attnbench.cluster.connect import connect
    from attnbench.cluster.early import EarlyConnection

    print(f"attnbench: {_connecting_to(scheduler.address, args.cluster)} ...", flush=True)
    return EarlyConnection(lambda: connect(scheduler.address, args.workers,
                                           cluster=args.cluster, security=security,
                                           worker_wait_s=args.worker_wait))


WHERE_OPTIONS = ("scheduler", "scheduler_file", "cluster", "workers", "dispatch", "tls_ca_file",
                 "tls_cert", "tls_key")
"""The options of ``run`` that say where and how its cases run: a resume hint repeats those
given (without ``--scheduler`` it would resume on an embedded cluster, not the one that ran)."""


def resume_command(args: argparse.Namespace, sweep, run_dir: Path) -> str:
    """The command that resumes this run where it ran: the sweep, its ``-s``, ``--out`` and
    the :data:`WHERE_OPTIONS` given."""
    sets = "".join(f" -s {shlex.quote(o)}" for o in sweep.overrides)
    where = "".join(f" --{name.replace('_', '-')} {shlex.quote(str(value))}"
                    for name in WHERE_OPTIONS
                    if (value := getattr(args, name, None)) is not None
                    and not (name == "dispatch" and value == "tasks"))
    return f"attnbench run {sweep.path}{sets} --out {run_dir}{where}"


def _run_store(args: argparse.Namespace, sweep, store: RunStore, run_dir: Path, scheduler,
               security, early=None) -> int:
    from attnbench.dispatch.driver import local_run_status
    from attnbench.dispatch.lanes import run_class
    from attnbench.dispatch.preflight import check_workers_import
    from attnbench.cluster.performance_report import saved_performance_report
    from attnbench.dispatch.run import run_pending

    if store.resume_note:
        print(f"attnbench: warning: {store.resume_note}", file=sys.stderr, flush=True)
    pending = store.pending()
    again = collections.Counter(store.done[c.id].verdict for c in pending if c.id in store.done)
    print(f"attnbench: sweep {sweep.name!r}: {len(sweep.cases)} cases, "
          f"{sum(c.id in store.done for c in sweep.cases)} already in {run_dir}, "
          f"{len(pending)} to run" + (" (again: " + ", ".join(
              f"{n} {v}" for v, n in sorted(again.items())) + ")" if again else ""))
    summary = None
    resume = resume_command(args, sweep, run_dir)
    if pending:
        try:
            conn = (early or _start_cluster(args, scheduler, security)).get()
            try:
                source = f" (from {scheduler.source})" if scheduler.address else ""
                print(f"attnbench: running on {conn.where}{source}; Dask dashboard "
                      f"{conn.dashboard}")
                check_workers_import(conn.client, (c.backend for c in pending))
                status = local_run_status(store, conn.where)  # attnbench status / cancel
                with saved_performance_report(run_dir, conn.client, " ".join(sys.argv)):
                    summary = run_pending(store, conn, worker_wait_s=args.worker_wait,
                                          on_tick=status, run_class=run_class(args.dispatch))
                    status.finish("cancelled" if summary.interrupted else "finished")
                    # The journal is complete: let go of the run directory now, not after
                    # Dask's report and the cluster's shutdown (seconds), so `cancel` returns
                    # as soon as the run stopped. (`store.done` stays readable.)
                    store.close()
            finally:
                conn.close()
        except (ClusterError, DiskError) as exc:
            store.close(discard_unused=True)  # a run that never started leaves nothing
            print(f"attnbench: error: {printable(exc, 2000)}", file=sys.stderr)
            if run_dir.exists():
                print(f"attnbench: resume with: {resume}", file=sys.stderr)
            return exc.exit_status
        except UserError:  # a backend no worker can import: nothing ran, nothing is left
            store.close(discard_unused=True)
            raise
    ids = {c.id for c in sweep.cases}
    # The failing cases printed as they came are not listed again (dispatch.loop.SHOWN_LIVE)
    recorded, foreign = RunSummary(shown=summary.shown if summary is not None else ()), 0
    verdicts, reasons = collections.Counter(), {}  # did anything run (results.outcome)
    for record in store.last_records():  # streamed: the run holds no record
        if record["id"] in ids:
            recorded.add(record)
            verdicts[record["verdict"]] += 1
            if record["verdict"] in NOT_RUN_VERDICTS:
                reasons[record["verdict"]] = record.get("reason") or ""
        else:
            foreign += 1
    store.close()
    if foreign:
        print(f"attnbench: warning: {run_dir / 'records.jsonl'} holds {foreign} records of cases "
              "this sweep does not have; they are not counted", file=sys.stderr)
    print(recorded.table_text())
    for line in recorded.common_text():  # what the failures share, per backend
        print(printable(line, 2000))
    if summary is not None:
        share = 100 * summary.inside_s / (summary.wall_s * max(1, (conn.slots if pending else 1)))
        print(f"attnbench: {summary.written} cases in {summary.wall_s:.1f} s "
              f"(inside cases {summary.inside_s:.1f} s, {share:.0f}% of slot time)")
    dask_report = ", dask-performance.html" if (run_dir / "dask-performance.html").exists() else ""
    print(f"attnbench: results in {run_dir}/ (records.jsonl, manifest.json{dask_report})")
    if summary is not None and summary.interrupted:
        print(f"attnbench: interrupted; resume with: {resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary is not None and summary.not_run:
        print(f"attnbench: {summary.not_run} cases not run; resume with: {resume}",
              file=sys.stderr)
        return EXIT_CLUSTER
    idle = nothing_ran(verdicts, reasons)
    if idle is not None:  # a run that measured nothing is not a success (issue 40)
        print(idle.line)
        return idle.exit_status
    status = recorded.exit_status(recorded.findings_text())  # its findings printed
    if not args.no_report:  # the last line: the path a user opens
        from attnbench.report.page.command import write_report

        try:
            print(f"attnbench: dashboard {write_report(run_dir)}")
        except UserError as exc:  # a planted RUN/dashboard link, a full disk: the run stands
            print(f"attnbench: warning: no dashboard: {printable(exc, 2000)}", file=sys.stderr)
    return status


def _connecting_to(address: Optional[str], cluster: Optional[str]) -> str:
    if address:
        return f"connecting to the Dask scheduler {address}"
    if cluster == "slurm":
        return "starting the SLURM jobs"
    return "starting the embedded Dask cluster"


def findings_text(records: Iterable[dict]) -> list[str]:
    """The accuracy findings across the sweep (:mod:`attnbench.report.read.trends`), one line
    each."""
    return RunSummary.of(records).findings_text()


def run_status(records: Iterable[dict], findings: list[str]) -> int:
    """Exit status of a finished run: failing cases first, then findings (errors.py)."""
    return RunSummary.of(records).exit_status(findings)


# -- validate ---------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    check = _backend_here()
    if args.coverage is not None:  # the sweeps together: which pairs of values never meet
        from attnbench.sweep.coverage import pair_coverage

        sweeps = [load_sweep(path, check, args.set or ())
                  for path in [args.sweep, *args.coverage]]
        print(pair_coverage(c for sweep in sweeps for c in sweep.cases).report())
        return 0
    sweep = load_sweep(args.sweep, check, args.set or ())
    counts = collections.Counter(c.backend for c in sweep.cases)
    print(f"{sweep.path}: ok: sweep {sweep.name!r}, {len(sweep.cases)} cases "
          f"({', '.join(f'{b}: {n}' for b, n in sorted(counts.items()))})")
    if args.list:
        for case in sweep.cases:
            print(f"  {case.id}  {case.label}")
    return 0


def _backend_here():
    """The backend check of ``validate``: the name's form, and a ``module:object`` must be
    loadable from here (its module found, the object in its source; nothing imported), each
    name looked at once. A mistake is one of the sweep's, said with the others in one pass
    (``run`` looks on the workers instead: their environment is what counts there)."""
    from attnbench.backends import backend_names
    from attnbench.backends.importable import importable_here, third_party

    seen: dict[str, Optional[str]] = {}

    def check(name: str) -> Optional[str]:
        if name not in seen:
            seen[name] = check_backend_name(name) or (
                importable_here(name) if third_party([name], backend_names()) else None)
        return seen[name]

    return check


# -- show -------------------------------------------------------------------------------------
def summary_table(records: Iterable[dict]) -> str:
    """Verdict counts per backend, then the failing cases."""
    return RunSummary.of(records).table_text()


def cmd_show(args: argparse.Namespace) -> int:
    from attnbench.report.show.case_lines import label_and_line
    from attnbench.report.show.sorted_lines import SortedLines

    run_dir = Path(args.run)
    manifest = load_manifest(run_dir)
    recorded = RunSummary()
    ids, foreign = sweep_case_ids(manifest), set()  # the sweep's own cases, where cheap to know
    with SortedLines() as lines:  # --all: one line per case, sorted by label
        # One pass; no record is held. A sweep small enough to know its cases (ids) is read
        # a record at a time, counting only its own cases; a large one reads clean blocks of the
        # journal as columns (issue 44: the summary of 10^6 records without 10^6 dicts).
        blocks = not args.all and ids is None
        for record in stream_record_blocks(run_dir) if blocks else stream_records(run_dir):
            if not isinstance(record, dict):
                from attnbench.report.show.columns import add_block
                add_block(recorded, record)
                continue
            if ids is not None and record["id"] not in ids:
                foreign.add(record["id"])
                continue
            recorded.add(record)
            if args.all:
                lines.add(*label_and_line(record))
        sweep = manifest.get("sweep", {})
        print(printable(f"run {manifest.get('run_id')}: sweep {short_repr(sweep.get('name'))} "
                        f"({sweep.get('path')}), {recorded.count}/{sweep.get('cases')} cases "
                        f"recorded, created {manifest.get('created')}", 2000))
        if foreign:
            print(f"note: {len(foreign)} more cases recorded are not cases of this sweep (an "
                  "earlier version of it, or added by hand); not shown")
        devices = sorted({str(d.get("device_name") or "?") for d in manifest.get("devices") or []})
        print(printable(f"hosts: {', '.join(manifest.get('hosts') or []) or '-'}; devices: "
                        f"{', '.join(devices) or '-'}", 2000))
        print(recorded.table_text())
        for line in recorded.common_text():
            print(printable(line, 2000))
        for line in lines:
            print(printable(line, 2000))
    for line in recorded.findings_text():
        print(printable(line, 2000))
    return 0


# -- backends ---------------------------------------------------------------------------------
def cmd_backends(args: argparse.Namespace) -> int:
    """Each backend, and whether it runs a plain bf16 case (or only its forward) here."""
    from attnbench.backends import backend_names, backend_readiness, prepare_interpreter
    from attnbench.hardware.device import device_env, pick_device

    prepare_interpreter()  # before anything imports triton
    device = pick_device()
    env = device_env(device)
    identity = env.get("identity") or {}
    print(printable(f"device: {device}: {env['gpu_kind']} (family {env['gpu_family']}), "
                    f"{identity.get('name')}; torch {env.get('torch')}, triton "
                    f"{env.get('triton')}", 500))
    for name in backend_names():
        if name.startswith(("testing.", "mutant.")) and not args.all:
            continue
        for line in backend_readiness(name, device).lines():
            print(printable(line))
    return 0


# -- entry point ------------------------------------------------------------------------------
def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= 7 * 86400):
        raise argparse.ArgumentTypeError(f"got {short_repr(text)}, expected seconds in "
                                         f"[0, {7 * 86400}]")
    return value


def _verdicts(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in names if v not in VERDICTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"got {short_repr(text)}, expected verdicts among "
                                         f"{', '.join(VERDICTS)}, comma-separated")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__.splitlines()[0],
                                     epilog=EXIT_STATUS_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"attnbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a sweep (resumes when --out names an existing run)")
    run.add_argument("sweep", help="sweep file (YAML)")
    run.add_argument("--out", help="run directory (default results/<sweep>-<UTC time>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the newest run of this sweep under results/")
    run.add_argument("--scheduler", help="address of a running Dask scheduler (tcp://host:8786)")
    run.add_argument("--scheduler-file", metavar="JSON",
                     help="the scheduler's address from the file `dask scheduler "
                          "--scheduler-file` writes (SLURM, MPI); waited for up to --worker-wait. "
                          "Without --scheduler, --scheduler-file or --cluster: "
                          "DASK_SCHEDULER_ADDRESS or dask config scheduler-address, if set")
    run.add_argument("--cluster", choices=("local", "slurm"),
                     help="start the cluster: local (default: embedded LocalCluster) or slurm "
                          "(dask-jobqueue; see docs/cluster.md)")
    run.add_argument("--workers", type=positive_int_argument,
                     help="concurrent cases on the embedded cluster; with --scheduler, workers "
                          "to wait for (default 1); with --cluster slurm, jobs to start")
    run.add_argument("--worker-wait", type=_seconds, default=60.0, metavar="SECONDS",
                     help="how long to wait for workers to connect, or to come back for cases "
                          "only they can run (default 60)")
    run.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate(s) for TLS to the "
                                                          "scheduler (tls://host:8786)")
    run.add_argument("--tls-cert", metavar="PEM", help="this client's TLS certificate")
    run.add_argument("--tls-key", metavar="PEM", help="this client's TLS private key")
    run.add_argument("--case", action="append", metavar="ID",
                     help="run only this case id (or unique prefix), again if --out already "
                          "has it (the new record is its result); repeatable")
    run.add_argument("--retry", type=_verdicts, metavar="VERDICTS",
                     help="also run again the cases recorded with these verdicts, comma-separated "
                          "(e.g. timeout,crash); lost and skipped cases always run again")
    run.add_argument("--no-report", action="store_true", help="do not write the dashboard")
    run.add_argument("--dispatch", choices=DISPATCHES, default="tasks",
                     help="tasks: one Dask task per case; lanes: each device pulls its next "
                          "case from this client (workers must reach it; docs/cluster.md)")
    run.set_defaults(func=cmd_run)

    val = sub.add_parser("validate", help="check a sweep file without running it")
    val.add_argument("sweep")
    for command in (run, val):
        command.add_argument("-s", "--set", action="append", metavar="FIELD=VALUE",
                             help="override the sweep: FIELD takes VALUE (YAML: 1024, "
                                  "[fp32,bf16], {pow2: [512,4096]}) in every case; also "
                                  "options.KEY=VALUE; repeatable")
    val.add_argument("--list", action="store_true", help="list every case with its id")
    val.add_argument("--coverage", nargs="*", metavar="SWEEP", default=None,
                     help="with these sweeps too: which pairs of feature values (mask x bias x "
                          "dropout x GQA x packed x ...) no case puts together "
                          "(docs/coverage.md)")
    val.set_defaults(func=cmd_validate)

    show = sub.add_parser("show", help="summary of a run directory")
    show.add_argument("run")
    show.add_argument("--all", action="store_true",
                      help="one line per case: times, TFLOP/s, %% of peak, and whether the "
                           "timing can carry a comparison (too few samples, too noisy)")
    show.set_defaults(func=cmd_show)

    # `attnbench worker` has its own parser (options it does not know go to `dask worker`);
    # main() hands it over before this parser runs. Listed here for `attnbench --help`.
    sub.add_parser("worker", add_help=False,
                   help="start a Dask worker for this node (attnbench worker --help)")

    be = sub.add_parser("backends", help="list backends and whether they load here")
    be.add_argument("--all", action="store_true", help="include test-only backends and mutants")
    be.set_defaults(func=cmd_backends)

    from attnbench.capture.command import add_capture_command
    from attnbench.dispatch.detach import add_detach_commands
    from attnbench.gpu_check.command import add_gpu_check_command
    from attnbench.report.commands import add_report_commands
    from attnbench.report.page.command import write_report
    from attnbench.report.export.command import add_export_command
    from attnbench.selftest import add_selftest_command
    from attnbench.sweep.schema import add_schema_command

    add_report_commands(sub)
    add_export_command(sub)
    add_schema_command(sub, public_names)
    add_selftest_command(sub)
    add_detach_commands(sub, _seconds, _verdicts, write_report)
    add_gpu_check_command(sub)
    add_capture_command(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # a reader that left (`| head`) shows here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        return quiet_broken_pipe()
    except OSError as exc:  # an output the disk refused (`> /dev/full`, a full disk): one line
        # A write to an open file names no file; which output it was (standard output or an
        # --out file) is not known here: Python drops the buffer a failed flush could not write.
        print(f"attnbench: error: {os_error_text(exc, 'writing the output')}", file=sys.stderr)
        quiet_broken_pipe()  # the interpreter's last flush of stdout must not raise again
        return EXIT_BAD_INPUT


_NOISY = ("distributed", "bokeh", "tornado")


def shown_log_record(record: logging.LogRecord) -> bool:
    """Whether a log line reaches the terminal. Dask's INFO lines (scheduler start, worker
    plugins, ...) drown the progress line, and LocalCluster resets logger levels, so this
    filters at the handler: of Dask's, Bokeh's and Tornado's only errors. Not even those where
    the error is a task of Dask's own cancelled: a nanny closed while it restarts its worker
    (the embedded cluster's, under load) logs its cancelled restart as a traceback with no
    message, and the run, whose keeper replaces the worker, says so in one line."""
    if not record.name.startswith(_NOISY):
        return True
    if record.levelno < logging.ERROR:
        return False
    # (asyncio is loaded where a task was cancelled; a reader's CLI does not import it)
    cancelled = getattr(sys.modules.get("asyncio"), "CancelledError", ())
    return not (record.exc_info and isinstance(record.exc_info[1], cancelled))


def _main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(shown_log_record)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        from attnbench.cluster.worker import worker_main

        return worker_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        for line in str(exc).split("\n"):  # a sweep's mistakes come all at once, one a line
            print(f"attnbench: error: {printable(line, 2000)}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("attnbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
