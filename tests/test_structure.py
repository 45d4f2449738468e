"""The package's shape: no import cycle among `proxy` modules, nor among its sub-packages
(folders), TYPE_CHECKING imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[1] / "proxy"


def module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PROXY.rglob("*.py"):
        name = ".".join(path.relative_to(PROXY.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proxy"):
                edges[name] |= {t for t in (node.module, *(f"{node.module}.{a.name}" for a in node.names))
                                if t in modules}
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in modules}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles(module_graph()) == []


def test_the_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def folder_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed onto sub-packages: `proxy.tools` imports `proxy.context` when one
    of its modules imports one of the other's. Top-level modules are not folders and are left out."""

    def folder(name: str) -> str | None:
        parts = name.split(".")
        if len(parts) > 2 or (len(parts) == 2 and (PROXY / parts[1]).is_dir()):
            return ".".join(parts[:2])
        return None

    edges: dict[str, set[str]] = {}
    for name, imported in modules.items():
        source = folder(name)
        if source is None:
            continue
        edges.setdefault(source, set())
        for target in filter(None, map(folder, imported)):
            edges.setdefault(target, set())
            if target != source:
                edges[source].add(target)
    return edges


def test_no_import_cycles_between_sub_packages() -> None:
    """Each folder is a layer: none imports, through its modules, a folder that imports it back."""
    assert cycles(folder_graph(module_graph())) == []


def test_the_folder_check_sees_a_cycle_of_folders() -> None:
    """Two modules in different folders importing each other's folder make a folder cycle, though no
    module imports its own importer."""
    modules = {"proxy.tools.planner": {"proxy.context.update"}, "proxy.context.update": set(),
               "proxy.context.planner": {"proxy.tools.text"}, "proxy.tools.text": set()}
    assert cycles(modules) == []
    assert cycles(folder_graph(modules)) == [["proxy.context", "proxy.tools"]]


def any_annotations() -> list[tuple[str, int, str, str]]:
    """Every use of `typing.Any` in proxy/ (imports aside): (file, line, the line, the line above)."""
    import io
    import tokenize

    found = []
    for path in sorted(PROXY.rglob("*.py")):
        text = path.read_text()
        lines = text.split("\n")
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            line = lines[token.start[0] - 1]
            if token.type == tokenize.NAME and token.string == "Any" and not line.lstrip().startswith("from typing"):
                above = lines[token.start[0] - 2] if token.start[0] > 1 else ""
                found.append((str(path.relative_to(PROXY.parent)), token.start[0], line, above))
    return found


def test_any_is_rare_and_each_use_says_why() -> None:
    """Every `Any` says why on its line or the line above, the JSON alias included (`Json`,
    proxy/jsontext.py: the one alias of Any, used for JSON values everywhere else)."""
    uses = any_annotations()
    assert len(uses) < 25, [f"{f}:{n}" for f, n, _, _ in uses]
    unexplained = [f"{f}:{n}: {line.strip()}" for f, n, line, above in uses
                   if "Any:" not in line and "Any:" not in above]
    assert unexplained == []


def test_planner_order_is_data_the_pipeline_checks() -> None:
    """Each planner names what it must run after; a list in another order is refused at start."""
    import pytest

    from proxy.pipeline import check_order
    from proxy.testing import FailingPlanner

    def planner(name: str, after: tuple[str, ...] = ()) -> FailingPlanner:
        made = FailingPlanner(name=name)
        made.after = after
        return made

    check_order([planner("tools"), planner("context", ("tools",))])
    check_order([planner("context", ("tools",))])  # one it must follow that is absent: fine
    with pytest.raises(ValueError, match="must run after tools"):
        check_order([planner("context", ("tools",)), planner("tools")])


def test_default_planners_run_in_designed_order() -> None:
    from proxy.app import create_app
    from proxy.config import parse_config

    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "t", "auth": {"keys": ["sha256:" + "0" * 64]}, "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}, "t")
    keel = create_app(config).state.keel
    assert [p.name for p in keel.pipeline.planners] == ["tools", "memory", "context", "cache"]


def test_a_tenant_with_every_feature_off_is_only_read() -> None:
    """The pipeline tells from the tenant alone that no default planner can act (its body is then
    read, never checked for writing back); a planner that cannot tell (no for_tenant) counts."""
    from proxy.app import create_app
    from proxy.config import parse_config
    from proxy.testing import FailingPlanner

    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "off", "auth": {"keys": ["sha256:" + "0" * 64]}, "upstream": {"base_url": "http://up/v1"}},
        {"id": "on", "auth": {"keys": ["sha256:" + "1" * 64]}, "upstream": {"base_url": "http://up/v1"},
         "context": {"stable": True}}]}, "test")
    off, on = config.tenants
    pipeline = create_app(config).state.keel.pipeline
    assert not pipeline.might_plan(off) and pipeline.might_plan(on)
    custom = create_app(config, planners=lambda defaults: [*defaults, FailingPlanner()]).state.keel.pipeline
    assert custom.might_plan(off)


SHAPE_NAMES = frozenset({"chat", "responses", "messages"})


def shape_comparisons(root: Path = PROXY) -> list[str]:
    """Every comparison with an API shape's name outside `proxy/shapes` (the stand-in provider,
    a server of its own, aside): `x == "chat"`, `x != "messages"`, `x in ("chat", ...)`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in ("shapes", "standin"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for op, left, right in zip(node.ops, [node.left, *node.comparators[:-1]], node.comparators, strict=True):
                sides = [left, right] if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) else (
                    list(right.elts) if isinstance(op, (ast.In, ast.NotIn)) and isinstance(
                        right, (ast.Tuple, ast.List, ast.Set)) else [])
                if any(isinstance(s, ast.Constant) and s.value in SHAPE_NAMES for s in sides):
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_no_shape_name_is_compared_outside_shapes() -> None:
    """What differs per API shape is a `Shape`'s (proxy/shapes): the rest asks its capabilities."""
    assert shape_comparisons() == []


def test_the_check_sees_a_shape_comparison(tmp_path: Path) -> None:
    (tmp_path / "planner.py").write_text('def f(shape):\n    return shape == "messages" or shape in ("chat",)\n')
    (tmp_path / "fields.py").write_text('def g(body):\n    return "messages" in body\n')
    assert shape_comparisons(tmp_path) == ["planner.py:2", "planner.py:2"]


# Modules that answer Keel's own routes (health, metrics, the savings page, the memory API, the
# cache admin) and the stand-in provider, a server of its own: the rest answers through relay.py.
OWN_ROUTES = ("app.py", "savings/page.py", "memory/api.py", "respcache/admin.py", "standin/")


def response_writers(root: Path = PROXY) -> list[str]:
    """Every place outside relay.py (and the modules above) that builds a starlette response."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = str(path.relative_to(root))
        if relative == "relay.py" or relative.startswith(OWN_ROUTES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else (
                    node.func.attr if isinstance(node.func, ast.Attribute) else "")
                if name in ("Response", "StreamingResponse", "JSONResponse"):
                    found.append(f"{relative}:{node.lineno}")
    return found


def test_relay_is_the_one_writer_of_answers() -> None:
    """Every answer a client gets on an API route (relayed, the round loop's, a cached one, an
    error) is written by `relay.Writer`: counted once, streams on the gauge, errors in the shape."""
    assert response_writers() == []


def test_the_check_sees_a_response_written_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "rounds").mkdir()
    (tmp_path / "rounds" / "responder.py").write_text("def f(raw):\n    return Response(raw, status_code=200)\n")
    (tmp_path / "relay.py").write_text("def g(raw):\n    return Response(raw)\n")
    assert response_writers(tmp_path) == ["rounds/responder.py:2"]
