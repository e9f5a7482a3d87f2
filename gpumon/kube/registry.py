"""One informer per (resource, selectors) in a process, shared by every reader that asks.

The model is controller-runtime's shared informer cache: loops do not build informers, they ask
the process's :class:`Informers` for the informer of a :class:`~gpumon.kube.informer.Selection`
(a resource path, a label selector, a field selector) and take a view of it
(``informers.informer(selection).view(convert, name=...)``): every view of one selection is fed
by one list and one watch. Each view keeps its own converted values, so two readers that need different
things of one object (the reconciler's and the autoscaler's ResourceClaims) share the watch and
not a representation. A selection is the key as written: two selectors that mean the same set
but are spelled differently are two informers.
"""

from __future__ import annotations

from typing import Any

from gpumon.kube.informer import Informer, Selection


class Informers:
    """The process's informers by selection; ``options`` go to every :class:`Informer` made."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._by_selection: dict[Selection, Informer] = {}

    def informer(self, selection: Selection) -> Informer:
        """The one informer of ``selection``, made on first ask."""
        found = self._by_selection.get(selection)
        if found is None:
            found = self._by_selection[selection] = Informer(selection, **self._options)
        return found

    @property
    def informers(self) -> list[Informer]:
        return list(self._by_selection.values())
