"""Module paths that exist: `model.encoder.embed` is what `model.get_submodule` resolves.

A root (a module first seen outside any other) is named after what holds it in the user's code:
the `self` whose submodule it is (a LightningModule's `self.net` called from `training_step`),
else the user's variable, else its class name as it is (`BertForSequenceClassification`, a type,
never mistaken for a variable). Its submodules get their `named_modules` paths. A module that is
no registered submodule, such as a `CrossEntropyLoss()` made inside `forward`, is named after its
nearest real parent, or not at all: a made-up attribute path sends people looking for it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from types import FrameType

import torch

from reprocut.record.inside.frame_locals import local_values
from reprocut.record.inside.frames import is_user_file


class ModuleNames:
    """Names modules as the module hooks enter and leave them; keeps the entered objects."""

    def __init__(self) -> None:
        self.names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._unregistered: weakref.WeakKeyDictionary[torch.nn.Module, str] = (
            weakref.WeakKeyDictionary()
        )
        self.entered: list[torch.nn.Module] = []  # parallel to the name stack

    def enter(self, module: torch.nn.Module) -> str:
        """The module's path; the module goes on the stack of entered ones."""
        name = self.names.get(module) or self._unregistered.get(module)
        if name is None and self.entered:
            name = self._name_inside(module)
        if name is None:
            name = self._name_root(module)
        self.entered.append(module)
        return name

    def exit(self) -> None:
        if self.entered:
            self.entered.pop()

    def innermost(self, calls: list[FrameType]) -> str | None:
        """The path of the module being called, from the frames of the module calls on the
        stack (innermost first; frames.module_calls): what the module hooks' stack would hold
        on top. Light steps find it so, without hooks on every module call."""
        name = None
        depth = len(self.entered)
        for call in reversed(calls):
            module = local_values(call).get("self")
            if isinstance(module, torch.nn.Module):
                name = self.enter(module)
        del self.entered[depth:]
        return name

    def _name_inside(self, module: torch.nn.Module) -> str | None:
        """A module first seen inside another's forward: a submodule registered after its
        root was indexed gets its path; anything else its nearest real parent's name."""
        for parent in reversed(self.entered):
            parent_name = self.names.get(parent)
            if parent_name is None:
                continue
            for path, sub in parent.named_modules(prefix=parent_name):
                self.names.setdefault(sub, path)
            name = self.names.get(module)
            if name is not None:
                return name
            self._unregistered[module] = parent_name
            return parent_name
        return None

    def _name_root(self, module: torch.nn.Module) -> str:
        owner = _owner(module, sys._getframe(1))
        if owner is not None:
            self._index(owner, self.names.get(owner) or self._root_name(owner))
            found = self.names.get(module)
            if found is not None:
                return found
        name = self._root_name(module)
        self._index(module, name)
        return self.names.get(module, name)

    def _index(self, root: torch.nn.Module, name: str) -> None:
        for path, sub in root.named_modules(prefix=name):
            self.names.setdefault(sub, path)

    def _root_name(self, module: torch.nn.Module) -> str:
        return _variable_name(module, sys._getframe(1)) or type(module).__name__


def _user_frames(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def _owner(module: torch.nn.Module, frame: FrameType | None) -> torch.nn.Module | None:
    """The innermost user method's `self` of which `module` is a submodule."""
    for user_frame in _user_frames(frame):
        owner = local_values(user_frame).get("self")
        if (
            isinstance(owner, torch.nn.Module)
            and owner is not module
            and any(sub is module for sub in owner.modules())
        ):
            return owner
    return None


def _variable_name(module: torch.nn.Module, frame: FrameType | None) -> str | None:
    """The name the user's code holds the module by: a variable, or an attribute of a plain
    object's `self` (`self.model` of a training class)."""
    for user_frame in _user_frames(frame):
        local = local_values(user_frame)
        for scope in (local, user_frame.f_globals):
            for name, value in scope.items():
                if value is module and not name.startswith("_") and name != "self":
                    return name
        owner = local.get("self")
        if owner is not None and owner is not module and not isinstance(owner, torch.nn.Module):
            for name, value in getattr(owner, "__dict__", {}).items():
                if value is module:
                    return name
    return None
