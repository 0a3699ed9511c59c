"""Named libcst passes that cut a user's script down, one candidate module text at a time.

The protocol and shared helpers are in `tree`; each pass module holds one kind of change.
The order of PASSES is the order of a round: big cuts first. The jump to the failing call comes
first, made from the script with its modules pasted in (`jump_ahead`), then again right after
they are inlined one at a time (it needs the failing function's body): one check of it replaces
the training run every later check would otherwise pay; the fine passes follow.
"""

from __future__ import annotations

from reprocut.source.passes.expressions import (
    drop_arguments,
    hoist_subexpressions,
    integer_value,
    shrink_integers,
    simplify_expressions,
)
from reprocut.source.passes.focus_calls import calls_focus, focus_callee
from reprocut.source.passes.inlining import (
    import_module_name,
    inline_calls,
    inline_sibling_imports,
    sibling_file,
    sibling_imports,
)
from reprocut.source.passes.jump import jump_ahead, jump_to_call
from reprocut.source.passes.specs import (
    literal,
    replace_with_specs,
    seeds_its_randomness,
    spec_expression,
    without_seed,
)
from reprocut.source.passes.statements import (
    delete_statements,
    inline_names,
    remove_all_unused,
    remove_unused_definitions,
    strip_comments,
    unwrap_blocks,
)
from reprocut.source.passes.tensor_facts import fold_tensor_facts, folded
from reprocut.source.passes.tree import (
    COMPOUND,
    PassContext,
    SourcePass,
    candidates,
    is_constant,
    parse,
)

PASSES: tuple[SourcePass, ...] = (
    jump_ahead,
    inline_sibling_imports,
    jump_to_call,
    strip_comments,
    replace_with_specs,
    remove_all_unused,
    delete_statements,
    unwrap_blocks,
    inline_calls,
    remove_unused_definitions,
    simplify_expressions,
    inline_names,
    hoist_subexpressions,
    fold_tensor_facts,
    drop_arguments,
    shrink_integers,
)

__all__ = [
    "COMPOUND",
    "PASSES",
    "PassContext",
    "SourcePass",
    "calls_focus",
    "candidates",
    "delete_statements",
    "drop_arguments",
    "focus_callee",
    "fold_tensor_facts",
    "folded",
    "hoist_subexpressions",
    "import_module_name",
    "inline_calls",
    "inline_names",
    "inline_sibling_imports",
    "integer_value",
    "is_constant",
    "jump_ahead",
    "jump_to_call",
    "literal",
    "parse",
    "remove_all_unused",
    "remove_unused_definitions",
    "replace_with_specs",
    "seeds_its_randomness",
    "shrink_integers",
    "sibling_file",
    "sibling_imports",
    "simplify_expressions",
    "spec_expression",
    "strip_comments",
    "unwrap_blocks",
    "without_seed",
]
