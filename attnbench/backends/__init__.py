"""Backend registry: built-in names, ``module:object`` references and entry points.

Dispatch lives here and nowhere else. Built-ins are imported lazily, so validating a sweep or
running the Dask client never imports torch.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from typing import Any, Optional

from attnbench import package_face
from attnbench.backends.base import Backend, Forward, Unsupported, compiling, on_compile
from attnbench.backends.capabilities import Capabilities, World, refusal
from attnbench.validation import suggestion

__all__ = ["Backend", "Forward", "Unsupported", "compiling", "on_compile", "Capabilities", "World",
           "refusal", "BUILTIN", "get_backend", "check_backend_name", "backend_names",
           "public_names", "registered", "load_object"]
# The implementations, for backends built on ours (the mutants, a user's subclass): imported
# when first asked for, so the registry itself never imports torch.
_IMPLEMENTATIONS, __getattr__ = package_face(__name__, {
    "adapters": ("FlashAttnBackend", "XformersBackend"),
    "flash_attn3": ("FlashAttn3Backend",),
    "flex": ("FlexBackend",),
    "flex_mods": ("Mods", "call_mods"),
    "importable": ("importable_here", "one_line", "third_party", "unimportable"),
    "masks": ("PreparesOnce", "dense_masks", "release_prepared"),
    "naive": ("NaiveBackend",),
    "readiness": ("Readiness", "backend_readiness", "prepare_interpreter"),
    "reference_backend": ("ReferenceBackend",),
    "source_names": ("MAX_SOURCE_BYTES", "top_level_names"),
    "sdpa": ("SdpaBase", "SdpaCudnn", "SdpaDefault", "SdpaEfficient", "SdpaFlash", "SdpaMath",
             "attention_mask"),
    "transformer_engine": ("TransformerEngineBackend",),
    "triton_backend": ("TritonBackend", "flash_params", "triton_keep_mask"),
})
__all__ += _IMPLEMENTATIONS

# name -> "module:factory"; a factory is called with no arguments and returns a Backend.
BUILTIN: dict[str, str] = {
    "reference": "attnbench.backends.reference_backend:ReferenceBackend",
    "naive": "attnbench.backends.naive:NaiveBackend",
    "sdpa": "attnbench.backends.sdpa:SdpaDefault",
    "sdpa_math": "attnbench.backends.sdpa:SdpaMath",
    "sdpa_flash": "attnbench.backends.sdpa:SdpaFlash",
    "sdpa_efficient": "attnbench.backends.sdpa:SdpaEfficient",
    "sdpa_cudnn": "attnbench.backends.sdpa:SdpaCudnn",
    "flex": "attnbench.backends.flex:FlexBackend",
    "triton": "attnbench.backends.triton_entry:make_triton_backend",  # stand-in without triton
    "flash_attn": "attnbench.backends.adapters:FlashAttnBackend",
    "flash_attn3": "attnbench.backends.flash_attn3:FlashAttn3Backend",
    "transformer_engine": "attnbench.backends.transformer_engine:TransformerEngineBackend",
    "xformers": "attnbench.backends.adapters:XformersBackend",
}
# Test-only backends that misbehave on purpose (segfault, hang, ...): real code, never in
# user sweeps by accident because their names say what they are.
BUILTIN.update({
    "testing.segfault": "attnbench.execution.testing:SegfaultBackend",
    "testing.hang": "attnbench.execution.testing:HangBackend",
    "testing.oom": "attnbench.execution.testing:OomBackend",
    "testing.raises": "attnbench.execution.testing:RaisesBackend",
    "testing.noop": "attnbench.execution.testing:NoopBackend",
})
# More name tables, as "module:table" like the entries above: the selftest's catalogue of
# plausible bugs (attnbench.mutants, named mutant.*) is data in a package that sits above this
# registry (its backends are built on ours), so it is read when a name is looked up.
TABLES = ("attnbench.mutants.catalogue:BACKENDS",)
ENTRY_POINT_GROUP = "attnbench.backends"

_cache: dict[str, Backend] = {}
_registered: dict[str, str] = {}


def registered() -> dict[str, str]:
    """Every built-in name -> "module:factory": :data:`BUILTIN` and the :data:`TABLES`."""
    if not _registered:
        table = dict(BUILTIN)
        for ref in TABLES:
            table.update(load_object(ref))
        _registered.update(table)
    return _registered


def _entry_points() -> dict[str, str]:
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # broken metadata of an unrelated package must not stop a sweep
        return {}
    return {ep.name: ep.value for ep in eps}


def backend_names() -> list[str]:
    return sorted(set(registered()) | set(_entry_points()))


def public_names() -> list[str]:
    """The names a user's sweep would use: not the test-only backends and mutants."""
    return [n for n in backend_names() if not n.startswith(("testing.", "mutant."))]


_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")


def check_backend_name(name: str) -> Optional[str]:
    """None if ``name`` is a registered backend, an entry point or of the form
    ``module:object``, else a user-facing explanation. Imports nothing: validating a sweep must
    not run code. Whether a ``module:object``'s module can be found is a separate look
    (:mod:`attnbench.backends.importable`, which imports nothing either: validate and run)."""
    if name in registered() or name in _entry_points():
        return None
    if ":" in name:
        if _REF.match(name):
            return None
        return (f"got {name!r}, expected a third-party backend as 'module:object' (a dotted "
                "module path, a colon, an attribute name)")
    public = public_names()
    return (f"got {name!r}, expected one of {', '.join(public)} "
            f"or a third-party backend as 'module:object'{suggestion(name, public)}")


def load_object(ref: str, kind: str = "object") -> Any:
    """The object ``ref`` ("module:attr.attr") names, its module imported: a backend or a table
    here, a rank function in :mod:`attnbench.execution.child`. ``kind`` names what is expected
    in the error for a ref without both parts."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{ref!r} is not of the form 'module:{kind}'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


PROTOCOL = ("forward", "backward", "supports")


def _satisfies(obj: Any) -> bool:
    """Whether ``obj`` (a class or an instance) has the protocol's methods."""
    return all(callable(getattr(obj, attr, None)) for attr in PROTOCOL)


def _instantiate(obj: Any, name: str, trusted: bool = False) -> Backend:
    """The backend ``obj`` stands for. Only what satisfies the protocol is used: a class with
    ``forward``, ``backward`` and ``supports`` is instantiated (no arguments), an instance that
    has them is used as it is. Nothing else is called: ``os:getcwd`` or ``subprocess:Popen``
    named in a sweep is refused, not run. ``trusted`` (built-ins, installed entry points) also
    allows a zero-argument factory, whose result must satisfy the protocol."""
    if isinstance(obj, type):
        if not _satisfies(obj):
            lacks = [a for a in PROTOCOL if not callable(getattr(obj, a, None))]
            raise TypeError(f"backend {name!r}: class {obj.__qualname__} lacks "
                            f"{', '.join(lacks)}() (see attnbench.backends.base); not instantiated")
        backend = obj()
    elif _satisfies(obj):
        backend = obj
    elif trusted and callable(obj):
        backend = obj()
    else:
        what = f"{type(obj).__name__} {getattr(obj, '__qualname__', '')}"
        raise TypeError(f"backend {name!r} is {what}, not a backend class or instance (forward, "
                        "backward and supports, see attnbench.backends.base); attnbench calls "
                        "nothing else")
    for attr in PROTOCOL:
        if not callable(getattr(backend, attr, None)):
            raise TypeError(f"backend {name!r} has no {attr}() (see attnbench.backends.base)")
    if not hasattr(backend, "keep_mask"):
        backend.keep_mask = None  # type: ignore[attr-defined]
    if not getattr(backend, "name", None):
        backend.name = name  # type: ignore[attr-defined]
    return backend


def get_backend(name: str) -> Backend:
    """Resolve a backend by registered name, entry point or ``module:object``."""
    if name in _cache:
        return _cache[name]
    known = registered().get(name) or _entry_points().get(name)
    ref = known or (name if ":" in name else None)
    if ref is None:
        raise KeyError(check_backend_name(name))
    backend = _instantiate(load_object(ref), name, trusted=known is not None)
    _cache[name] = backend
    return backend
