"""``attnbench show``: counts, failing cases and findings of a run, and a line per case.

``summary`` (one pass over a run: what ``show`` and the end of ``attnbench run`` print),
``case_lines`` (``--all``'s line per case), ``sorted_lines`` (those lines sorted in bounded
memory), ``columns`` (a summary from a journal block's Arrow columns).
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "summary": ("RunSummary",),
    "case_lines": ("label_and_line",),
    "sorted_lines": ("SortedLines",),
    "columns": ("add_block", "summarise"),
})
