"""The light resolver, on its own and against LibCST's QualifiedNameProvider."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from ampmigrate.engine.names import NameIndex

from conftest import FIXTURES


def _index(code: str):
    module = cst.parse_module(code)
    return module, NameIndex(module)


def _names_by_code(code: str):
    module, index = _index(code)
    result = {}
    for node, names in index.qualified_expressions():
        result.setdefault(module.code_for_node(node), set()).update(names)
    return result


def test_import_forms():
    found = _names_by_code(
        "import torch\n"
        "import torch.cuda.amp as tamp\n"
        "from torch.cuda import amp as camp\n"
        "from torch.cuda.amp import autocast as ac\n"
        "torch.cuda.amp.autocast; tamp.GradScaler; camp.autocast; ac\n"
    )
    assert found["torch.cuda.amp.autocast"] == {"torch.cuda.amp.autocast"}
    assert found["tamp.GradScaler"] == {"torch.cuda.amp.GradScaler"}
    assert found["camp.autocast"] == {"torch.cuda.amp.autocast"}
    assert found["ac"] == {"torch.cuda.amp.autocast"}


def test_apex_bound_nowhere_in_the_file_is_the_apex_package():
    """GDT's `main_stica.py` calls `apex.amp.initialize` and never imports apex."""
    assert _names_by_code("def f(m, o):\n    apex.amp.initialize(m, o)\n").get("apex.amp.initialize") == {"apex.amp.initialize"}
    for code in (
        "from utils import *\napex.amp.initialize(m, o)\n",  # a `*` import may bind it
        "def g(apex):\n    pass\napex.amp.initialize(m, o)\n",  # the file binds the name somewhere
        "apex = load()\napex.amp.initialize(m, o)\n",
    ):
        assert not _names_by_code(code).get("apex.amp.initialize"), code


def test_dotted_import_binds_its_top_package():
    found = _names_by_code("import torch.cuda.amp\ntorch.nn.Linear\n")
    assert found["torch.nn.Linear"] == {"torch.nn.Linear"}


def test_try_except_imports_are_a_union_and_constants_add_nothing():
    found = _names_by_code(
        "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\namp.initialize\n"
    )
    assert found["amp.initialize"] == {"apex.amp.initialize"}


def test_function_scope_shadows_module_import():
    module, index = _index(
        "from torch.cuda import amp\n"
        "def f(amp):\n    return amp.autocast\n"
        "def g():\n    amp = False\n    return amp\n"
        "def h():\n    return amp.autocast\n"
    )
    resolved = {
        module.code_for_node(index.statement_of(node)): names
        for node, names in index.qualified_expressions()
        if module.code_for_node(node) == "amp.autocast"
    }
    assert list(resolved.values()) == [frozenset({"torch.cuda.amp.autocast"})]  # only h()


def test_class_body_names_are_invisible_in_methods():
    found = _names_by_code(
        "import torch\n"
        "class T:\n    amp = torch.cuda.amp\n    def f(self):\n        return amp.autocast\n"
    )
    assert "amp.autocast" not in found


def test_global_and_nonlocal():
    found = _names_by_code(
        "def setup():\n    global amp\n    from torch.cuda import amp\n"
        "def use():\n    return amp.autocast\n"
        "def outer():\n    ac = None\n    def inner():\n        nonlocal ac\n        from torch.cuda.amp import autocast as ac\n"
        "    return ac\n"
    )
    assert found["amp.autocast"] == {"torch.cuda.amp.autocast"}
    assert found["ac"] == {"torch.cuda.amp.autocast"}


def test_comprehension_and_lambda_scopes():
    found = _names_by_code(
        "from torch.cuda import amp\n"
        "xs = [amp for amp in range(3)]\n"
        "f = lambda amp: amp.autocast\n"
        "g = lambda: amp.GradScaler\n"
    )
    assert "amp.autocast" not in found
    assert found["amp.GradScaler"] == {"torch.cuda.amp.GradScaler"}


def test_a_comprehension_that_is_another_comprehensions_first_iterable_leaves_every_scope_it_entered():
    # The inner comprehension enters two scopes at once (the outer one's iterable is evaluated
    # outside it, and its own): leaving only one left later module-level code in the class scope
    # (a transformers model file with `{t: f(t) for t in {l.kind for l in self.layers}}`).
    code = (
        "class Model:\n"
        "    def forward(self):\n"
        "        return {t: self.f(t) for t in {layer.kind for layer in self.layers}}\n"
        "from torch import cuda as tc\n"
        "scaler = tc.amp.GradScaler()\n"
        "names = [[y for y in x] for x in [[z for z in w] for w in ws]]\n"
        "ac = tc.amp.autocast\n"
    )
    found = _names_by_code(code)
    assert found["tc.amp.GradScaler"] == {"torch.cuda.amp.GradScaler"}
    assert found["tc.amp.autocast"] == {"torch.cuda.amp.autocast"}
    _module, index = _index(code)
    assert "tc" in index.module_scope.bindings
    assert [s.kind for s in index.scopes].count("class") == 1


def test_default_values_and_decorators_are_evaluated_outside():
    found = _names_by_code(
        "from torch.cuda import amp\n"
        "@amp.custom_fwd\n"
        "def f(amp=amp.autocast):\n    pass\n"
    )
    assert found["amp.custom_fwd"] == {"torch.cuda.amp.custom_fwd"}
    assert found["amp.autocast"] == {"torch.cuda.amp.autocast"}


def test_aliases_through_assignment_and_self_attributes():
    found = _names_by_code(
        "import torch\n"
        "ac = torch.cuda.amp.autocast\n"
        "pick = torch.amp.autocast if new else torch.cuda.amp.autocast\n"
        "class T:\n"
        "    def __init__(self):\n        self.ctx = torch.cuda.amp.autocast\n"
        "    def run(self):\n        ac(); pick(); self.ctx()\n"
    )
    assert found["ac"] == {"torch.cuda.amp.autocast"}
    assert found["pick"] == {"torch.amp.autocast", "torch.cuda.amp.autocast"}
    assert found["self.ctx"] == {"torch.cuda.amp.autocast"}


def test_instance_classes():
    module, index = _index(
        "import torch\nfrom typing import Optional\n"
        "s1 = torch.cuda.amp.GradScaler()\n"
        "s2 = torch.amp.GradScaler('cuda') if amp else None\n"
        "def f(s3: Optional[torch.amp.GradScaler], s4: 'str'):\n    s3; s4\n"
        "class T:\n    def __init__(self):\n        self.scaler = torch.GradScaler()\n"
        "    def step(self):\n        self.scaler\n"
        "s1; s2\n"
    )
    by_code = {}
    for node in list(index.loads) + index.name_attributes:
        classes = index.instance_classes(node)
        if classes:
            by_code[module.code_for_node(node)] = classes
    assert by_code["s1"] == {"torch.cuda.amp.GradScaler"}
    assert by_code["s2"] == {"torch.amp.GradScaler"}
    assert by_code["s3"] == {"torch.amp.GradScaler"}
    assert "s4" not in by_code
    assert by_code["self.scaler"] == {"torch.GradScaler"}


def test_references_and_parents():
    module, index = _index("from torch.cuda.amp import autocast\nwith autocast():\n    pass\nautocast\n")
    binding = index.module_scope.bindings["autocast"][0]
    refs = index.references(binding)
    assert len(refs) == 2
    assert isinstance(index.parent(refs[0]), cst.Call)


def test_relative_and_star_imports_resolve_to_nothing():
    found = _names_by_code("from . import amp\nfrom .x import autocast\namp.autocast; autocast\n")
    assert found == {}
    module, index = _index("from torch.cuda.amp import *\n")
    assert index.has_star_import and not index.is_free("autocast", index.module_scope)


def test_star_import_of_a_known_module_resolves_the_names_it_exports():
    code = (
        "from apex.fp16_utils import *\n"
        "def f(loss, model):\n"
        "    network_to_half(model)\n"
        "    to_python_float(loss)\n"
        "    print(loss)\n"
        "    def to_python_float(x):\n"
        "        return x\n"
    )
    found = _names_by_code(code)
    assert found == {"network_to_half": {"apex.fp16_utils.network_to_half"}}
    # a module whose exports are not known resolves nothing, and a star inside another
    # function is not visible here
    assert _names_by_code("from somewhere import *\nnetwork_to_half(m)\n") == {}
    assert _names_by_code("def g():\n    from apex.fp16_utils import *\ndef f():\n    network_to_half(m)\n") == {}


def test_dunder_all_lists_the_exported_names():
    _, index = _index('from torch.cuda.amp import autocast\n__all__ = ["autocast", "x"]\n__all__ += ("y",)\n')
    assert index.dunder_all() == {"autocast", "x", "y"}
    assert _index("__all__ = make()\n")[1].dunder_all() == frozenset()


# --------------------------------------------------------------------------- against LibCST
def _libcst_import_names(module: cst.Module):
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    qualified = wrapper.resolve(QualifiedNameProvider)
    out = {}
    for node, names in qualified.items():
        if callable(names):  # LibCST resolves some metadata lazily
            names = names()
        imported = {q.name for q in names if q.source == QualifiedNameSource.IMPORT}
        if imported and isinstance(node, (cst.Name, cst.Attribute)):
            out[node] = imported
    return out


def _dotted_chain(node) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _only_imports(index: NameIndex, node) -> bool:
    root = node
    while isinstance(root, cst.Attribute):
        root = root.value
    if not isinstance(root, cst.Name):
        return False
    bindings = index.bindings_of(root)
    return bool(bindings) and all(b.kind in ("import", "from-import") for b in bindings)


def _corpus():
    files = sorted(FIXTURES.rglob("*.py"))
    try:
        import torch  # noqa: F401 - only to locate real third-party code to compare on

        torch_dir = Path(torch.__file__).parent
        files += sorted((torch_dir / "amp").glob("*.py")) + sorted((torch_dir / "cuda" / "amp").glob("*.py"))
        files += sorted((torch_dir / "utils").glob("*.py"))[:15]
    except ImportError:  # pragma: no cover
        pass
    return files


@pytest.mark.parametrize("path", _corpus(), ids=lambda p: p.name)
def test_agrees_with_libcst_on_imported_names(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    index = NameIndex(module)
    ours = {node: names for node, names in index.qualified_expressions()}
    theirs = _libcst_import_names(module)
    for node, names in theirs.items():
        if node in index.store_attributes or not _dotted_chain(node):
            continue  # LibCST also "names" attributes of call results: `f(x).y` -> 'f.y'

        if isinstance(node, cst.Name) and node not in index.loads:
            continue  # LibCST also names import aliases and targets; we index loads
        names = {n for n in names if not n.startswith(".")}  # a relative import names a module of the
        # run (`from .registry import ENGINES`: LibCST's `.registry.ENGINES`), which no rule looks up by
        # name: the pass leaves it unnamed (the project index resolves such imports itself)
        assert names <= ours.get(node, frozenset()), module.code_for_node(node)
    for node, names in ours.items():
        if _only_imports(index, node) and node in theirs:
            assert names == theirs[node], module.code_for_node(node)


def test_global_declared_after_the_import():
    # CPython accepts `global` after an import of the name: it still binds the module's name.
    found = _names_by_code(
        "class M:\n    def setup(self):\n        try:\n            from torch.cuda import amp\n            global amp\n"
        "        except ImportError:\n            pass\n"
        "    def use(self):\n        return amp.autocast\n"
        "def outer():\n    ac = None\n    def inner():\n        from torch.cuda.amp import autocast as ac\n"
        "        nonlocal ac\n    return ac\n"
    )
    assert found["amp.autocast"] == {"torch.cuda.amp.autocast"}
    assert found["ac"] == {"torch.cuda.amp.autocast"}


def test_global_declared_after_a_local_use_only_elsewhere_stays_local():
    found = _names_by_code(
        "def setup():\n    from torch.cuda import amp\n    return amp\n"
        "def use():\n    return amp.autocast\n"
    )
    assert "amp.autocast" not in found
