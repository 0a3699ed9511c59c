"""Which top-level statements each top-level statement needs: the module-level names it reads,
wherever it reads them (a function's body, a default, a decorator, a class body, an annotation),
resolved by libcst's scope analysis, so a function's own parameters and locals do not pull in a
training loop's variables of the same name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import GlobalScope, MetadataWrapper, ScopeProvider

from reprocut.source.custom_ops.registration import walk


@dataclass(frozen=True, slots=True)
class Dependencies:
    """`needs[i]`: the indices of the statements binding a module-level name statement i
    reads; `binds[i]`: the module-level names statement i binds."""

    needs: tuple[frozenset[int], ...]
    binds: tuple[frozenset[str], ...]

    def closure(self, roots: set[int]) -> set[int]:
        """`roots` and every statement they need, transitively."""
        kept, pending = set(roots), list(roots)
        while pending:
            for needed in self.needs[pending.pop()]:
                if needed not in kept:
                    kept.add(needed)
                    pending.append(needed)
        return kept


def dependencies(body: Sequence[cst.BaseStatement]) -> Dependencies:
    """The dependency graph of `body`'s statements (a module's top level, guards resolved)."""
    module = cst.Module(body=list(body))
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)  # node identity: ours
    scopes = wrapper.resolve(ScopeProvider)
    owner: dict[int, int] = {}
    for index, statement in enumerate(body):
        for node in walk(statement):
            owner[id(node)] = index
    global_scope = next(s for s in scopes.values() if isinstance(s, GlobalScope))
    needs: list[set[int]] = [set() for _ in body]
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            reader = owner.get(id(access.node))
            if reader is None:
                continue
            for referent in access.referents:
                if referent.scope is not global_scope:
                    continue
                writer = owner.get(id(getattr(referent, "node", None)))
                if writer is not None and writer != reader:
                    needs[reader].add(writer)
    binds: list[set[str]] = [set() for _ in body]
    for assignment in global_scope.assignments:
        writer = owner.get(id(getattr(assignment, "node", None)))
        if writer is not None:
            binds[writer].add(assignment.name)
    return Dependencies(
        needs=tuple(frozenset(n) for n in needs), binds=tuple(frozenset(b) for b in binds)
    )
