"""The case: everything that defines one measurement, its field table and the rules every
field's value goes through.

A :class:`Case` is frozen and hashable: it is what travels to a Dask worker and back, and its
:attr:`Case.id` (a hash of its content) is how a rerun finds what is already done.
:func:`make_case` builds one from a sweep's resolved values (filling the "same as" defaults,
checking the relations between fields); :func:`check_case_dict` reads one back from a record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import operator
from dataclasses import dataclass, fields
from typing import Any, Mapping

from attnbench.dtypes import ALIASES, NAMES, is_fp8
from attnbench.errors import SweepError
from attnbench.sweep.capture_rules import CAPTURED, resolve_capture
from attnbench.sweep.decode_rules import MAX_PAGE_SIZE, check_capacity, check_decode
from attnbench.sweep.fp8_rules import FP8_SCALINGS, MAX_FP8_PROMOTION, check_fp8, default_backward
from attnbench.sweep.packed_rules import MAX_SEQUENCES, check_stored_lengths, resolve_packing
from attnbench.validation import Choice, Flag, Int, Lengths, Name, PowerOfTwo, Real
from attnbench.validation import fail as _fail

MASKS = ("none", "causal", "window")
BIASES = ("none", "alibi")
DRAWN_INPUTS = ("normal", "large_logits", "outliers", "loud_heads", "sink", "kv_apart",
                "shifted_v")
"""The input kinds drawn from the seed (:mod:`attnbench.problem.inputs`)."""
INPUTS = (*DRAWN_INPUTS, CAPTURED)
"""And a user's own activations (:mod:`attnbench.sweep.capture_rules`)."""
CP_ALGOS = ("ring", "zigzag", "allgather")
RING_ALGOS = ("ring", "zigzag")
"""The CP algorithms that pass K/V blocks around a ring (split softmax sums, merged by their
log-sum-exp); ``allgather`` gathers the whole K/V on every rank instead."""
ATTENTION_KINDS = ("MHA", "GQA", "MQA")


def attention_kind(heads_q: Any, heads_kv: Any) -> str:
    """MHA (a KV head per query head), MQA (one KV head for all) or GQA (groups between): the
    one rule, for :attr:`Case.attention_kind`, the coverage matrix and the report's column."""
    if heads_kv == heads_q:
        return "MHA"
    return "MQA" if heads_kv == 1 else "GQA"

# -- limits (every one is checked where a sweep is validated, before anything runs) ------------
MAX_CASES = 1_000_000
"""Cases one sweep may expand to, counted (product of the axes, plus includes) before anything is
expanded: the standard sweep has 256, a lab's nightly matrix (every kernel x shape x dtype x GPU
kind) 10^5-10^6. 10^6 records are ~1 GB of journal; expanding 10^6 cases took 42-96 s and
~400 MiB peak RSS on a loaded 2-core box (linear: 100k took 4 s), and a driver of 10^6 cases
529 MiB (docs/cluster.md). A cap against hostile sweeps, whose YAML is itself capped at 1 MiB: ten
axes of ten values would otherwise be 10^10 cases."""
MAX_SIZE = 2**31 - 1
"""batch, seqlen, heads, head_dim and window bounds: the kernels index in int32."""
MAX_SEED = 2**63 - 1
"""torch.Generator.manual_seed takes [-2^63, 2^64); seeds are kept non-negative and int64."""
MAX_RANKS = 64
"""cp, tp and cp x tp: a case's ranks run on one worker (8 GPUs per node today, 16-64 on the
largest single-node systems), and each CPU rank is a torch process (~300 MB)."""
MAX_NAME = 100
"""Characters in a sweep name: it becomes the run directory ``results/<name>-<UTC time>``."""
MAX_TEXT = 200
"""Characters in a backend or GPU kind name."""


def _case_id(case: "Case") -> str:
    # Fields added later are left out at their default: every stored id stays valid.
    content = case.to_dict()
    for name, default in _LATER_FIELDS.items():
        if content[name] == default:
            del content[name]
    if "captured" in content:  # the call and the content's digest: not where the file sits,
        content["captured"] = content["captured"].rpartition(":")[2]  # so two hosts compare
    payload = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class _IdSlot:
    """Where a :class:`Case` keeps its id once computed (a sha256 of its JSON, ~20-50 us; the
    driver asks for it a dozen times per case). A slot of a base class, not a dataclass field:
    it stays out of ``fields()``, so out of ``to_dict``, eq, hash, repr and pickling, and every
    stored id stays what it was. (An lru_cache of 131k entries thrashed past 131k cases.)"""

    __slots__ = ("_id",)


@dataclass(frozen=True, kw_only=True, slots=True)
class Case(_IdSlot):
    """Everything that defines one measurement. Shapes follow (batch, heads, seqlen, head_dim)."""

    backend: str
    """Registered backend name, or ``module:object`` for a third-party backend."""
    batch: int = 1
    seqlen_q: int = 128
    seqlen_kv: int = 0
    """0 means "same as seqlen_q" (resolved by :func:`make_case`)."""
    seqlens_q: tuple[int, ...] = ()
    """Packed case: each sequence's query length, one after another in one buffer
    (:mod:`attnbench.problem.packing`); batch = its length, seqlen_q = its sum. Empty: dense."""
    seqlens_kv: tuple[int, ...] = ()
    """Packed case: each sequence's key length; seqlen_kv = its sum. How a sweep's values
    become these: :func:`attnbench.sweep.packed_rules.resolve_packing`."""
    heads_q: int = 8
    heads_kv: int = 0
    """0 means "same as heads_q". heads_kv == heads_q is MHA, 1 is MQA, between is GQA."""
    head_dim: int = 64
    head_dim_v: int = 0
    """0 means "same as head_dim"."""
    mask: str = "none"
    """none | causal | window. Causal masks are aligned bottom-right when seqlen_q != seqlen_kv:
    query i sits at key position i + seqlen_kv - seqlen_q (the flash-attn >= 2.1 convention)."""
    window_left: int = -1
    """For mask=window: how many keys before the aligned diagonal a query sees (-1: unbounded)."""
    window_right: int = -1
    """For mask=window: how many keys after the aligned diagonal a query sees (-1: unbounded)."""
    bias: str = "none"
    """none | alibi (per-query-head geometric slopes, bias = -slope * |i_aligned - j|)."""
    dropout: float = 0.0
    softcap: float = 0.0
    """0 disables; otherwise scores become softcap * tanh(scores / softcap) before the bias."""
    dtype: str = "bf16"
    cp: int = 1
    """Context-parallel ranks, 1..MAX_RANKS (and cp * tp <= MAX_RANKS)."""
    cp_algo: str = "ring"
    tp: int = 1
    """Tensor-parallel ranks, 1..MAX_RANKS."""
    gpu: str = "any"
    inputs: str = "normal"
    seed: int = 0
    """0 <= seed <= MAX_SEED (what torch.Generator.manual_seed accepts, kept int64)."""
    decode: bool = False
    """Decode against a KV cache: the seqlen_q (1..MAX_DECODE_Q) new tokens are the cache's
    last positions (bottom-right alignment), forward only (``backward`` is false)."""
    page_size: int = 0
    """Decode only: the cache is stored in pages of this many tokens (a power of two) reached
    through a shuffled block table (flash-attn's ``block_table``); 0 = one contiguous cache."""
    backward: bool = True
    """Whether the backward is run, judged and timed; false for decode and fp8 (forward only)."""
    fp8_scaling: str = "tensor"
    """fp8 dtypes: one descale per tensor, or per (batch row, KV head) -- ``head``
    (:mod:`attnbench.sweep.fp8_rules`)."""
    fp8_promotion: int = 0
    """fp8 dtypes: every this many products the tensor cores' partial sum of P·V (and Q·Kᵀ) is
    added into an fp32 accumulator (tl.dot's ``max_num_imprecise_acc``, CUTLASS's
    ``mma_promotion_interval``; a power of two, at least one wgmma's K of 32). 0: the kernel's
    default, which on sm_90 never promotes (Triton's, and FA3's choice). The accuracy record's
    ``fp8`` section models what each setting costs (:mod:`attnbench.accuracy.fp8_accumulation`)."""
    captured: str = ""
    """``inputs: captured``: the call of a capture file (:mod:`attnbench.capture`) whose q, k, v
    and dout are the inputs, as ``/abs/FILE:call@digest`` (a sweep says ``FILE[:call]``; the
    content's digest makes two captures two cases: :mod:`attnbench.sweep.capture_rules`)."""

    def __post_init__(self):  # lists from JSON: keep the case hashable
        for name in ("seqlens_q", "seqlens_kv"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    # -- derived ----------------------------------------------------------------------------
    @property
    def is_packed(self) -> bool:
        return bool(self.seqlens_q)

    @property
    def tensor_batch(self) -> int:
        """The leading dimension of the case's tensors: 1 for a packed case (one buffer), else
        ``batch``."""
        return 1 if self.is_packed else self.batch

    @property
    def id(self) -> str:
        try:
            return self._id
        except AttributeError:  # not computed yet (or a copy: slots are not pickled)
            value = _case_id(self)
            object.__setattr__(self, "_id", value)  # frozen: the id never changes once made
            return value

    @property
    def world_size(self) -> int:
        return self.cp * self.tp

    @property
    def ring_split(self) -> bool:
        """Context-parallel over a ring: each rank's softmax is split over the K/V blocks it is
        passed (:data:`RING_ALGOS`)."""
        return self.cp > 1 and self.cp_algo in RING_ALGOS

    @property
    def attention_kind(self) -> str:
        return attention_kind(self.heads_q, self.heads_kv)

    @property
    def window_bounds(self) -> tuple[int, int]:
        """(left, right) keys visible around the aligned diagonal, -1 = unbounded; causal is
        (-1, 0). One place for this mapping (flops, AttnSpec)."""
        if self.mask == "none":
            return -1, -1
        if self.mask == "causal":
            return -1, 0
        return self.window_left, self.window_right

    @property
    def mask_label(self) -> str:
        if self.mask != "window":
            return self.mask
        left = "inf" if self.window_left < 0 else str(self.window_left)
        right = "inf" if self.window_right < 0 else str(self.window_right)
        return f"window({left},{right})"

    @property
    def features(self) -> str:
        """A short feature string used to group cases in tables and plots."""
        parts = [self.attention_kind, self.mask_label]
        if self.bias != "none":
            parts.append(self.bias)
        if self.dropout:
            parts.append(f"dropout{self.dropout:g}")
        if self.softcap:
            parts.append(f"softcap{self.softcap:g}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}-{self.cp_algo}")
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        if self.inputs != "normal":
            parts.append(self.inputs)
        if self.is_packed:
            parts.append("packed")  # not the count: packs of several totals form one series
        if self.decode:
            parts.append(f"decode-paged{self.page_size}" if self.page_size else "decode")
        elif not self.backward and not is_fp8(self.dtype):
            # fp8 is forward only by nature: its features stay those of the bf16 case it is
            # compared with (the speed-up panel pairs them)
            parts.append("fwd-only")
        if self.fp8_scaling != "tensor":
            parts.append(f"fp8-per-{self.fp8_scaling}")
        if self.fp8_promotion:
            parts.append(f"promote{self.fp8_promotion}")
        return " ".join(parts)

    @property
    def label(self) -> str:
        return (
            f"{self.backend} {self.dtype} b{self.batch} s{self.seqlen_q}/{self.seqlen_kv} "
            f"h{self.heads_q}/{self.heads_kv} d{self.head_dim}"
            + (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
            + f" {self.features} seed{self.seed}"
            + (f" {self.captured_name}" if self.captured else "")
        )

    @property
    def captured_name(self) -> str:
        """``acts.safetensors:3``: the captured call, as a label shows it (file name, call)."""
        head = self.captured.rpartition("@")[0] or self.captured
        return head.rpartition("/")[2]

    def to_dict(self) -> dict[str, Any]:
        """Every field; a dense case leaves out the empty ``seqlens_*`` (its id stays the one
        it had before packed cases existed)."""
        # One C-level attrgetter, not a getattr per field: expanding 10^6 cases computes 10^6
        # ids, and this was a third of it.
        content = dict(zip(CASE_FIELDS, _field_values(self)))
        for name in _PACKED_FIELDS:  # the only tuple fields
            if content[name]:
                content[name] = list(content[name])
            else:
                del content[name]
        return content

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Case":
        return cls(**{k: v for k, v in data.items() if k in _KNOWN})

    def replace(self, **changes: Any) -> "Case":
        return dataclasses.replace(self, **changes)


CASE_FIELDS = tuple(f.name for f in fields(Case))


def case_fields(*, without: tuple[str, ...] = (), of_type: type | None = None) -> tuple[str, ...]:
    """:data:`CASE_FIELDS` (declaration order) less ``without``, or only those of ``of_type``
    (``int``: the sizes, ranks and seed; ``str``: the names). A subset derived here follows a new
    field; a hand-kept list silently misses it. A name in ``without`` that is no field is an
    error, so a renamed field cannot leave a stale exclusion behind."""
    stale = set(without) - set(CASE_FIELDS)
    if stale:
        raise ValueError(f"not fields of Case: {sorted(stale)}")
    kinds = {"int": int, "str": str, "float": float, "bool": bool}
    return tuple(f.name for f in fields(Case) if f.name not in without
                 and (of_type is None or kinds.get(str(f.type)) is of_type))
_KNOWN = frozenset(CASE_FIELDS)
_field_values = operator.attrgetter(*CASE_FIELDS)
_PACKED_FIELDS = ("seqlens_q", "seqlens_kv")
SWEEP_ONLY_FIELDS = ("varlen",)  # a length generator, expanded into seqlens_q (length_mix)
_CASE_DEFAULTS = {f.name: f.default for f in fields(Case)}
_LATER_FIELDS = {name: _CASE_DEFAULTS[name] for name in ("decode", "page_size", "backward",
                                                                 "fp8_scaling", "fp8_promotion",
                                                                 "captured")}
"""Fields added after ids were first stored (left out of :attr:`Case.id` at their default)."""


# --------------------------------------------------------------------------------------------
# one rule per field and per option (attnbench.validation), for sweeps, stored records, manifests

_SIZE = Int(1, MAX_SIZE, f"a positive integer <= {MAX_SIZE}")
_RANKS = Int(1, MAX_RANKS, f"a positive integer <= {MAX_RANKS} (ranks of one case, on one worker)")
_PRINTABLE = r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+"
MAX_PATH = 4096
"""Characters of a file a case names (PATH_MAX on Linux)."""


class _OrUnset(Name):
    """A :class:`Name`, or "" (the field unset: every case that is not captured)."""

    def check(self, where: str, value: Any) -> str:
        return value if value == "" else Name.check(self, where, value)


CASE_RULES: dict[str, Any] = {
    "backend": Name(_PRINTABLE, "a backend name", MAX_TEXT),
    "batch": _SIZE, "seqlen_q": _SIZE, "seqlen_kv": _SIZE,
    "seqlens_q": Lengths(MAX_SEQUENCES, MAX_SIZE, MAX_SIZE),
    "seqlens_kv": Lengths(MAX_SEQUENCES, MAX_SIZE, MAX_SIZE), "heads_q": _SIZE, "heads_kv": _SIZE,
    "head_dim": _SIZE, "head_dim_v": _SIZE,
    "mask": Choice(MASKS),  # as stored; a sweep spells it none | causal | {window: ...}
    "window_left": Int(-1, MAX_SIZE), "window_right": Int(-1, MAX_SIZE),
    "bias": Choice(BIASES),
    "dropout": Real(0.0, 1.0, hi_open=True, expected="a number in [0, 1)"),
    "softcap": Real(0.0, math.inf, expected="a finite number >= 0 (0 disables softcap)"),
    "dtype": Choice(NAMES, hints=tuple(ALIASES)),
    "cp": _RANKS, "cp_algo": Choice(CP_ALGOS), "tp": _RANKS,
    "gpu": Name(r"[A-Za-z0-9_.+-]+", "a GPU kind such as H100, A100, cpu, or any", MAX_TEXT),
    "inputs": Choice(INPUTS),
    "seed": Int(0, MAX_SEED),
    "decode": Flag(),
    "page_size": PowerOfTwo(MAX_PAGE_SIZE),
    "backward": Flag(),
    "fp8_scaling": Choice(FP8_SCALINGS),
    "fp8_promotion": PowerOfTwo(MAX_FP8_PROMOTION),
    "captured": _OrUnset(_PRINTABLE, "a capture as FILE[:call]", MAX_PATH),
}
"""The rule of every Case field; a sweep's values (:func:`_norm_value`) and a stored record's
case (:func:`check_case_dict`) go through it."""
assert set(CASE_RULES) == set(CASE_FIELDS)


def check_case_dict(where: str, data: Any) -> Case:
    """A case as stored in a record (``mask: window`` with its bounds), checked field by field
    against :data:`CASE_RULES`; fields it lacks take their defaults (older records), fields this
    version does not know are ignored (newer ones). Raises :class:`SweepError`."""
    if not isinstance(data, Mapping):
        raise _fail(where, data, "a case (a JSON object of case fields)")
    values = {}
    for name, rule in CASE_RULES.items():
        if name in data:
            values[name] = rule.check(f"{where}.{name}", data[name])
            _remember(name, data[name])
    if "backend" not in values:
        raise SweepError(f"{where}.backend: missing")
    case = Case(**values)
    check_stored_lengths(where, case)
    if case.cp * case.tp > MAX_RANKS:
        raise _fail(f"{where}.cp", case.cp, f"cp * tp <= {MAX_RANKS} (tp={case.tp})")
    return case


_PASSED: set[tuple[str, type, Any]] = set()
"""(field, type, value) of values their rule passed in :func:`check_case_dict`: a rule depends
on the value alone, and a journal's cases share most values (a few backends, dtypes, lengths),
so :func:`case_dict_passes` knows most read-back cases good by look-ups, without a rule, a
where-string or a Case (issue 29: every reader checks 10^6 cases; ~29 us a case)."""
_PASSED_MAX = 1 << 12
"""Values kept before :data:`_PASSED` is emptied (~0.5 MiB: 4,096 x ~120 B): far more than a
sweep's distinct values but for seeds, each of which costs one case a miss."""


def _remember(name: str, value: Any) -> None:
    if name in _PACKED_FIELDS:  # lengths pass with batch and seqlen_q only: never alone
        return
    if len(_PASSED) >= _PASSED_MAX:
        _PASSED.clear()
    try:
        _PASSED.add((name, type(value), value))  # the type too: True == 1 == 1.0
    except TypeError:  # unhashable: not kept
        pass


def case_dict_passes(data: Any) -> bool:
    """Whether :func:`check_case_dict` passes ``data``, where that is known without it: True
    only where it does (every field a known one holding a value passed before, cp * tp within
    bounds, no lengths); False means ask it. (-0.0 and 0.0 are one value here: every rule
    passes both or neither.)"""
    if type(data) is not dict or "backend" not in data:
        return False
    try:  # each item looked up in C, stopping at the first unknown (lengths: never known)
        known = _PASSED.issuperset(zip(data, map(type, data.values()), data.values()))
    except TypeError:  # unhashable: a list
        return False
    return known and data.get("cp", 1) * data.get("tp", 1) <= MAX_RANKS


def case_value_passes(name: str, value: Any) -> bool:
    """Whether the rule of case field ``name`` passes ``value`` alone (looked up in
    :data:`_PASSED`, else the rule asked and the answer remembered): what
    :func:`check_case_dict` asks of each field but the lengths, for a column's distinct values
    (:mod:`attnbench.results.columnar`). False for a field that is not a case field, a packed
    length, or a value its rule refuses."""
    rule = CASE_RULES.get(name)
    if rule is None or name in _PACKED_FIELDS:
        return False
    try:
        if (name, type(value), value) in _PASSED:
            return True
    except TypeError:  # unhashable: asked below
        pass
    try:
        rule.check(f"case.{name}", value)
    except SweepError:
        return False
    _remember(name, value)
    return True


PUBLIC_FIELDS = tuple(f for f in CASE_FIELDS
                      if f not in ("window_left", "window_right")) + SWEEP_ONLY_FIELDS
"""The fields a sweep names (``mask`` sets the window bounds; ``varlen`` expands into
``seqlens_q``)."""


def make_case(where: str, values: Mapping[str, Any]) -> Case:
    """Build a case from resolved field values, filling the 0 = "same as" defaults and checking
    relations between fields."""
    v = dict(values)
    if "backend" not in v:
        raise SweepError(f"{where}: backend: missing; give it in defaults or axes")
    if v.get("inputs") == CAPTURED or v.get("captured"):
        resolve_capture(where, v)  # the shapes come from the capture
    check_capacity(where, v)
    if v.get("seqlens_q") or v.get("seqlens_kv"):
        resolve_packing(where, v, _CASE_DEFAULTS["seqlen_q"], MAX_SIZE)
    for name, same_as in (("seqlen_kv", "seqlen_q"), ("heads_kv", "heads_q"),
                          ("head_dim_v", "head_dim")):
        if not v.get(name):
            v[name] = v.get(same_as, _CASE_DEFAULTS[same_as])
    if v.get("decode") and "backward" not in v:
        v["backward"] = False  # decode is forward only; asking for backward is an error below
    default_backward(v)
    case = Case(**v)
    check_decode(where, case)
    check_fp8(where, case)
    if case.heads_q % case.heads_kv:
        raise SweepError(f"{where}: heads_kv: got {case.heads_kv}, expected a divisor of "
                         f"heads_q={case.heads_q} (GQA groups must be whole)")
    if case.world_size > MAX_RANKS:
        raise SweepError(f"{where}: cp: cp={case.cp} x tp={case.tp} is {case.world_size} ranks, "
                         f"expected at most {MAX_RANKS} (one case runs on one worker)")
    return case
