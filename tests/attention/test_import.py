"""The package imports, and runs, without triton or timm; the Triton backend does not import functional."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kpca.attention
from kpca.attention import _pap, functional

from .helpers import REQUIRE_TRITON_ENV, require_triton

CODE = """
import sys
sys.modules["triton"] = None  # any `import triton` now raises ImportError
sys.modules["timm"] = None  # the same for timm: only kpca.attention.vit needs it
import torch
import kpca.attention as A
k = torch.randn(1, 2, 8, 4)
out = A.rpc_attention(k, k, n_iter=2, lambd=4.0, backend="auto")
assert out.shape == (1, 2, 8, 4)
assert A.AttentionSpec(kind="rpc").build(8, 2)(torch.randn(1, 3, 8)).shape == (1, 3, 8)
assert not {"triton", "timm"} & {name.split(".")[0] for name, mod in sys.modules.items() if mod is not None}
assert "kpca.attention.vit" not in sys.modules
print("ok")
"""


def test_imports_without_triton_or_timm():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def module_level_imports(module: str) -> set[str]:
    """The kpca.attention modules that ``module``'s top-level import statements load, followed transitively.

    Parent packages are not followed: ``kpca.attention/__init__.py`` imports everything by design.
    """
    root = Path(kpca.attention.__file__).parent

    def source(name: str) -> Path | None:
        parts = name.split(".")[2:]
        path = root.joinpath(*parts)
        return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if parts and p.is_file()), None)

    seen, todo = set(), [module]
    while todo:
        tree = ast.parse(source(todo.pop()).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found = {n for n in names if n.startswith("kpca.attention.") and source(n)} - seen
            seen |= found
            todo += found
    return seen


def test_triton_ops_import_neither_functional_nor_through_it():
    imported = module_level_imports("kpca.attention._triton.ops")
    assert "kpca.attention._pap" in imported
    assert "kpca.attention.functional" not in imported
    assert "kpca.attention.functional" not in module_level_imports("kpca.attention._pap")


def test_pap_mu_lives_in_pap_and_stays_public():
    assert functional.pap_mu is _pap.pap_mu is kpca.attention.pap_mu
    assert "L1_EPS" in vars(_pap) and "L1_EPS" not in vars(functional)


def test_triton_ops_take_l1_eps_from_pap():
    require_triton()
    from kpca.attention._triton import ops

    assert ops.L1_EPS is _pap.L1_EPS


def test_require_triton_fails_instead_of_skipping_when_ci_requires_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as if triton were not installed
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.delenv(REQUIRE_TRITON_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_triton()
    monkeypatch.setenv(REQUIRE_TRITON_ENV, "1")
    with pytest.raises(ImportError):
        require_triton()
