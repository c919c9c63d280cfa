"""The package's layers: imports go downward only, never in a circle.  Every import
counts: module level, inside functions (lazy) and under ``TYPE_CHECKING``.  The order and
its reasons are in docs/architecture.md.  (File length is a hint, not a rule:
files are cut where concepts meet, and a class keeps its methods.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = "zreplay"

# Bottom to top.  A module may import modules of its own layer or of layers below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "zreplay.errors",
            "zreplay.schema",
            "zreplay.conventions",
            "zreplay.numbers",
            "zreplay.threads",
            "zreplay.forks",
        ),
    ),
    ("store", ("zreplay.store",)),
    ("index", ("zreplay.index",)),
    ("engine", ("zreplay.engine",)),
    ("sampling", ("zreplay.sampling", "zreplay.samplers")),
    ("core", ("zreplay.core",)),
    ("compat", ("zreplay.compat",)),
    ("api", ("zreplay.api", "zreplay")),
    ("cli", ("zreplay.cli",)),
]


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> int:
    best, depth = None, -1
    for i, (_name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and p.count(".") > depth:
                best, depth = i, p.count(".")
    if best is None:
        raise AssertionError(f"{module} belongs to no layer; add it to LAYERS")
    return best


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """zreplay modules ``module`` imports (an imported name that is a submodule counts as
    that submodule)."""
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target]
            names += [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
        else:
            continue
        for name in names:
            while name and name not in known:  # "zreplay.store.x.y" -> nearest module
                name = name.rpartition(".")[0]
            if name.startswith(PKG) and name != module:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def test_every_module_has_a_layer():
    for m in modules():
        layer_of(m)


def test_imports_go_downward_only():
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in graph().items()
        for d in sorted(deps)
        if layer_of(d) > layer_of(m) and not (m == PKG and d.startswith(PKG + "."))
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    g = graph()
    # The package's own __init__ re-exports the public names: it imports everything and
    # nothing imports it back (checked by the downward test for every module below api).
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_the_checker_sees_a_lazy_upward_import(tmp_path):
    """The check can fail: a function-level import of a higher layer is found."""
    mod = tmp_path / "x.py"
    mod.write_text("def f():\n    from ..core.buffer import BufferCore\n")
    known = {**modules(), "zreplay.store.x": mod}
    got = imports("zreplay.store.x", mod, known)
    assert "zreplay.core.buffer" in got and layer_of("zreplay.core.buffer") > layer_of(
        "zreplay.store.x"
    )


def test_only_the_location_module_picks_a_store_backend():
    """No code outside store/location.py asks which kind of store it has."""
    names = ("ObjectLocation", "LocalPath", "FsspecBackend", "LocalBackend")
    offenders = []
    for m, p in modules().items():
        if m == "zreplay.store.location" or m.startswith("zreplay.store.backend"):
            continue  # the choice, and each backend's own type
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
                if any(isinstance(a, ast.Name) and a.id in names for a in ast.walk(node)):
                    offenders.append(f"{m}:{node.lineno}")
    assert not offenders, offenders


def _module_map() -> list[str]:
    """Files named in docs/architecture.md's module map (the block under "Every
    module"): a line ``name.py ...`` (or ``a.py b.py ...``) names files of the directory
    it is indented under; a directory line ``dir/ ...`` names every ``.py`` word on it
    as its files."""
    text = (SRC.parent / "docs" / "architecture.md").read_text()
    block = text.split("## Every module", 1)[1].split("```\nsrc/zreplay/", 1)[1].split("```", 1)[0]
    out, stack = [], []  # directories by indentation
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2  # 1: directly under src/zreplay/
        words = line.split()
        stack = stack[: depth - 1]
        if words[0].endswith("/"):
            stack.append(words[0])
            run = [w for w in words[1:] if w.endswith(".py")]
        else:
            run = []
            for w in words:
                if not w.endswith(".py"):
                    break
                run.append(w)
        out += ["".join(stack) + w for w in run]
    if not out:
        raise AssertionError("the architecture page's module map was not found")
    return out


def test_the_architecture_page_maps_every_module_and_nothing_else():
    listed = set(_module_map())
    on_disk = {
        p.relative_to(SRC / PKG).as_posix()
        for p in (SRC / PKG).rglob("*.py")
        if p.name != "__init__.py" or p.parent in (SRC / PKG, SRC / PKG / "cli")
    }
    assert not listed - on_disk, (
        f"docs/architecture.md names files that do not exist: {listed - on_disk}"
    )
    assert not on_disk - listed, (
        f"modules missing from docs/architecture.md's map: {on_disk - listed}"
    )


def _private_names_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, module globals and attributes
    it assigns on ``self``/``cls``."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
    return {n for n in own if n.startswith("_") and not n.startswith("__")}


def private_reaches(sources: dict[str, str]) -> list[str]:
    """Uses of another zreplay module's private names: ``obj._name`` (``obj`` not
    ``self``/``cls``) where ``_name`` is defined by another module and not by this one,
    and ``from zreplay... import _name``."""
    trees = {m: ast.parse(src) for m, src in sources.items()}
    own = {m: _private_names_defined(t) for m, t in trees.items()}
    everywhere = set().union(*own.values())
    found = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in everywhere - own[m]:
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{m}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (
                node.level or "zreplay" in (node.module or "")
            ):
                found += [
                    f"{m}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_module_reaches_into_another_modules_private_names():
    sources = {m: p.read_text() for m, p in modules().items()}
    assert not private_reaches(sources), "\n".join(private_reaches(sources))


def test_the_private_reach_check_can_fail():
    sources = {
        "zreplay.a": "class A:\n    def __init__(self):\n        self._ring = 1\n",
        "zreplay.b": "from .a import _helper\ndef f(storage):\n    return storage._ring\n",
    }
    got = private_reaches(sources)
    assert any("storage._ring" in g for g in got) and any("_helper" in g for g in got), got
