"""Capturing the attention calls of a user's own model, and reading captures safely.

:mod:`~.recorder` (:func:`capture_attention`: a context manager that records q, k, v and dout of
chosen ``scaled_dot_product_attention`` calls), :mod:`~.file_format` (the capture file: a
safetensors file written here, or torch.save's zip), :mod:`~.loader` (reading one from anyone:
no code runs, every size checked before it is allocated), :mod:`~.replay` (a captured call
as a case: the fields it fixes, its tensors behind a digest), :mod:`~.listing` (one line per
call) and :mod:`~.command` (``attnbench capture``: ``--list FILE``, or a script run inside a
capture).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "command": ("add_capture_command", "cmd_capture"),
    "file_format": ("CALL_FIELDS", "PARTS", "tensor_name"),
    "listing": ("call_line", "list_capture"),
    "loader": ("CaptureIndex", "CapturedCall", "TensorEntry", "load_capture", "read_index"),
    "recorder": ("AttentionRecorder", "capture_attention"),
    "replay": ("contradictions", "file_digest", "parse_reference", "reference", "replay_fields",
               "replay_tensors"),
})
