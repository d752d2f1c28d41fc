"""Source positions of CST nodes, the same as LibCST's PositionProvider, about five times faster.

PositionProvider regenerates the module's code and, for every token, splits it on newlines to
keep a line/column counter, and for every node builds position objects. On a large file that
costs more than parsing it. Here the same code generation only notes, for every node, the index
of the token where it starts and ends (with the same hoisting rules: `record_syntactic_position`
and the `start_node`/`end_node` overrides); a token index becomes a line and column only when a
position is asked for, from the cumulative token lengths and the newline offsets of the code.

A test compares every node's position with PositionProvider's over the fixtures and real files.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst.metadata import CodePosition, CodeRange
from libcst._nodes.internal import CodegenState

# The newline spellings PositionProvider counts (libcst.metadata.position_provider.NEWLINE_RE).
_NEWLINE = re.compile(r"\r\n?|\n")


@dataclass(frozen=False)
class _TokenIndexState(CodegenState):
    # By `id(node)`: a CST node's own `__hash__` is Python code, called twice per node here
    # (the module keeps every node alive, so no other object has its id meanwhile).
    ranges: Dict[int, Tuple[int, int]] = field(default_factory=dict)
    starts: List[int] = field(default_factory=list)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.starts.append(len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.starts.pop()
        key = id(node)
        if key not in self.ranges:  # a syntactic position recorded inside wins
            self.ranges[key] = (start, len(self.tokens))

    def pop_trailing_newline(self) -> None:
        # PositionProvider's counters have already moved past this newline when the module
        # drops it; keeping the token keeps token indices and counters in step.
        pass

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ) -> "_Recording":
        # A class, not a generator with @contextmanager: this is entered for most nodes
        # (every parenthesizable expression), and a generator's context manager costs several
        # Python calls per use.
        return _Recording(self, node, start_node, end_node)


class _Recording:
    """The range of `node` from the tokens generated inside the `with` block (or from the
    recorded ranges of `start_node` / `end_node`)."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(
        self,
        state: _TokenIndexState,
        node: cst.CSTNode,
        start_node: Optional[cst.CSTNode],
        end_node: Optional[cst.CSTNode],
    ) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = len(self.state.tokens)

    def __exit__(self, *exc_info: object) -> None:
        state = self.state
        start, end = self.start, len(state.tokens)
        if self.start_node is not None:
            start = state.ranges[id(self.start_node)][0]
        if self.end_node is not None:
            end = state.ranges[id(self.end_node)][1]
        state.ranges[id(self.node)] = (start, end)


class Positions:
    """`positions[node]` -> CodeRange (1-based lines, 0-based columns), for every node of `module`.

    The code is generated as far as the nodes asked for need, one top-level statement at a
    time: a file whose findings are all near its start is not generated to its end. Tokens
    are the same as a whole module's generation gives (it is sequential), so are positions."""

    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._state = state = _TokenIndexState(default_indent=module.default_indent, default_newline=module.default_newline)
        self._ranges = state.ranges
        state.before_codegen(module)  # as `module._codegen(state)` does, a statement at a time
        for header in module.header:
            header._codegen(state)
        self._next = 0  # the next statement of `module.body` to generate
        self._finished = False
        self._offsets = [0]  # the offset of each token generated (and of the end)
        self._line_starts = [0]
        self._scanned = 0  # tokens whose offsets and newlines are counted
        self._ends_with_cr = False

    def _generate(self, node: cst.CSTNode) -> None:
        """Generate until `node` has its range, or the whole module."""
        module, state = self._module, self._state
        key = id(node)
        while key not in self._ranges and not self._finished:
            if self._next < len(module.body):
                module.body[self._next]._codegen(state)
                self._next += 1
                continue
            for footer in module.footer:  # the rest of `Module._codegen_impl`
                footer._codegen(state)
            if module.has_trailing_newline:
                if len(state.tokens) == 0:
                    state.add_token(state.default_newline)
            else:
                state.pop_trailing_newline()
            state.after_codegen(module)
            self._finished = True
        tokens = state.tokens
        if self._scanned == len(tokens):
            return
        new = tokens[self._scanned :]
        base = self._offsets[-1]
        self._offsets.extend(itertools.islice(itertools.accumulate(map(len, new), initial=base), 1, None))
        code = "".join(new)
        if self._ends_with_cr and code.startswith("\n"):
            self._line_starts.pop()  # "\r" then "\n": one newline, which ends after the "\n"
        self._line_starts.extend(base + match.end() for match in _NEWLINE.finditer(code))
        if code:
            self._ends_with_cr = code.endswith("\r")
        self._scanned = len(tokens)

    def _position(self, token_index: int) -> CodePosition:
        offset = self._offsets[token_index]
        line = bisect.bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        self._generate(node)
        try:
            start, end = self._ranges[id(node)]
        except KeyError:
            raise KeyError(node) from None
        return CodeRange(self._position(start), self._position(end))

    def __contains__(self, node: cst.CSTNode) -> bool:
        self._generate(node)
        return id(node) in self._ranges
