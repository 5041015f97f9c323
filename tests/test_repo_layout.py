"""The monorepo's wiring: every distribution installs through dev.txt, apps depend only on packages, lint is clean."""

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/*/pyproject.toml"))


def test_every_distribution_is_in_dev_requirements_and_the_uv_workspace():
    dev = (ROOT / "requirements" / "dev.txt").read_text()
    workspace = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    covered = {m for pattern in workspace for m in MEMBERS if Path(m).match(pattern)}
    assert MEMBERS, "no distribution found under packages/ or apps/"
    for member in MEMBERS:
        assert f"-e ./{member}" in dev, f"{member} is missing from requirements/dev.txt"
        assert member in covered, f"{member} is missing from [tool.uv.workspace] members"


def test_constraints_pin_every_package_exactly():
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert "==" in line, f"constraint {line!r} is not an exact pin"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))  # installed by requirements/dev.txt
    assert ruff is not None, "ruff is missing from the environment; install requirements/dev.txt"
    result = subprocess.run([ruff, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


APPS = sorted(p.name for p in (ROOT / "apps").iterdir() if (p / "pyproject.toml").is_file())
VISION_DEPENDENCIES = {"timm", "torchvision", "imagecorruptions-imaug"}


@pytest.mark.parametrize("app", APPS)
def test_no_app_imports_another_app(app: str):
    others = [other for other in APPS if other != app]
    pattern = re.compile(rf"\bkpca\.({'|'.join(others)})\b")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "apps" / app).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if pattern.search(line)
    ]
    assert not offenders, "apps depend on packages, never on each other; move shared code to packages/:\n" + "\n".join(
        offenders
    )


PRIVATE_ATTENTION = re.compile(r"\bkpca\.attention\._\w+|\bfrom kpca\.attention import (?:\(\s*)?_\w+")
OUTSIDE_THE_LIBRARY = ("apps", "benchmarks", "docker", "packages/training", "tools")


def private_attention_imports(text: str) -> list[str]:
    """The lines of ``text`` that import or name a private module of kpca.attention (``kpca.attention._triton``)."""
    return [line.strip() for line in text.splitlines() if PRIVATE_ATTENTION.search(line)]


def test_nothing_outside_the_attention_library_reaches_its_private_modules():
    offenders = [
        f"{path.relative_to(ROOT)}: {line}"
        for folder in OUTSIDE_THE_LIBRARY
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in private_attention_imports(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        "code outside packages/attention uses its public API only (the benchmarks' Triton hooks are "
        "kpca.attention.triton_tuning):\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "line",
    [
        "from kpca.attention._triton import ops",
        "from kpca.attention import _backend, rpc_attention",
        "x = kpca.attention._pap.PapFirst",
    ],
)
def test_a_private_import_is_caught(line: str):
    assert private_attention_imports(line)


def _requirement_closure(distribution: str) -> set[str]:
    """Names of the distributions that installing ``distribution`` (no extras) pulls in, read from the metadata."""
    seen: set[str] = set()
    todo = [(distribution, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in seen and not extras:
            continue
        seen.add(key)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            environment = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environment):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return seen


def test_the_language_model_installs_no_vision_dependency():
    closure = _requirement_closure("kpca-language-model")
    assert {"kpca-attention", "kpca-training", "torch", "lightning", "sentencepiece"} <= closure
    assert not closure & {canonicalize_name(n) for n in VISION_DEPENDENCIES | {"kpca-vision-cls"}}, sorted(closure)
    for app in ("kpca-vision-cls", "kpca-segmentation"):  # the image apps: timm, kpca-training's [vision] extra
        assert {"timm", "torchvision", "imagecorruptions-imaug"} <= _requirement_closure(app)


@pytest.mark.slow
def test_the_language_model_fits_without_importing_vision_code(tmp_path: Path):
    # torchvision is left out of the check: torchmetrics imports it whenever it is installed, whoever asks.
    script = (
        "import sys\n"
        "from kpca.language_model.cli import main\n"
        f"main(['fit', '-c', 'configs/trainer/cpu.yaml', '-c', 'configs/language_model/smoke.yaml',"
        f" '--trainer.fast_dev_run=1', '--trainer.enable_progress_bar=false', '--data.cache_dir={tmp_path}',"
        f" '--trainer.default_root_dir={tmp_path}'])\n"
        "vision = {'timm', 'imagecorruptions', 'sklearn', 'kpca.vision_cls', 'kpca.attention.vit'}\n"
        "print(sorted(name for name in sys.modules if name in vision))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]


def test_the_step_command_starts_without_torch():
    # kpca-experiment exec runs every step of a Slurm plan and starts the app, which imports torch itself (seconds)
    script = (
        "import sys\n"
        "import kpca.training.experiment.cli, kpca.training.experiment.steps\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in {'torch', 'lightning'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout[-2000:]


def test_an_app_starts_without_dali_or_the_corruption_library():
    """A new interpreter imports the three apps' commands, the vision DataModule and the DALI loader's module: neither
    nvidia.dali (the optional DALI input, imported when a loader is built) nor imagecorruptions (imported at the
    first corruption) comes with them."""
    apps = "kpca.vision_cls.cli, kpca.vision_cls.data, kpca.vision_cls.input.dali.loader, kpca.language_model.cli, "
    apps += "kpca.segmentation.cli"
    code = f"import sys, {apps}; print([m for m in sys.modules if m.startswith(('nvidia.dali', 'imagecorruptions'))])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]"]
