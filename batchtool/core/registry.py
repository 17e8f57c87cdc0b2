"""Names whose modules are imported on first use: a registry of named definitions, and a package's public names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")


class Registry(MutableMapping[str, T]):
    """Name -> definition, where each name's module defines it as `attribute`: the names are known without importing
    anything, and a command imports only the modules of the definitions it uses (`batchtool segment` loads no bucket
    code). A definition may also be set directly (a format a test or a plug-in defines at run time)."""

    def __init__(self, modules: dict[str, str], attribute: str) -> None:
        self._modules = dict(modules)
        self._attribute = attribute
        self._set: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        if name in self._set:
            return self._set[name]
        definition: T = getattr(importlib.import_module(self._modules[name]), self._attribute)
        return definition

    def __setitem__(self, name: str, definition: T) -> None:
        self._set[name] = definition

    def __delitem__(self, name: str) -> None:
        if name in self._set:
            del self._set[name]
        else:
            del self._modules[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._modules, *self._set]))

    def __len__(self) -> int:
        return len(self._modules.keys() | self._set.keys())


def exports(namespace: dict[str, Any], names: Mapping[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A package's module `__getattr__` for its public names, each (module, name there) imported on first use and then
    kept in the package's `namespace` (its globals()): importing the package imports none of its parts."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        module, attribute = names[name]
        value = namespace[name] = getattr(importlib.import_module(module), attribute)
        return value

    return __getattr__


__all__ = ["Registry", "exports"]
