"""The package's layers, as a specification: every import inside nanobert/ (module level,
function-local, relative, `from . import x`) points down this table or stays in its layer.

    command lines (train.py, finetune.py, bench/)     outside the package: import anything
    training/                                         the harness both command lines share
    testing.py                                        gradient checker + hypothesis strategies
    model/          data/          distributed.py     the math | text and data | ranks
    formats/        flags.py                          files: config dicts, named tensors | flags
    backend.py                                        numpy or cupy

A layer imports only its own modules and the layers named for it in LAYERS. Nothing in the
package imports reference/, bench/ or tests/, or edits sys.path.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nanobert"

# layer -> the layers it may import (its own modules are always allowed)
LAYERS = {
    "backend.py": set(),
    "flags.py": set(),
    "formats/": {"backend.py"},
    "model/": {"backend.py", "formats/"},
    "data/": {"backend.py", "formats/", "flags.py"},
    "distributed.py": {"backend.py"},
    "testing.py": {"backend.py", "formats/", "model/", "data/"},
    "training/": {"backend.py", "flags.py", "formats/", "model/", "data/", "distributed.py"},
    "__init__.py": {"backend.py", "formats/", "model/", "data/"},      # the public names
    # a command line kept in the package (python -m nanobert.features): the top, as train.py
    "features.py": {"__init__.py", "backend.py", "flags.py", "formats/", "model/", "data/",
                    "distributed.py", "training/"},
    "attention.py": {"__init__.py", "backend.py", "flags.py", "formats/", "model/", "data/",
                     "training/"},                    # python -m nanobert.attention
    "fill_mask.py": {"__init__.py", "backend.py", "flags.py", "formats/", "model/", "data/",
                     "training/"},                    # python -m nanobert.fill_mask
    "check_pretraining.py": {"__init__.py", "flags.py", "formats/", "training/"},
}
# Single names a layer may take from a module of a layer it may not import otherwise.
ALSO_ALLOWED = {
    ("data/", "nanobert.model.ops"): {"IGNORE_INDEX"},   # -100, the label the losses skip
    # require_gpu's NVRTC check: a CuPy kernel, so kernels.py's
    ("backend.py", "nanobert.model.kernels"): {"nvrtc_probe"},
}
FOREIGN = ("reference", "bench", "tests", "conftest", "cupy_standin")   # outside the package


def layer_of(module):
    """'nanobert.model.ops' -> 'model/'; None for a module outside the package."""
    parts = module.split(".")
    if parts[0] != "nanobert":
        return None
    if len(parts) == 1:
        return "__init__.py"
    folder = f"{parts[1]}/"
    if folder in LAYERS:
        return folder
    return f"{parts[1]}.py"


def module_name(path):
    """nanobert/model/ops.py -> 'nanobert.model.ops'; a package's __init__.py -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name):
    """Whether nanobert.a.b names a module or package file (not a name inside one)."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(source, module, is_package=False):
    """-> [(line, imported module, name taken from it or None)] of every import in `source`
    (the text of `module`), function-local ones included, relative ones resolved;
    `from package import module` names the module itself."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1]
                                + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub, None) if is_module(sub)
                             else (node.lineno, base, alias.name))
    return sorted(found)


def imports_of(path):
    return imports(path.read_text(encoding="utf-8"), module_name(path),
                   is_package=path.name == "__init__.py")


def package_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def where(path):
    return path.relative_to(ROOT).as_posix()


def test_every_module_of_the_package_has_a_layer():
    unplaced = [where(p) for p in package_files() if layer_of(module_name(p)) not in LAYERS]
    assert not unplaced, f"modules without a layer (add them to LAYERS): {unplaced}"


def test_imports_point_down_the_layers():
    wrong = {}                   # "file:line imports module" -> (names, why)
    for path in package_files():
        own = layer_of(module_name(path))
        for line, module, name in imports_of(path):
            target = layer_of(module)
            if target is None or target == own or target in LAYERS.get(own, ()):
                continue
            if name is not None and name in ALSO_ALLOWED.get((own, module), ()):
                continue
            names, _ = wrong.setdefault(f"{where(path)}:{line} imports {module}",
                                        ([], f"{own} may not import {target}"))
            names += [name] if name else []
    lines = [edge + (f" ({', '.join(names)})" if names else "") + f": {why}"
             for edge, (names, why) in wrong.items()]
    assert not lines, "imports against the layering:\n" + "\n".join(lines)


def test_the_package_leaves_reference_bench_tests_and_sys_path_alone():
    wrong = []
    for path in package_files():
        for line, module, _ in imports_of(path):
            if module.split(".")[0] in FOREIGN or module.split(".")[0].startswith("test_"):
                wrong.append(f"{where(path)}:{line} imports {module}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                wrong.append(f"{where(path)}:{node.lineno} touches sys.path")
            if (isinstance(node, ast.Attribute) and node.attr == "addsitedir"):
                wrong.append(f"{where(path)}:{node.lineno} calls site.addsitedir")
    assert not wrong, "the package reaches outside itself:\n" + "\n".join(wrong)


def test_the_checker_sees_every_kind_of_import():
    """The parser itself: relative, `from . import module`, a name from a module, the package's
    own `from .. import module`, an absolute import and one inside a function."""
    source = ("from . import ops\nfrom ..formats.fileio import read_json\n"
              "from .. import flags\nimport nanobert.backend\n"
              "def f():\n    from ..model.config import BertConfig\n")
    found = [(module, name) for _, module, name in imports(source, "nanobert.model.probe")]
    assert found == [("nanobert.model.ops", None), ("nanobert.formats.fileio", "read_json"),
                     ("nanobert.flags", None), ("nanobert.backend", None),
                     ("nanobert.model.config", "BertConfig")], found
    assert imports("from . import model\n", "nanobert", is_package=True) == [
        (1, "nanobert.model", None)]


def test_the_layering_itself_points_one_way():
    """No layer reaches itself through the table: the arrows cannot form a cycle."""
    def below(layer, seen=()):
        for lower in LAYERS[layer]:
            assert lower not in (layer, *seen), f"{layer} and {lower} import each other"
            below(lower, (*seen, layer))
    for layer in LAYERS:
        assert LAYERS[layer] <= set(LAYERS), f"{layer} names an unknown layer"
        below(layer)
