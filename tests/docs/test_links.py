"""The README and the guides point only at what a clone has: files, folders, modules, anchors.

:func:`broken_references` reads a markdown text and returns every reference into the checkout
that does not resolve. What counts as a reference (outside fenced code blocks, whose commands
name example files such as ``sweeps/my-kernel.yaml``):

* a markdown link ``[text](target)`` that is not a URL: its file relative to the document, and
  its ``#anchor`` (a heading of that file, GitHub's slug, or an ``<a id>``); ``(#anchor)`` is
  one of the document's own;
* a path in backticks or in prose whose first part is a top-level folder of the checkout
  (``attnbench/report/read/reader.py``, ``sweeps/smoke.yaml``, ``benchmarks/readers.py``,
  ``docs/cluster.md#slurm``, ``tests/sweep/``), or a ``.py`` path inside the package written
  without ``attnbench/`` (``results/journal.py``); a ``:name`` or ``::test`` after a ``.py``
  path is left out;
* a dotted name in backticks that starts with ``attnbench.`` (``attnbench.cluster.closed_http``,
  ``attnbench.hardware.kind_from_name``): its modules must exist, and the first name after
  them must appear in that module's source.

What is clearly an example of a run's output or a user's file is not a reference: anything with
a placeholder (``results/<run-id>/``, ``RUN/dashboard``), a glob or an ellipsis, an absolute or
home path (``/tmp/...``, ``~/...``), and first parts the checkout does not have (``.venv``,
``.whl``, ``results/mine``).

No conftest, no helpers: the checker is plain functions, run on the checkout's documents and on
planted texts.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[2]

TOP_FOLDERS = ("attnbench", "kernels", "sweeps", "tests", "dashboards", "benchmarks", "docs")
"""First parts of a path that make it a path into the checkout."""
TOP_FILES = ("README.md", "Makefile", "pyproject.toml", "setup.py")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\n]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"`([^`\n]+)`")
PROSE_PATH = re.compile(r"(?<![\w/.$~<-])((?:%s)/[\w./#-]*)" % "|".join(TOP_FOLDERS))
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
PLACEHOLDER = re.compile(r"[<>*{}$~]|\.\.\.|…")
DOTTED = re.compile(r"^attnbench(?:\.[A-Za-z_]\w*)+$")


class Broken(NamedTuple):
    doc: str
    line: int
    reference: str
    why: str


def documents(root: Path = ROOT) -> list[Path]:
    """The README, every guide, and the measurement logs beside the benchmarks (their paths
    must name the code as it is laid out now)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")),
            *sorted((root / "benchmarks").glob("*.md"))]


def _subpackages(root: Path) -> frozenset[str]:
    return frozenset(p.parent.name for p in (root / "attnbench").glob("*/__init__.py"))


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = unicodedata.normalize("NFC", text.strip().lower())
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a markdown text: its headings' slugs (repeats numbered as GitHub does)
    and its ``<a id=...>`` tags."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(text):
        found.update(ANCHOR_TAG.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def _clean(token: str) -> str:
    token = token.strip().strip("()[],;'\"").split("(", 1)[0]
    token = token.rstrip(".:,")
    if "::" in token:  # a pytest id
        token = token.split("::", 1)[0]
    match = re.match(r"^(.*?\.py):", token)  # path.py:name
    if match:
        token = match.group(1)
    return token


def _path_of(token: str, subpackages: frozenset[str]) -> str | None:
    """The checkout path a token names, or None when it names none (an example, a word)."""
    if not token or PLACEHOLDER.search(token) or token.startswith("/"):
        return None
    if token.startswith("../"):  # above the checkout, or above the document: said as such
        return token
    path = token.split("#", 1)[0]
    if path in TOP_FILES:
        return token
    if not re.fullmatch(r"[\w./#-]+", token):
        return None
    first = path.split("/", 1)[0]
    if "/" in path and first in TOP_FOLDERS:
        return token
    if "/" in path and first in subpackages and path.endswith(".py"):
        return "attnbench/" + token
    return None


def _check_path(target: str, base: Path, root: Path) -> str | None:
    """Why ``target`` (a path relative to ``base``, maybe with ``#anchor``) does not resolve."""
    path, _, anchor = target.partition("#")
    where = (base / path).resolve() if path else None
    if where is not None:
        try:
            where.relative_to(root.resolve())
        except ValueError:
            return "outside the checkout"
        if not where.exists():
            return "no such file or folder"
    if anchor:
        doc = where if where is not None else None
        if doc is None or doc.suffix != ".md" or doc.is_dir():
            return None if doc is not None else "no document for the anchor"
        if anchor not in anchors(doc.read_text()):
            return f"no heading or anchor #{anchor} in {doc.relative_to(root.resolve())}"
    return None


def _check_dotted(name: str, root: Path) -> str | None:
    """Why the dotted name ``attnbench.x.y`` names no module, or no name in its module."""
    parts = name.split(".")
    here = root / "attnbench"
    for i, part in enumerate(parts[1:], 1):
        folder = root / "kernels" if (i == 1 and part == "kernels") else here / part
        if (folder / "__init__.py").exists():
            here = folder
            continue
        source = here / "__init__.py"
        if (here / f"{part}.py").exists():
            source = here / f"{part}.py"
            if i + 1 == len(parts):
                return None
            part = parts[i + 1]
        elif i + 1 < len(parts) or not source.exists():
            return f"no module {'.'.join(parts[:i + 1])}"
        if re.search(rf"\b{re.escape(part)}\b", source.read_text()):
            return None
        return f"{part!r} is not in {source.relative_to(root)}"
    return None


def broken_references(text: str, doc: Path, root: Path = ROOT) -> list[Broken]:
    """Every reference of markdown ``text`` (the document at ``doc``) into the checkout at
    ``root`` that does not resolve."""
    subpackages = _subpackages(root)
    name = str(doc.relative_to(root)) if doc.is_relative_to(root) else str(doc)
    own = anchors(text)
    broken: list[Broken] = []

    def report(line: int, ref: str, why: str | None) -> None:
        if why:
            broken.append(Broken(name, line, ref, why))

    for number, line in _prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            if target.startswith("#"):
                report(number, target, None if target[1:] in own else
                       f"no heading or anchor {target} in this document")
            else:
                report(number, target, _check_path(target, doc.parent, root))
        rest = LINK.sub(" ", line)
        for span in CODE.findall(rest):
            for token in span.split():
                token = _clean(token)
                if DOTTED.match(token):
                    report(number, token, _check_dotted(token, root))
                    continue
                path = _path_of(token, subpackages)
                if path is not None:
                    report(number, token, _check_path(path, root, root))
        for token in PROSE_PATH.findall(CODE.sub(" ", rest)):
            token = _clean(token)
            path = _path_of(token, subpackages)
            if path is not None:
                report(number, token, _check_path(path, root, root))
    return broken


def broken_in_checkout(root: Path = ROOT) -> list[Broken]:
    return [b for doc in documents(root) for b in broken_references(doc.read_text(), doc, root)]


# -- the checkout's documents ------------------------------------------------------------------


def test_the_readme_and_the_guides_point_only_at_what_a_clone_has():
    broken = broken_in_checkout()
    assert broken == [], "\n".join(f"{b.doc}:{b.line}: {b.reference}: {b.why}" for b in broken)


def test_the_documents_are_found():
    names = {p.name for p in documents()}
    assert {"README.md", "architecture.md", "backends.md", "cluster.md", "readers.md"} <= names


# -- the README is a front page ----------------------------------------------------------------

README_MAX_LINES = 250
"""The README is the two commands, the tour and the layout; every topic has its guide."""


def front_page_faults(readme: str, guides: list[str]) -> list[str]:
    """What keeps ``readme`` from being the front page: too long, not opening with the two
    commands, or a guide of ``docs/`` (by file name) it does not link."""
    faults = []
    lines = readme.splitlines()
    if len(lines) >= README_MAX_LINES:
        faults.append(f"{len(lines)} lines, expected fewer than {README_MAX_LINES}")
    opening = "\n".join(lines[:6])
    for command in ("make run", "make test"):
        if f"\n{command} " not in opening:
            faults.append(f"does not open with `{command}`")
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", readme))
    faults += [f"does not link docs/{g}" for g in guides if g not in linked]
    return faults


def _guides() -> list[str]:
    return sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def test_the_readme_is_a_front_page_that_links_every_guide():
    assert front_page_faults((ROOT / "README.md").read_text(), _guides()) == []


def test_a_long_readme_an_unlisted_guide_and_a_late_command_are_faults():
    readme = (ROOT / "README.md").read_text()
    # Mutants: the tour grown back, a new guide nobody links, the commands moved down.
    assert front_page_faults(readme + "x\n" * README_MAX_LINES, _guides()) == [
        f"{len(readme.splitlines()) + README_MAX_LINES} lines, expected fewer than "
        f"{README_MAX_LINES}"]
    assert front_page_faults(readme, [*_guides(), "new-topic.md"]) == [
        "does not link docs/new-topic.md"]
    late = readme.replace("make run ", "make  run ", 1).replace("make test ", "make  test ", 1)
    assert front_page_faults(late, _guides()) == [
        "does not open with `make run`", "does not open with `make test`"]


# -- the checker, on planted texts -------------------------------------------------------------


def _refs(text: str) -> list[str]:
    return [b.reference for b in broken_references(text, ROOT / "docs" / "planted.md")]


def test_a_missing_path_is_reported_in_every_form_it_takes():
    # Mutants: a moved module, a renamed sweep, a dead link, a lost heading, a gone module name.
    text = "\n".join([
        "See `attnbench/report/nowhere.py` and `sweeps/gone.yaml`,",
        "the [guide](cluster.md#no-such-heading), [old](old-guide.md),",
        "[here](#nothing-here), `docs/cluster.md#nor-this`, prose docs/missing.md.",
        "`attnbench.cluster.no_module`, `attnbench.hardware.no_such_name`,",
        "`python benchmarks/nope.py --x`, `results/not_a_module.py:f`, `tests/nope/`.",
    ])
    assert _refs(text) == [
        "attnbench/report/nowhere.py", "sweeps/gone.yaml", "cluster.md#no-such-heading",
        "old-guide.md", "#nothing-here", "docs/cluster.md#nor-this", "docs/missing.md",
        "attnbench.cluster.no_module", "attnbench.hardware.no_such_name", "benchmarks/nope.py",
        "results/not_a_module.py", "tests/nope/"]


def test_what_exists_and_what_is_an_example_is_not_reported():
    text = "\n".join([
        "# A heading: with `code`, punctuation",
        "`sweeps/smoke.yaml`, [cluster](cluster.md#slurm), [up](#a-heading-with-code-punctuation),",
        "`attnbench/sweep/case.py:make_case`, `tests/` , `results/journal.py`, `kernels/decode.py`,",
        "`attnbench.cluster.closed_http`, `attnbench.sweep.case.MAX_CASES`, `attnbench.kernels.warm`,",
        "`results/<run-id>/records.jsonl`, `RUN/dashboard`, `.venv/bin/attnbench`, `/tmp/x.py`,",
        "`~/sched.json`, `results/mine`, `sweeps/<sweep>.yaml`, `module:object`, https://x.org/a.md,",
        "[web](https://example.org/docs/x.md), `benchmarks/*.py`, `attnbench run`.",
        "```bash",
        "attnbench run sweeps/my-kernel.yaml   # a user's file, in a command",
        "```",
    ])
    assert _refs(text) == []


def test_a_path_outside_the_checkout_is_reported():
    assert _refs("seed bugs: [seeds](../../shared/seeds/)") == ["../../shared/seeds/"]


def test_slugs_follow_github():
    assert slug("Security: what a sweep runs, what listens") == \
        "security-what-a-sweep-runs-what-listens"
    assert slug("`--fail-on speed` on a shared CPU box") == "--fail-on-speed-on-a-shared-cpu-box"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n<a id=\"x\"></a>\n") == {"a", "a-1", "x"}
