"""A part of a dataset written as a Python slice, as OpenCompass's `test_range` and RD-Agent write it:
`[:100]`, `[-100:]`, `[10:20]`, and slices whose bounds depend on the dataset's size, such as RD-Agent's
`[:min(100, len(index_list)//2)]` (`index_list` is the dataset's list of indices).

The bounds are read with Python's own parser and evaluated over a closed set of forms (integers, `+ - * //`,
`min`, `max`, `len(index_list)`), never with `eval`: a range comes from a config file or an agent.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from evaluators.errors import EvalInputError

_OPERATORS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}
_FUNCTIONS: dict[str, Callable[..., int]] = {"min": min, "max": max}
SIZE_NAME = "index_list"  # OpenCompass's name for the dataset's indices inside a range expression


@dataclass(frozen=True)
class DatasetRange:
    """A parsed range: `indices(size)` gives the dataset positions it selects."""

    text: str
    start: ast.expr | None
    stop: ast.expr | None
    step: ast.expr | None

    @classmethod
    def parse(cls, text: str) -> DatasetRange:
        source = text.strip()
        try:
            tree = ast.parse(f"_{source}", mode="eval").body
        except SyntaxError:
            tree = None
        if not isinstance(tree, ast.Subscript) or not isinstance(tree.slice, ast.Slice):
            raise EvalInputError(
                f"test_range {text!r} is not a slice: write it as Python slices a list, e.g. '[:100]', "
                "'[-100:]', '[10:20]' or '[:min(100, len(index_list)//2)]'"
            )
        part = tree.slice
        found = cls(source, part.lower, part.upper, part.step)
        for bound in (part.lower, part.upper, part.step):
            if bound is not None:
                _value(bound, 1, source)  # every form checked now, not when a dataset arrives
        return found

    def indices(self, size: int) -> range:
        """The positions of a dataset of `size` rows this range selects, in order."""
        bounds = [
            None if b is None else _value(b, size, self.text) for b in (self.start, self.stop, self.step)
        ]
        if bounds[2] == 0:
            raise EvalInputError(f"test_range {self.text!r} has a step of 0")
        return range(size)[slice(*bounds)]


def _value(node: ast.expr, size: int, text: str) -> int:
    """The integer a bound's expression stands for, over a dataset of `size` rows."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand, size, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        right = _value(node.right, size, text)
        if isinstance(node.op, ast.FloorDiv) and right == 0:
            raise EvalInputError(f"test_range {text!r} divides by zero")
        return _OPERATORS[type(node.op)](_value(node.left, size, text), right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        name = node.func.id
        if name == "len" and len(node.args) == 1 and _is_size(node.args[0]):
            return size
        if name in _FUNCTIONS and node.args:
            return _FUNCTIONS[name](*(_value(a, size, text) for a in node.args))
    raise EvalInputError(
        f"test_range {text!r}: {ast.unparse(node)!r} is not a form a range may use (integers, + - * //, min, max "
        f"and len({SIZE_NAME}), the dataset's size)"
    )


def _is_size(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == SIZE_NAME
