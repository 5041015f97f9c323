"""requirements/wheelhouse.py (``make wheelhouse``) without the network: uv resolves the real project for an H200 node
from a local index of this environment's distributions (their metadata, no code), pip downloads from a local index;
the node's freeze, the manifest, the errors, and the Makefile lines that call it and run ``make test-gpu`` on a node.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cli_support import load_script

REPO = Path(__file__).resolve().parents[1]
wheelhouse = load_script(REPO / "requirements" / "wheelhouse.py", "wheelhouse")
Target = wheelhouse.Target
H200 = Target("3.12", "manylinux_2_28_x86_64")
H200_RUN_CARRIED = {
    "jsonargparse", "docstring-parser", "typeshed-client", "simplejpeg", "timm", "imagecorruptions-imaug", "mmengine",
    "mmcv-lite", "mmsegmentation", "addict", "yapf", "termcolor", "prettytable", "wcwidth", "ftfy", "platformdirs",
    "datasets", "dill", "multiprocess", "pillow", "pytest",
}  # fmt: skip
"""What the first H200 run installed from carried wheels beside the five kpca distributions."""


def fake_wheel(folder: Path, name: str, version: str, metadata: str = "", tag: str = "py3-none-any") -> None:
    """A wheel of ``name==version`` for ``tag`` in ``folder`` that holds only its metadata."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    metadata = metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    with zipfile.ZipFile(folder / f"{stem}-{tag}.whl", "w") as wheel:
        wheel.writestr(f"{stem}.dist-info/METADATA", metadata)
        wheel.writestr(f"{stem}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        wheel.writestr(f"{stem}.dist-info/RECORD", "")


def use_index(monkeypatch: pytest.MonkeyPatch, index: Path) -> None:
    """Point uv and pip at the local ``index`` and nothing else."""
    for name, value in {"UV_OFFLINE": "1", "PIP_NO_INDEX": "1"}.items():
        monkeypatch.setenv(name, value)
    for tool in ("UV", "PIP"):
        monkeypatch.setenv(f"{tool}_FIND_LINKS", str(index))


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory):
    """uv and pip on a local index of every distribution installed here but the kpca ones, at its installed version."""
    index = tmp_path_factory.mktemp("index")
    installed = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    for name, dist in installed.items():
        if not name.startswith("kpca-"):
            fake_wheel(index, name, dist.version, dist.read_text("METADATA"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_index(monkeypatch, index)
        monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.mktemp("uv-cache")))
        yield


@pytest.fixture(scope="module")
def locked(offline) -> dict[str, dict[str, str]]:
    """What the wheelhouse carries for the H200 node, as uv resolves it: without and with ``--dali``."""
    members = wheelhouse.project_members()
    return {flag: wheelhouse.lock(H200, members, [flag] if flag else []) for flag in ("", "dali")}


def test_the_wheelhouse_leaves_out_the_node_stack_and_what_only_it_needs(locked):
    versions = locked[""]
    assert not {"torch", "torchvision", "triton", "sympy", "mpmath"} & set(versions)  # sympy: only torch needs it
    assert not [name for name in versions if name.startswith(("nvidia-", "cuda-"))]


def test_the_wheelhouse_holds_every_runtime_dependency_of_the_apps_and_pytest_at_the_pins(locked):
    versions = locked[""]
    expected = {
        "timm", "jsonargparse", "docstring-parser", "typeshed-client", "lightning", "torchmetrics", "torchdata",
        "mmsegmentation", "mmcv-lite", "mmengine", "addict", "imagecorruptions-imaug", "simplejpeg", "numba",
        "sentencepiece", "datasets", "pillow", "pytest", "pytest-xdist",
    }  # fmt: skip
    assert expected <= set(versions), sorted(expected - set(versions))
    assert not {"kpca-attention", "nvidia-dali-cuda130", "ruff", "uv"} & set(versions)
    pins = dict(
        line.split("==") for line in (REPO / "requirements" / "constraints.txt").read_text().split() if "==" in line
    )
    assert {name: versions[name] for name in pins if name in versions} == {
        n: v for n, v in pins.items() if n in versions
    }


def test_dali_comes_with_its_own_nvidia_libraries_only_when_asked_for(locked):
    added = set(locked["dali"]) - set(locked[""])
    assert {"nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13"} <= added
    assert "nvidia-cublas" not in added  # torch's CUDA libraries stay out


def test_the_h200_image_list_leaves_exactly_what_that_run_carried_and_the_newer_dependencies(locked):
    have = wheelhouse.read_freeze(REPO / "requirements" / "h200-image.txt")
    assert {name for name, version in have.items() if version != "?"} == {
        "torch", "torchvision", "triton", "lightning", "torchmetrics", "numba", "numpy",
    }  # fmt: skip
    assert set(have) - set(wheelhouse.NODE_STACK) <= set(locked[""])  # no name the project does not need
    carry, _ = wheelhouse.leave_to_node(locked[""], have)
    assert set(carry) == H200_RUN_CARRIED | {"torchdata", "pytest-xdist", "execnet"}


def test_a_python_the_project_does_not_support_is_refused_before_anything_is_written(offline, tmp_path, capsys):
    assert wheelhouse.main(["--python", "3.9", "--dest", str(tmp_path / "w")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("wheelhouse: resolving the dependencies for CPython 3.9 on ") and "Python>=3.10" in error
    assert not (tmp_path / "w").exists()


def test_the_download_takes_wheels_of_older_manylinux_tags_but_not_newer_ones(tmp_path, monkeypatch):
    index, dest = tmp_path / "index", tmp_path / "dest"
    index.mkdir(), dest.mkdir()
    for name, tag in [("old", "cp312-cp312-manylinux2014_x86_64"), ("new", "cp312-cp312-manylinux_2_34_x86_64")]:
        fake_wheel(index, name, "1.0", tag=tag)
        fake_wheel(index, name, "1.0")  # py3-none-any
    use_index(monkeypatch, index)
    wheelhouse.download({"old": "1.0", "new": "1.0"}, H200, dest)
    assert sorted(p.name for p in dest.iterdir()) == [
        "new-1.0-py3-none-any.whl", "old-1.0-cp312-cp312-manylinux2014_x86_64.whl",
    ]  # fmt: skip
    with pytest.raises(
        wheelhouse.WheelhouseError, match=r"(?s)downloading the wheels \(pip download\) failed:\n.*absent==1.0"
    ):
        wheelhouse.download({"absent": "1.0"}, H200, dest)


def test_uv_resolves_for_the_newest_manylinux_it_names_that_the_node_runs():
    assert H200.uv_platform() == "x86_64-manylinux_2_28"
    assert Target("3.12", "manylinux_2_30_aarch64").uv_platform() == "aarch64-manylinux_2_28"
    assert Target("3.12", "manylinux_2_41_x86_64").uv_platform() == "x86_64-manylinux_2_40"


def test_the_manifest_lists_every_wheel_what_the_node_has_and_the_install_line():
    versions = {"timm": "1.0.31", "kpca-attention": "0.1.0"}
    on_node = {"numpy": ("2.5.2", "2.4.6"), "lightning": ("2.6.6", "2.6.6")}
    text = wheelhouse.manifest(H200, versions, Path("dist/wheelhouse-x"), on_node)
    pinned = [Requirement(line) for line in text.splitlines() if not line.startswith("#")]
    assert {r.name: str(r.specifier) for r in pinned} == {name: f"=={v}" for name, v in versions.items()}
    assert "CPython 3.12 on manylinux_2_28_x86_64" in text and "stack: torch, torchvision, triton and" in text
    assert (
        "# Left out, already on the node (--have): lightning 2.6.6 (locked 2.6.6), numpy 2.5.2 (locked 2.4.6)." in text
    )
    assert "python3 -m pip install --no-index --no-deps --upgrade --target $HOME/kpca-site wheelhouse-x/*.whl" in text
    assert max(len(line) for line in text.splitlines()) <= 120


def test_the_docs_give_the_install_line_the_script_writes():
    docs = (REPO / "docs" / "cluster.md").read_text()
    line = wheelhouse.install_line(Path("dist/wheelhouse-cp312-manylinux_2_28_x86_64"))
    assert line.replace("dist/", "") in docs or line in docs, line
    assert wheelhouse.environment_line() in docs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--python", "3"], "'3' is not a Python version MAJOR.MINOR such as 3.12"),
        (["--platform", "win_amd64"], "unknown platform tag 'win_amd64': a manylinux_2_X_<x86_64|aarch64> tag"),
        (["--platform", "manylinux_2_12_x86_64"], "unknown platform tag 'manylinux_2_12_x86_64'"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        wheelhouse.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_default_target_and_folder_are_this_interpreters():
    args = wheelhouse.parse_args([])
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert args.python == here
    assert args.dest == REPO / "dist" / f"wheelhouse-cp{here.replace('.', '')}-{args.platform}"


def test_an_earlier_wheelhouse_is_replaced_and_another_folder_refused(tmp_path: Path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "requirements.txt").write_text("a==1\n")
    (old / "a-1-py3-none-any.whl").write_text("")
    wheelhouse.prepare(old)
    assert old.is_dir() and not any(old.iterdir())
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(wheelhouse.WheelhouseError, match="other is not empty and holds no wheelhouse"):
        wheelhouse.prepare(other)
    assert (other / "notes.txt").read_text() == "mine"


def test_a_nodes_freeze_is_read_and_bad_lines_named(tmp_path: Path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# pip freeze of the node\nnumpy==2.5.2\nLightning==2.6.6\n-e git+https://x/y#egg=y\n\n"
                      "torch @ file:///wheels/torch.whl\nPyYAML  # a bare name: a hand-written list\n")  # fmt: skip
    assert wheelhouse.read_freeze(freeze) == {"numpy": "2.5.2", "lightning": "2.6.6", "torch": "?", "pyyaml": "?"}
    freeze.write_text("numpy>=2\n")
    with pytest.raises(wheelhouse.WheelhouseError, match=r"freeze.txt:1: 'numpy>=2' is no 'name==version' line"):
        wheelhouse.read_freeze(freeze)


def make_dry_run(*args: str) -> str:
    """What ``make -n`` would run, with the .venv stamp out of date (``-W``), as a top-level make."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    command = ["make", "--no-print-directory", "-n", "-W", "requirements/constraints.txt", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_test_gpu_with_a_given_python_creates_no_venv():
    assert "pip install" in make_dry_run("test-gpu")  # the ordinary case installs .venv first
    assert make_dry_run("test-gpu", "PY=python3").split() == ["python3", "tools/gpu_proof.py"]


def test_make_wheelhouse_passes_the_target_on():
    out = make_dry_run("wheelhouse", "WHEELHOUSE_PYTHON=3.12", "WHEELHOUSE_PLATFORM=manylinux_2_28_x86_64")
    assert " ".join(out.split()).endswith("requirements/wheelhouse.py --python 3.12 --platform manylinux_2_28_x86_64")
    assert " ".join(make_dry_run("wheelhouse").split()).endswith("requirements/wheelhouse.py")
