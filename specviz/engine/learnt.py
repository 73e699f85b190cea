"""What a pair's steps taught about its drafts' acceptance, kept beyond one request.

Every engine of a pair in this process (the class's shared batch, a lesson's cells, the warm-up) adds each
step's verdicts here, whatever policy drafted them, and a new budget starts from a copy: adaptive
verification on a pair the class has used starts warm instead of from its prior, and learns what the
fixed-depth Runs beside it saw. Shared by many threads: engines add under the lock and read copies, so no
engine ever holds a table another one writes.
"""
from __future__ import annotations

import copy
import threading

from specviz.engine.acceptance import FORGET, AcceptanceTable


class Learnt:
    """The pair's two acceptance tables (model drafts by confidence bin, keyed drafts by key)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables = {False: AcceptanceTable(), True: AcceptanceTable(pooled=True)}

    def add(self, keyed: bool, seen: dict[tuple[int, int], list[int]]) -> None:
        """One step's tallies: (key, position) → [reached, kept]."""
        with self._lock:
            table = self._tables[keyed]
            table.forget(FORGET)
            for (key, j), (n, kept) in seen.items():
                table.observe_many(key, j, n, kept)

    def copy(self) -> tuple[AcceptanceTable, AcceptanceTable]:
        """(confident, keyed): copies the caller owns."""
        with self._lock:
            return copy.deepcopy(self._tables[False]), copy.deepcopy(self._tables[True])
