"""``python -m attnbench.offline``: wheelhouse (with an index), install and verify (on the box).

Runs from a bare checkout with nothing installed but pip: the Makefile's ``wheelhouse``,
``gpu-install`` and ``rehearsal`` targets call it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from attnbench.errors import EXIT_BAD_INPUT, EXIT_FAILURES, UserError
from attnbench.offline.box import BOX_HAS, PLATFORMS, PYTHON_VERSION
from attnbench.offline.install import install_wheelhouse
from attnbench.offline.verify import check_environment, summary
from attnbench.offline.wheelhouse import CARRY_LIMIT_MIB, build, size_mib

DEFAULT_WHEELHOUSE = ".whl"
DEFAULT_PREFIX = "/tmp/attnbench"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnbench.offline",
        description="Offline installs: build a wheelhouse where an index is (wheelhouse), put it "
                    "into a prefix on a box without one (install), check a box (verify).")
    sub = parser.add_subparsers(dest="command", required=True)
    wheelhouse = sub.add_parser("wheelhouse", help="build the wheelhouse (needs an index)")
    wheelhouse.add_argument("--python-version", default=PYTHON_VERSION,
                            help=f"the box's Python, major.minor (default {PYTHON_VERSION})")
    wheelhouse.add_argument("--platform", action="append",
                            help=f"wheel platform tag, repeatable (default {' '.join(PLATFORMS)})")
    wheelhouse.add_argument("--without", action="append", default=[], metavar="NAME",
                            help="leave out a distribution and what only it needs (bokeh: "
                                 "no Dask dashboard and no interactive report page on the box)")
    wheelhouse.add_argument("--out", type=Path, default=Path(DEFAULT_WHEELHOUSE))
    wheelhouse.add_argument("--source", type=Path, default=Path("."))
    for name, text in (("install", "install the wheelhouse into a prefix, no index"),
                       ("verify", "check attnbench's requirements here (PYTHONPATH=PREFIX)")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--prefix", type=Path, default=None if name == "verify"
                             else Path(DEFAULT_PREFIX))
        if name == "install":
            command.add_argument("--wheelhouse", type=Path, default=Path(DEFAULT_WHEELHOUSE))
    sub.add_parser("box-has", help="the names of attnbench's closure a fresh box has")
    return parser


def _verify(prefix: Path | None) -> int:
    verdict = check_environment(prefix)
    for line in verdict.problems:
        print(f"verify: {line}", file=sys.stderr)
    print(f"verify: {summary(verdict)}")
    return EXIT_FAILURES if verdict.problems else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "wheelhouse":
            wheels = build(args.out, args.source, args.python_version,
                           args.platform or PLATFORMS, args.without)
            size = size_mib(wheels)
            print(f"wheelhouse: {len(wheels)} wheels, {size:.1f} MiB in {args.out}")
            if size > CARRY_LIMIT_MIB:
                print(f"wheelhouse: over {CARRY_LIMIT_MIB} MiB: the device tool carries 64 MiB "
                      "with the tree", file=sys.stderr)
        elif args.command == "install":
            prefix = args.prefix.resolve()  # the check runs from inside it
            wheels = install_wheelhouse(args.wheelhouse, prefix)
            print(f"install: {len(wheels)} wheels into {prefix} (no index, no dependencies)")
            return _verify_in(prefix)
        elif args.command == "verify":
            return _verify(args.prefix)
        else:
            print("\n".join(sorted(BOX_HAS)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    return 0


def _verify_in(prefix: Path) -> int:
    """Verify in a new interpreter that sees the prefix first, and from inside it: the
    attnbench checked is the prefix's, as ``PREFIX/bin/attnbench`` will import it."""
    path = os.pathsep.join([str(prefix), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "attnbench.offline", "verify", "--prefix",
                           str(prefix)], env={**os.environ, "PYTHONPATH": path}, cwd=prefix)
    if proc.returncode == 0:
        print(f"install: now `export PYTHONPATH={prefix}` and run {prefix}/bin/attnbench")
    return proc.returncode if proc.returncode in (0, EXIT_FAILURES) else EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
