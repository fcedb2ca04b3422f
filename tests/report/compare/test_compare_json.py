"""``attnbench compare --format json`` is written a pair at a time
(:func:`attnbench.report.compare.formats.write_comparison_json`, issue 29: every pair's dict
in a list, then json's chunks of it, were ~1 GB for 10^5 pairs). Its text must be, byte for
byte, ``json.dumps`` of the whole body as it was made before: across chunks of pairs, with
several comparisons, and with none matched."""

import io
import json

import pytest

from attnbench.report.compare import formats as compare_formats
from attnbench.report.compare.comparison import compare_runs
from attnbench.report.compare.formats import _json_body, _pair, comparison_json
from attnbench.report.read.reader import read_run


def _whole(comps, fail_on="both") -> str:
    """The JSON as it was made before: every pair's dict in the body, one json.dumps."""
    body = _json_body(comps, fail_on, None, "unused")
    for entry, c in zip(body["comparisons"], comps):
        entry["pairs"] = [_pair(r) for r in c.named(c.pairs).itertuples()]
    return json.dumps(body, indent=1, allow_nan=False, default=str)


@pytest.fixture(scope="module")
def comps(synthetic):
    base = read_run(synthetic["h100"])
    return [compare_runs(base, read_run(synthetic[name])) for name in ("h100-slower", "mixed")]


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_written_a_pair_at_a_time_is_dumped_whole(comps, monkeypatch, chunk):
    # mutants caught here: a comma lost or doubled at a chunk's edge, a pair indented
    # otherwise than in place, the body's text after the pairs dropped
    monkeypatch.setattr(compare_formats, "PAIRS_CHUNK", chunk)
    assert len(comps[1].pairs) > chunk or chunk == 10_000
    out = io.StringIO()
    compare_formats.write_comparison_json(comps, "both", None, out)
    assert out.getvalue() == _whole(comps) + "\n"
    assert comparison_json(comps, "speed", None) == _whole(comps, "speed")


def test_no_pairs_is_an_empty_list(comps):
    c = comps[0]
    empty = type(c)(a=c.a, b=c.b, threshold=c.threshold, pairs=c.pairs.iloc[:0],
                    only_a=c.only_a, only_b=c.only_b, names_a=c.names_a, names_b=c.names_b)
    assert comparison_json([empty, comps[1]], "both", None) == _whole([empty, comps[1]])
    assert json.loads(comparison_json([empty], "both", None))["comparisons"][0]["pairs"] == []
