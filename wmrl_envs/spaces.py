"""Gymnasium spaces for text actions and observations.

``gymnasium.spaces.Text`` checks every character against a charset that rejects most code
(braces, quotes, newlines). Code and prose are untrusted input graded elsewhere, so the
space here checks only type and length.

Classes: :class:`FreeText`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["FreeText"]

_SAMPLE_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 \n()=:.,'\"_[]{}#+-*/"


class FreeText(spaces.Text):
    """A text space whose ``contains`` checks only ``str`` and ``min_length <= len <= max_length``.

    >>> FreeText(max_length=100).contains("print({'a': 1})\\n")
    True
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_ALPHABET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, FreeText) and self.min_length == other.min_length and self.max_length == other.max_length
        )
