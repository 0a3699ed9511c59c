"""The statements of a module that registering one custom op needs, and nothing else.

Starts from the module's top level with its guards resolved (guards.py) and keeps, in their
order:
- the registration: statements naming `"ns::op"`, a `Library("ns")`'s `define`/`impl` of the
  op, and the code that extends it (`@op.register_fake`, `op.register_autograd(...)`);
- what makes a C++ `TORCH_LIBRARY` block registered: the source string is only data, so the
  statements that hand it to `load_inline`/`load` (directly, or by calling a function that does)
  are kept too, with the `os.environ` settings before them that the build reads;
- transitively, every statement binding a module-level name a kept one reads (depends.py);
- the user's own modules a kept statement imports from, sliced the same way to the names it
  imports (so a repro runs from an empty folder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from reprocut.source.custom_ops.depends import Dependencies, dependencies
from reprocut.source.custom_ops.guards import Facts, code_of, flatten
from reprocut.source.custom_ops.modules import Resolver
from reprocut.source.custom_ops.registration import OpName, extends, walk

BUILDERS = frozenset({"load_inline", "load"})  # torch.utils.cpp_extension's
# calls a data statement may make and still be data (a source string put together)
DATA_CALLS = frozenset({"dedent", "format", "replace", "join", "strip", "str"})
MAX_SIBLING_DEPTH = 4


@dataclass(frozen=True, slots=True)
class Sliced:
    """A module's statements that the registration needs, guards resolved."""

    statements: tuple[cst.BaseStatement, ...]

    @property
    def code(self) -> str:
        return cst.Module(body=_spaced(self.statements)).code if self.statements else ""


def _spaced(statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Blank lines as a module's own: two around functions and classes, none between
    imports, one where the user left one; comments above a statement stay with it (lifted
    out of a guard, a statement keeps the spacing it had inside it otherwise)."""
    spaced = []
    for i, statement in enumerate(statements):
        comments = [line for line in statement.leading_lines if line.comment is not None]
        before = statements[i - 1] if i else None
        if before is None:
            blank = 0
        elif _is_definition(statement) or _is_definition(before):
            blank = 2
        elif _is_import(statement) and _is_import(before):
            blank = 0
        else:
            blank = int(_is_import(before) or len(comments) < len(statement.leading_lines))
        spaced.append(statement.with_changes(leading_lines=[cst.EmptyLine()] * blank + comments))
    return spaced


def _is_definition(statement: cst.BaseStatement | None) -> bool:
    return isinstance(statement, (cst.FunctionDef, cst.ClassDef))


def _is_import(statement: cst.BaseStatement | None) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and _imports(statement)


def top_level(code: str, qualified: str | None, facts: Facts) -> list[cst.BaseStatement]:
    """The module's top-level statements with its guards resolved (`qualified`: the op whose
    registration marks the branches that ran)."""
    name = OpName(qualified) if qualified else None

    def registers(node: cst.CSTNode) -> bool:
        return name is not None and _registration_text(code_of(node), name)

    return flatten(cst.parse_module(code).body, facts, registers)


def _registration_text(text: str, name: OpName) -> bool:
    return (
        name.named_in_python(text)
        or name.in_cpp_library(text)
        or (name.binds_library(text) and name.named_as_schema(text))
    )


def slice_registration(
    code: str, qualified: str, facts: Facts, resolve: Resolver | None = None
) -> Sliced:
    """The statements of `code` that register `qualified`, with all they need."""
    body = top_level(code, qualified, facts)
    graph = dependencies(body)
    roots = _registering(body, graph, OpName(qualified))
    effects, builders = _effects(body, graph, roots, OpName(qualified))
    kept = graph.closure(roots | effects)
    uncalled = {i for i in builders if not any(i in graph.needs[k] for k in kept)}
    uncalled = {i for i in uncalled if _callable_alone(body[i])}
    kept = graph.closure(kept | uncalled)
    kept |= _build_environment(body, kept)
    kept = graph.closure(kept)
    calls = {i: [_call_of(body[i])] for i in uncalled}
    return Sliced(tuple(_inline_siblings(body, kept, facts, resolve, depth=0, after=calls)))


def slice_names(
    code: str, names: Sequence[str], facts: Facts, resolve: Resolver | None, depth: int
) -> list[cst.BaseStatement]:
    """The statements of `code` that bind `names`, with all they need (a sibling module the
    registration imports from)."""
    body = top_level(code, None, facts)
    graph = dependencies(body)
    roots = {i for i, bound in enumerate(graph.binds) if bound & set(names)}
    kept = graph.closure(roots)
    kept |= _build_environment(body, kept)
    kept = graph.closure(kept)
    return _inline_siblings(body, kept, facts, resolve, depth=depth)


# --- roots -----------------------------------------------------------------------------------


def _registering(body: Sequence[cst.BaseStatement], graph: Dependencies, name: OpName) -> set[int]:
    """Statements that register the op in Python or define it with a Library, and those that
    extend a registration (`@op.register_fake`)."""
    texts = [code_of(s) for s in body]
    roots = {i for i, text in enumerate(texts) if name.named_in_python(text)}
    libraries = {n for i, t in enumerate(texts) if name.binds_library(t) for n in graph.binds[i]}
    roots |= {
        i
        for i, statement in enumerate(body)
        if name.named_as_schema(texts[i]) and _reads(statement, libraries)
    }
    op_names = {n for i in roots for n in graph.binds[i]}
    roots |= {
        i for i, statement in enumerate(body) if i not in roots and extends(statement, op_names)
    }
    return roots


def _effects(
    body: Sequence[cst.BaseStatement], graph: Dependencies, roots: set[int], name: OpName
) -> tuple[set[int], set[int]]:
    """Statements that make a registration happen, and the functions that do when called:
    a C++ library's source (TORCH_LIBRARY) is registered by the statements that hand it to a
    build, directly or through a function; data they pass on (`SOURCE = HEADER + CPP`) carries
    it to its readers; a function that registers in its body registers when called."""
    data = {i for i, s in enumerate(body) if _holds_cpp_library(s, name)}
    builders = {
        i for i in roots if isinstance(body[i], cst.FunctionDef) and _registers_inside(body[i])
    }
    effects: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, statement in enumerate(body):
            if i in data | builders | effects:
                continue
            if isinstance(statement, cst.FunctionDef) and graph.needs[i] & data:
                builders.add(i)  # calling it builds the library
                changed = True
            elif (
                isinstance(statement, cst.SimpleStatementLine)
                and graph.needs[i] & (data | builders)
                and not _imports(statement)
            ):
                effects.add(i)
                if _is_data(statement):
                    data.add(i)
                changed = True
    return effects | data, builders


def _holds_cpp_library(statement: cst.BaseStatement, name: OpName) -> bool:
    """A line holding a string with the namespace's TORCH_LIBRARY block (or an impl of it)."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(node, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))
        and name.in_cpp_library(code_of(node))
        for node in walk(statement)
    )


def _registers_inside(function: cst.BaseStatement) -> bool:
    """A function whose body (not its decorators) registers: calling it registers."""
    assert isinstance(function, cst.FunctionDef)
    decorators = "".join(code_of(d) for d in function.decorators)
    return "::" not in decorators and "Library(" not in decorators


def _callable_alone(function: cst.BaseStatement) -> bool:
    """A builder that can be called with no arguments and runs no loop (not a `main()` or
    `train()` that also builds): a call of it at the top level registers and does no more."""
    assert isinstance(function, cst.FunctionDef)
    params = function.params
    required = [p for p in (*params.posonly_params, *params.params) if p.default is None]
    required += [p for p in params.kwonly_params if p.default is None]
    loops = any(isinstance(n, (cst.For, cst.While)) for n in walk(function.body))
    return not required and not loops and function.name.value != "main"


def _call_of(function: cst.BaseStatement) -> cst.BaseStatement:
    """`build()`: the call that registers, put right after the builder's def."""
    assert isinstance(function, cst.FunctionDef)
    return cst.SimpleStatementLine([cst.Expr(cst.Call(func=function.name))])


def _build_environment(body: Sequence[cst.BaseStatement], kept: set[int]) -> set[int]:
    """`os.environ[...] = ...` / `os.environ.setdefault(...)` before the first kept build: the
    build reads them (TORCH_CUDA_ARCH_LIST, CC, MAX_JOBS)."""
    first = min((i for i in kept if _calls_builder(body[i])), default=None)
    if first is None:
        return set()
    return {i for i in range(first) if "os.environ" in code_of(body[i]) and _sets_environ(body[i])}


def _calls_builder(statement: cst.BaseStatement) -> bool:
    return any(isinstance(n, cst.Call) and _callee(n) in BUILDERS for n in walk(statement))


def _sets_environ(statement: cst.BaseStatement) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Assign) and any(
            code_of(t.target).startswith("os.environ[") for t in small.targets
        ):
            return True
        if (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and code_of(small.value.func) in ("os.environ.setdefault", "os.environ.update")
        ):
            return True
    return False


def _callee(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _is_data(statement: cst.SimpleStatementLine) -> bool:
    """An assignment that only puts values together (no call but string methods)."""
    if not all(isinstance(s, (cst.Assign, cst.AnnAssign, cst.AugAssign)) for s in statement.body):
        return False
    return all(_callee(n) in DATA_CALLS for n in walk(statement) if isinstance(n, cst.Call))


def _imports(statement: cst.SimpleStatementLine) -> bool:
    return any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)


def _reads(statement: cst.CSTNode, names: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in walk(statement))


# --- the user's own modules ------------------------------------------------------------------


def _inline_siblings(
    body: Sequence[cst.BaseStatement],
    kept: set[int],
    facts: Facts,
    resolve: Resolver | None,
    depth: int,
    after: dict[int, list[cst.BaseStatement]] | None = None,
) -> list[cst.BaseStatement]:
    """The kept statements in order (each followed by its `after` statements), each
    `from sibling import a, b` replaced by the sibling's statements binding a and b
    (`b as c`: followed by `c = b`)."""
    out: list[cst.BaseStatement] = []
    for i in sorted(kept):
        statement = body[i]
        source = _sibling_source(statement, resolve) if depth < MAX_SIBLING_DEPTH else None
        if source is None:
            out.extend([statement, *(after or {}).get(i, [])])
            continue
        path, aliases = source
        inlined = slice_names(
            path.read_text(), [n for n, _ in aliases], Facts(cuda=facts.cuda,
                                                             importable=facts.importable),
            resolve, depth + 1,
        )  # fmt: skip
        out.extend(s for s in inlined if code_of(s) not in {code_of(o) for o in out})
        out.extend(_bind(alias, name) for name, alias in aliases if alias != name)
    return out


def _bind(alias: str, name: str) -> cst.SimpleStatementLine:
    """`alias = name`: what `from sibling import name as alias` bound."""
    target = cst.AssignTarget(cst.Name(alias))
    return cst.SimpleStatementLine([cst.Assign(targets=[target], value=cst.Name(name))])


def _sibling_source(
    statement: cst.BaseStatement, resolve: Resolver | None
) -> tuple[Path, list[tuple[str, str]]] | None:
    """(the file, [(imported name, bound name)]) of `from sibling import ...`; None otherwise."""
    if resolve is None or not isinstance(statement, cst.SimpleStatementLine):
        return None
    if len(statement.body) != 1 or not isinstance(statement.body[0], cst.ImportFrom):
        return None
    small = statement.body[0]
    if small.relative or small.module is None or isinstance(small.names, cst.ImportStar):
        return None
    path = resolve(code_of(small.module))
    if path is None:
        return None
    aliases = []
    for alias in small.names:
        name = code_of(alias.name)
        bound = code_of(alias.asname.name) if alias.asname else name
        aliases.append((name, bound))
    return path, aliases
