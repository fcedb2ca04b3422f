"""The readers' time and memory on a journal (issue 29: under 60 s and 1 GiB at 10^6 records).

    python benchmarks/readers.py RUN [--readers status,show,export-csv] [--repeat 1]
        [--checkout DIR]

RUN: a run directory, such as one made by ``benchmarks/make_journal.py`` (``/tmp/journals/1m``).
Each reader runs as ``attnbench`` does from a shell, in a process of its own (its import time
counted), its output read into a digest and let go. Prints per reader the wall seconds (the
best of ``--repeat``), its CPU seconds, its peak RSS and the sha256 of its output, so a change
meant to be faster shows on one line whether it changed what a reader prints (compare the
digests before and after). ``report`` and ``compare`` can be named too. ``--checkout``: the
attnbench of another checkout (a worktree of the commit before a change: its "before").
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = {
    "status": ["status", "{run}"],
    "show": ["show", "{run}"],
    "show-all": ["show", "--all", "{run}"],
    "export-csv": ["export", "{run}", "--format", "csv"],
    "export-json": ["export", "{run}", "--format", "json"],
    "export-parquet": ["export", "{run}", "--format", "parquet"],
    "report": ["report", "{run}", "--out", "{tmp}/report"],
    "compare": ["compare", "{run}", "{run}"],
}
"""Reader name -> its ``attnbench`` arguments (``{run}``: the run directory; ``{tmp}``: a
scratch directory for what a reader writes besides standard output)."""


def measure(name: str, run: Path, tmp: Path, checkout: Path = ROOT
            ) -> tuple[float, float, int, str, int]:
    """``(wall s, CPU s, peak RSS bytes, sha256 of stdout, exit status)`` of one reader, run
    from ``checkout``."""
    args = [a.format(run=run, tmp=tmp) for a in COMMANDS[name]]
    digest = hashlib.sha256()
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(checkout)}  # its attnbench, not the installed one
    proc = subprocess.Popen([sys.executable, "-m", "attnbench.cli", *args], cwd=checkout,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    while chunk := proc.stdout.read(1 << 20):  # the output streamed into its digest
        digest.update(chunk)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is in KiB on Linux (bytes on macOS)
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return wall, usage.ru_utime + usage.ru_stime, rss, digest.hexdigest()[:16], proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--readers", default="status,show,export-csv",
                        help=f"comma-separated, of {', '.join(COMMANDS)}")
    parser.add_argument("--repeat", type=int, default=1, help="runs per reader; the best shown")
    parser.add_argument("--checkout", type=Path, default=ROOT,
                        help="the attnbench checkout to run (default: this one)")
    args = parser.parse_args()
    names = args.readers.split(",")
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        parser.error(f"--readers: got {', '.join(unknown)}, expected some of "
                     f"{', '.join(COMMANDS)}")
    lines = sum(1 for _ in open(args.run / "records.jsonl", "rb"))
    print(f"{args.run}: {lines} journal lines; attnbench of {args.checkout}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            runs = [measure(name, args.run, Path(tmp), args.checkout.resolve())
                    for _ in range(args.repeat)]
            wall, cpu, rss, digest, code = min(runs)
            print(f"{name:15} {wall:7.1f} s wall {cpu:7.1f} s CPU {rss / 2**20:7.0f} MiB peak "
                  f"RSS  exit {code}  output sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
