"""No string-built SQL: library and migration code never formats values into SQL text.

The rule, checked on the AST of every module of ``relay_flow_projection`` and
``migrations``:

SQL text may be built with string operations (f-strings, ``%``, ``+``,
``.format()``, ``.join()``) only from compile-time constants: literals, a
module-level name bound once to such a constant (``BUSY_TIMEOUT_MS =
30_000``), a conditional choosing between constants (``'ON' if fk else
'OFF'``), or a value passed through ``int()`` (a number cannot carry SQL).
Anything else -- an argument, an attribute, a value read from the database
and pasted as text -- fails, wherever the string is built. An expression
counts as SQL when its literal parts contain an SQL keyword, or when it is
handed straight to a raw-SQL entry point (``execute``, ``exec_driver_sql``,
``text``, ``literal_column``, ``DDL``...). Values travel as bound parameters;
Core constructs render identifiers themselves.

The checker is tested on small bad and good examples first, so that a pass
on the real code means something.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import relay_flow_projection
from relay_flow_projection.migrate import migrations_directory

SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|CREATE|ALTER|DROP|WHERE|VALUES|BEGIN|TRUNCATE|"
    r"FROM|JOIN|ORDER BY|GROUP BY|SET|INTO)\b"
)
SINKS = {
    "execute",
    "executemany",
    "executescript",
    "exec_driver_sql",
    "text",
    "literal_column",
    "DDL",
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    source: str


class Checker:
    """Finds string-building expressions that make SQL out of non-constant values."""

    def __init__(self, source: str, path: str) -> None:
        self.path = path
        self.source = source
        self.tree = ast.parse(source, filename=path)
        self.constants = self._module_constants()
        self.violations: list[Finding] = []
        self.constant_sql: list[Finding] = []  # SQL built from constants only: allowed

    def _module_constants(self) -> dict[str, ast.expr]:
        """Names bound exactly once, at module level, and never rebound via ``global``."""
        bound: dict[str, list[ast.expr]] = {}
        for statement in self.tree.body:
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append(statement.value)
            elif (
                isinstance(statement, ast.AnnAssign)
                and statement.value is not None
                and isinstance(statement.target, ast.Name)
            ):
                bound.setdefault(statement.target.id, []).append(statement.value)
        rebound = {
            name
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Global | ast.Nonlocal)
            for name in node.names
        }
        return {
            name: values[0]
            for name, values in bound.items()
            if len(values) == 1 and name not in rebound
        }

    def is_constant(self, node: ast.expr, seen: frozenset[str] = frozenset()) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            value = self.constants.get(node.id)
            return (
                value is not None
                and node.id not in seen
                and self.is_constant(value, seen | {node.id})
            )
        if isinstance(node, ast.IfExp):  # the test picks one of two constants
            return self.is_constant(node.body, seen) and self.is_constant(node.orelse, seen)
        if isinstance(node, ast.BinOp | ast.BoolOp):
            operands = [node.left, node.right] if isinstance(node, ast.BinOp) else node.values
            return all(self.is_constant(operand, seen) for operand in operands)
        if isinstance(node, ast.UnaryOp):
            return self.is_constant(node.operand, seen)
        if isinstance(node, ast.JoinedStr):
            return all(self.is_constant(part, seen) for part in node.values)
        if isinstance(node, ast.FormattedValue):
            return self.is_constant(node.value, seen)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id == "int"  # whatever goes in, a number comes out
        return False

    def _string_parts(self, node: ast.expr) -> list[str]:
        """The literal text of *node*, including module constants it names (templates)."""
        parts = []
        for part in ast.walk(node):
            if isinstance(part, ast.Name) and part.id in self.constants:
                part = self.constants[part.id]
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
        return parts

    def _is_text(self, node: ast.expr) -> bool:
        """A string literal, or a module constant bound to one (a SQL template)."""
        if isinstance(node, ast.Name) and node.id in self.constants:
            node = self.constants[node.id]
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    def _is_string_building(self, node: ast.expr) -> list[ast.expr] | None:
        """The interpolated inputs when *node* builds a string, else None."""
        if isinstance(node, ast.JoinedStr):
            inputs = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
            return inputs or None
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mod)
            and self._is_text(node.left)
        ):
            right = node.right
            return list(right.elts) if isinstance(right, ast.Tuple) else [right]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            if any(
                (isinstance(side, ast.Constant) and isinstance(side.value, str))
                or isinstance(side, ast.JoinedStr)
                for side in sides
            ):
                return [
                    side
                    for side in sides
                    if not (isinstance(side, ast.Constant) and isinstance(side.value, str))
                ]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("format", "join")
            and self._is_text(node.func.value)
        ):
            return [*node.args, *(keyword.value for keyword in node.keywords)]
        return None

    def _record(self, node: ast.expr, inputs: list[ast.expr]) -> None:
        finding = Finding(
            self.path, node.lineno, ast.get_source_segment(self.source, node) or ast.dump(node)
        )
        if all(self.is_constant(value) for value in inputs):
            self.constant_sql.append(finding)
        else:
            self.violations.append(finding)

    def check(self) -> Checker:
        sink_arguments: set[int] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and node.args:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else None
                if isinstance(node.func, ast.Name):
                    name = node.func.id
                if name in SINKS:
                    sink_arguments.add(id(node.args[0]))
        reported: set[int] = set()
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.expr) or id(node) in reported:
                continue
            inputs = self._is_string_building(node)
            if inputs is None:
                continue
            looks_like_sql = any(SQL_WORDS.search(part) for part in self._string_parts(node))
            if looks_like_sql or id(node) in sink_arguments:
                self._record(node, inputs)
                reported.update(id(child) for child in ast.walk(node))
        return self


def library_files() -> list[Path]:
    package = Path(relay_flow_projection.__file__).parent
    return sorted({*package.rglob("*.py"), *migrations_directory().rglob("*.py")})


BAD = {
    "f-string": "conn.exec_driver_sql(f\"SELECT * FROM relay_runs WHERE id = '{run_id}'\")",
    "percent": "cursor.execute(\"DELETE FROM relay_runs WHERE id = '%s'\" % run_id)",
    "percent-tuple": "q = \"UPDATE relay_runs SET state = '%s' WHERE id = '%s'\" % (s, r)",
    "format": "sa.text(\"UPDATE relay_runs SET state = '{}'\".format(state))",
    "concatenation": 'query = "SELECT * FROM relay_runs WHERE repo = \'" + repo + "\'"',
    "join": "sql = ' AND '.join(conditions)\ncursor.execute('SELECT 1 WHERE ' + sql)",
    "sink-without-keywords": "conn.exec_driver_sql(f'{verb} relay_runs')",
    "local-variable": "def f(timeout):\n    cursor.execute(f'PRAGMA busy_timeout = {timeout}')",
    "rebound-constant": (
        "LIMIT = 5\ndef f(x):\n    global LIMIT\n    LIMIT = x\n"
        "cursor.execute(f'PRAGMA cache_size = {LIMIT}')"
    ),
    "attribute": "cursor.execute(f'PRAGMA busy_timeout = {self.timeout}')",
    "str-of-value": "cursor.execute(f'PRAGMA user_version = {str(version)}')",
    "template-constant": "TEMPLATE = 'DELETE FROM relay_runs WHERE id = %s'\nq = TEMPLATE % run_id",
    "template-format": "TEMPLATE = 'SELECT * FROM {}'\nconn.execute(sa.text(TEMPLATE.format(t)))",
}
GOOD = {
    "module-constant": "TIMEOUT = 30_000\ncursor.execute(f'PRAGMA busy_timeout = {TIMEOUT}')",
    "folded-constant": "LIMIT = 64 * 1024\ncursor.execute(f'PRAGMA journal_size_limit = {LIMIT}')",
    "conditional": "cursor.execute(f\"PRAGMA foreign_keys = {'ON' if fk else 'OFF'}\")",
    "int": "bind.exec_driver_sql(f'PRAGMA secure_delete = {int(previous or 0)}')",
    "bound-parameters": "conn.execute(sa.text('SELECT 1 FROM t WHERE id = :id'), {'id': x})",
    "log-message": "log.error('PRAGMA foreign_key_check reports %d rows', len(rows))",
    "error-message": "raise ValueError(f'run {run_id!r} not found')",
}


@pytest.mark.parametrize("source", BAD.values(), ids=BAD.keys())
def test_checker_flags_string_built_sql(source: str) -> None:
    assert Checker(source, "<example>").check().violations


@pytest.mark.parametrize("source", GOOD.values(), ids=GOOD.keys())
def test_checker_accepts_constants_and_bound_parameters(source: str) -> None:
    assert Checker(source, "<example>").check().violations == []


def test_library_and_migrations_build_no_sql_from_values() -> None:
    files = library_files()
    assert any(path.name == "repository.py" for path in files)
    assert any(path.parent.name == "versions" for path in files)
    violations: list[Finding] = []
    constant: list[Finding] = []
    for path in files:
        checker = Checker(path.read_text(encoding="utf-8"), str(path)).check()
        violations += checker.violations
        constant += checker.constant_sql
    # The rule is exercised: engine.py's PRAGMA lines are built, from constants only.
    assert any("busy_timeout" in finding.source for finding in constant)
    print(
        f"\nno string-built SQL: {len(files)} modules scanned, {len(constant)} SQL strings "
        f"built from constants or int() only, {len(violations)} from values"
    )
    for finding in constant:
        print(f"  allowed: {Path(finding.path).name}:{finding.line}: {finding.source}")
    assert violations == [], "\n".join(
        f"{finding.path}:{finding.line}: {finding.source}" for finding in violations
    )
