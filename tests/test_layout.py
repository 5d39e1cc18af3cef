"""The house shows the paper (issue #23): every component of section 2 has a package of its name,
no module imports another that imports it back (TYPE_CHECKING imports count: they are the same
knot for a reader), the agent never imports the control plane, and no module outgrows what a
newcomer can hold in their head."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "controlplane")
# the paper's components (section 2, Figure 4) and the ones around them, each a package
COMPONENTS = ("frontend", "broker", "health", "scheduler", "allocator", "taskcontrol", "sidekick", "opsplanner",
              "store", "coordination", "security", "daemon", "cli", "devregion")
MAX_LINES = 510
KEPT_LONGER: dict[str, str] = {}  # a module allowed past MAX_LINES: why


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules a module imports (a name imported from a package that is a module
    of its own counts as that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {n for n in names if n in known}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    assert cycles(graph) == []


def test_the_agent_never_imports_the_control_plane():
    known = modules()
    reaching = {m: sorted(i for i in imports(p, known) if i.startswith("controlplane"))
                for m, p in known.items() if m.startswith("agent")}
    assert {m: i for m, i in reaching.items() if i} == {}


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_has_a_package_of_its_name(component):
    assert (REPO / "controlplane" / component / "__init__.py").exists()


def test_no_loose_modules_beside_the_components():
    loose = sorted(p.name for p in (REPO / "controlplane").glob("*.py") if p.name != "__init__.py")
    assert loose == []


def test_no_module_is_longer_than_a_newcomer_can_hold():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert {m: n for m, n in long.items() if m not in KEPT_LONGER} == {}
