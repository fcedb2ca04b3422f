"""How much ``inputs: shifted_v`` (V ~ N(1, 1)) changes how far past its bound each single-device
mutant lands, beside ``normal`` inputs on the same case (issue 39, item 4). Pure data when
reading: no torch.

    python benchmarks/shifted_v_margins.py sweep > /tmp/shifted.yaml
    TRITON_INTERPRET=1 attnbench run /tmp/shifted.yaml --out runs/shifted --no-report
    python benchmarks/shifted_v_margins.py report runs/shifted

The margin of a record is its worst check's value / bound (over 1: caught); for the mutant that
is declared computed in the input dtype (a finding, not a failure) it is the worst fused ratio
over 2 (LEVEL_BOUND). The last column is shifted_v's margin over normal's.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

BASE = {"seqlen_q": 128, "heads_q": 4, "heads_kv": 2, "head_dim": 32, "dtype": "bf16"}
LONG = {"heads_q": 1, "heads_kv": 1, "head_dim": 64, "dtype": "bf16"}
CASES = {
    # mutant -> the case fields that expose it (as tests/mutants/test_mutants.py EXPOSE has them)
    "mutant.dq_log2_scale": [{"mask": "causal"}],
    "mutant.dq_stale_delta": [{}],
    "mutant.mqa_alibi_order": [{"heads_kv": 1, "bias": "alibi"}],
    "mutant.kv_layout_swap": [{"seqlen_q": 16, "heads_q": 16, "heads_kv": 16, "head_dim": 16}],
    "mutant.top_left_causal": [{"seqlen_q": 96, "seqlen_kv": 203, "mask": "causal"}],
    "mutant.window_off_by_one": [{"mask": {"window": [23, 0]}}],
    "mutant.dropout_no_rescale": [{"dropout": 0.1}],
    "mutant.softcap_no_tanh_grad": [{"softcap": 20.0}],
    "mutant.gqa_dkv_mean": [{"heads_kv": 1}],
    "mutant.dropout_renormalised": [{"dropout": 0.1}],
    "mutant.cu_seqlens_off_by_one": [{"seqlens_q": [50, 1, 77], "mask": "causal"}],
    "mutant.cross_document_leak": [{"seqlens_q": [50, 1, 77], "mask": "causal"}],
    "mutant.declared_dkv_in_dtype": [{"seqlen_q": 256, "heads_q": 8, "heads_kv": 1}],
    "mutant.pv_accumulator_in_dtype": [dict(LONG, seqlen_q=n) for n in (512, 1024, 2048)],
    "mutant.dq_accumulator_in_dtype": [dict(LONG, seqlen_q=n) for n in (512, 1024, 2048)],
    "mutant.fp8_descale_v_twice": [{"dtype": "fp8_e5m2"}],
    "mutant.fp8_p_no_prescale": [{"dtype": "fp8_e4m3", "seqlen_q": 512, "mask": "causal"}],
}
INPUTS = ("normal", "shifted_v")


def sweep() -> str:
    """The sweep: every mutant's cases under both input kinds (JSON is YAML)."""
    include = [dict(BASE, **fields, backend=name, inputs=inputs)
               for name, cases in CASES.items() for fields in cases for inputs in INPUTS]
    doc = {"name": "shifted-v-margins", "defaults": {"seed": 0},
           "axes": {"backend": ["naive"]}, "exclude": [{"backend": "naive"}],
           "include": include,
           "options": {"timeout_s": 600, "timing": {"enabled": False}}}
    return json.dumps(doc, indent=1)


def margin(record: dict) -> float:
    if record["case"]["backend"] == "mutant.declared_dkv_in_dtype":
        rows = ((record.get("accuracy") or {}).get("tensors") or {}).values()
        return max((r.get("fused_ratio") or 0.0) for r in rows) / 2.0
    return max((c["value"] / c["bound"] for c in record.get("checks") or []
                if c.get("bound") and isinstance(c.get("value"), (int, float))), default=0.0)


def report(run_dir: Path) -> list[str]:
    found: dict[tuple, dict[str, float]] = collections.defaultdict(dict)
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        c = r["case"]
        key = (c["backend"], c["dtype"], c["seqlen_q"], c["seqlen_kv"], c.get("mask", "none"))
        found[key][c["inputs"]] = margin(r)
    lines = [f"{'mutant':<34}{'dtype':<9}{'Sq/Sk':>10}  {'normal':>8}{'shifted':>9}{'ratio':>7}"]
    for key in sorted(found):
        n, s = found[key].get("normal"), found[key].get("shifted_v")
        ratio = f"{s / n:7.2f}" if n and s else "      -"
        lines.append(f"{key[0]:<34}{key[1]:<9}{f'{key[2]}/{key[3]}':>10}  "
                     f"{n or 0:8.2f}{s or 0:9.2f}{ratio}")
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["sweep"]:
        print(sweep())
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        print("\n".join(report(Path(sys.argv[2]))))
    else:
        sys.exit(__doc__)
