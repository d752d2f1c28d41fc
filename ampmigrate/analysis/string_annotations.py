"""Type annotations written as strings or type comments, and the qualified names they name.

`scaler: "torch.cuda.amp.GradScaler"`, `Optional["torch.cuda.amp.GradScaler"]` and
`x = make()  # type: torch.cuda.amp.GradScaler` reference objects just as code does, but the
name pass sees only a string or a comment. Here the text is parsed as an expression and each
dotted name in it is resolved through the bindings visible where the annotation sits (the
module's imports), never by matching text: `"amp.GradScaler"` names the deprecated class only
where `amp` is bound to `torch.cuda.amp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional

import libcst as cst

from ampmigrate.engine.names import NameIndex

_TYPE_COMMENT = "# type:"


@dataclass(eq=False)
class TextAnnotation:
    """One dotted name inside a string annotation or a type comment."""

    node: cst.CSTNode  # the SimpleString or Comment that holds it
    qname: str  # what the dotted name resolves to
    head: str  # its first name (`torch` of `torch.cuda.amp.GradScaler`)
    head_qname: str  # what that first name is bound to
    expression: cst.BaseExpression  # the parsed text
    dotted: cst.BaseExpression  # the dotted name, a node of `expression`


def text_annotations(names: NameIndex) -> Iterator[TextAnnotation]:
    for string in names.nodes_of_type(cst.SimpleString):
        if _in_annotation(names, string):
            yield from _resolve(names, string, _string_body(string))
    for comment in names.nodes_of_type(cst.Comment):
        text = comment.value
        if text.startswith(_TYPE_COMMENT) and not text[len(_TYPE_COMMENT) :].strip().startswith("ignore"):
            yield from _resolve(names, comment, text[len(_TYPE_COMMENT) :].strip())


def rewritten(annotation: TextAnnotation, new_dotted: cst.BaseExpression) -> Optional[cst.CSTNode]:
    """The string or comment with the dotted name replaced (None where it cannot be spelled)."""
    text = cst.Module([]).code_for_node(
        annotation.expression.deep_replace(annotation.dotted, new_dotted)  # type: ignore[arg-type]
    )
    node = annotation.node
    if isinstance(node, cst.Comment):
        return node.with_changes(value=f"{_TYPE_COMMENT} {text}")
    quote = node.quote
    if quote in text or "\\" in text:
        return None
    return node.with_changes(value=f"{node.prefix}{quote}{text}{quote}")


def _in_annotation(names: NameIndex, node: cst.CSTNode) -> bool:
    for ancestor in names.ancestors(node):
        if isinstance(ancestor, cst.Subscript) and "Literal" in _parts(ancestor.value)[-1:]:
            return False  # `Literal["..."]` holds values, not names
        if isinstance(ancestor, cst.Annotation):
            return True
        if isinstance(ancestor, (cst.BaseStatement, cst.Lambda)):
            return False
    return False


def _string_body(string: cst.SimpleString) -> Optional[str]:
    if "b" in string.prefix.lower() or "f" in string.prefix.lower():
        return None
    value = string.evaluated_value
    # Only a string whose text is its value can be rewritten in place; others are still resolved.
    return value if isinstance(value, str) else None


def _resolve(names: NameIndex, node: cst.CSTNode, text: Optional[str]) -> Iterator[TextAnnotation]:
    if not text or len(text) > 500:
        return
    try:
        expression = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return
    scope = names.scope_of(node)
    for dotted in _dotted_names(expression):
        parts = _parts(dotted)
        bindings = names.lookup(parts[0], scope)
        qnames = {b.qname for b in bindings if b.kind in ("import", "from-import") and b.qname}
        if len(qnames) != 1 or len(bindings) != len([b for b in bindings if b.kind in ("import", "from-import")]):
            continue
        head_qname = next(iter(qnames))
        yield TextAnnotation(node, ".".join([head_qname, *parts[1:]]), parts[0], head_qname, expression, dotted)


def _dotted_names(expression: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The outermost `a.b.c` chains and bare names of the expression."""
    found: List[cst.BaseExpression] = []

    class _Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            if _parts(node):
                found.append(node)
                return False
            return True

        def visit_Name(self, node: cst.Name) -> bool:
            found.append(node)
            return False

    expression.visit(_Visitor())
    return found


def _parts(node: cst.BaseExpression) -> List[str]:
    parts: List[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return []
    parts.append(node.value)
    return parts[::-1]
