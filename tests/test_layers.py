"""No import cycle anywhere: no module imports, directly or through others, a module that imports it.

The import-linter contracts in pyproject.toml (run by ``make lint``) keep the layers and find cycles
between the sibling modules of each package. A cycle through a package's own ``__init__``
(``shardpipe.formats.base -> shardpipe.formats -> shardpipe.formats.base``) is not one between siblings,
so this test walks every module of the graph. Imports under ``TYPE_CHECKING`` count: an annotation that
names a type is still an arrow between modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set

import grimp

ROOTS = ("shardpipe", "loaders", "bench", "testkit", "tests")


def find_cycle(imports: Mapping[str, Set[str]]) -> list[str] | None:
    """A cycle of ``imports`` (module -> the modules it imports) as its modules in import order, the first
    repeated at the end; ``None`` when there is none. Depth first, without recursion."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    for root in sorted(imports):
        if root in state:
            continue
        path, pending = [root], [iter(sorted(imports[root]))]
        state[root] = "open"
        while pending:
            for module in pending[-1]:
                if state.get(module) == "open":
                    return [*path[path.index(module) :], module]
                if module not in state:
                    state[module] = "open"
                    path.append(module)
                    pending.append(iter(sorted(imports.get(module, ()))))
                    break
            else:
                state[path.pop()] = "done"
                pending.pop()
    return None


def _graph_imports() -> Iterator[tuple[str, set[str]]]:
    graph = grimp.build_graph(*ROOTS, exclude_type_checking_imports=False, cache_dir=None)
    for module in graph.modules:
        yield module, graph.find_modules_directly_imported_by(module)


def test_find_cycle_names_a_cycle_through_a_package_and_passes_a_tree() -> None:
    assert find_cycle({"a": {"a.b"}, "a.b": {"c"}, "c": {"a"}}) == ["a", "a.b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "b"}}) is None


def test_no_module_of_the_project_is_in_an_import_cycle() -> None:
    imports = dict(_graph_imports())
    assert {"shardpipe.formats.base", "loaders.dataset", "bench.common.report"} <= imports.keys()
    assert "shardpipe.formats.layout" in imports["shardpipe.formats.base"]  # a TYPE_CHECKING import
    cycle = find_cycle(imports)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
