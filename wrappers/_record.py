"""Constructor-argument recording, so ``env.spec`` can rebuild a wrapper stack.

Gymnasium's :class:`~gymnasium.utils.RecordConstructorArgs` saves a wrapper's keyword
arguments; :attr:`gymnasium.Wrapper.spec` lists them in ``spec.additional_wrappers``, and
``gymnasium.make(env.spec)`` re-applies each wrapper with them. Gymnasium deep-copies those
arguments (at construction and whenever a spec is copied), which would copy a world model
(trees, or an LM's weights) once per layer and per ``spec`` access. The wmrl wrappers record
them *by reference* instead: a rebuilt stack shares the same world model object, which is
what a rebuild should do (world models are frozen). Vector forms record their arguments too,
like Gymnasium's own vector wrappers, although Gymnasium's ``VectorWrapper.spec`` does not
list wrappers (``make_vec`` cannot re-apply them).

Private module: :func:`record_constructor_args`.
"""

from __future__ import annotations

from typing import Any

from gymnasium.utils import RecordConstructorArgs

__all__ = ["record_constructor_args"]


class _SharedKwargs(dict):
    """Recorded keyword arguments whose values are shared, not copied, by ``deepcopy``."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedKwargs:
        return _SharedKwargs(self)


def record_constructor_args(wrapper: RecordConstructorArgs, **kwargs: Any) -> None:
    """Record ``kwargs`` (without ``env``) as ``wrapper``'s constructor arguments, by reference."""
    RecordConstructorArgs.__init__(wrapper, _disable_deepcopy=True, **kwargs)
    wrapper._saved_kwargs = _SharedKwargs(wrapper._saved_kwargs)
