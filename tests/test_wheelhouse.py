"""requirements/wheelhouse.py (``make wheelhouse``) without the network: the closure, the pins, the target's tags and
markers, the manifest, the errors, and the Makefile lines that call it and run ``make test-gpu`` with a node's Python.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.cli_support import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "requirements" / "wheelhouse.py"


wheelhouse = load_script(SCRIPT, "wheelhouse")
Target = wheelhouse.Target
H200 = Target("3.12", "manylinux_2_28_x86_64")


# --- the closure of the real project, from this environment's metadata -------------------------------------------


@pytest.fixture(scope="module")
def planned():
    return wheelhouse.plan(H200)


def test_the_wheelhouse_leaves_out_the_node_stack_and_what_only_it_needs(planned):
    versions, stack, _ = planned
    assert {"torch", "torchvision", "triton", "nvidia-cublas", "nvidia-cudnn-cu13", "cuda-toolkit"} <= stack
    assert not {"torch", "torchvision", "triton"} & set(versions)
    assert not [name for name in versions if name.startswith(("nvidia-", "cuda-"))]
    assert "sympy" not in versions and "mpmath" not in versions  # only torch needs them


def test_the_wheelhouse_holds_every_runtime_dependency_of_the_apps_and_pytest(planned):
    versions, _, members = planned
    assert {m.name for m in members} == {
        "kpca-attention",
        "kpca-training",
        "kpca-vision-cls",
        "kpca-language-model",
        "kpca-segmentation",
    }
    expected = {
        "timm",  # kpca-attention[timm]
        "jsonargparse",
        "docstring-parser",  # jsonargparse[signatures]
        "typeshed-client",
        "lightning",
        "torchmetrics",
        "mmsegmentation",
        "mmcv-lite",
        "mmengine",
        "addict",  # mmcv-lite's
        "imagecorruptions-imaug",  # kpca-training[vision]
        "simplejpeg",
        "numba",
        "sentencepiece",
        "datasets",
        "pillow",
        "pytest",  # make test-gpu
    }
    assert expected <= set(versions), sorted(expected - set(versions))
    assert not {"kpca-attention", "nvidia-dali-cuda130", "ruff"} & set(versions)


def test_the_versions_are_the_pins_of_constraints_txt(planned):
    versions, _, _ = planned
    pins = wheelhouse.read_pins(REPO / "requirements" / "constraints.txt")
    assert versions["timm"] == pins["timm"] == "1.0.31"
    assert versions["jsonargparse"] == pins["jsonargparse"]
    assert versions["mmsegmentation"] == pins["mmsegmentation"]
    assert {name: versions[name] for name in pins if name in versions} == {
        name: version for name, version in pins.items() if name in versions
    }


def test_dali_comes_with_its_own_nvidia_libraries_only_when_asked_for(planned):
    versions, stack, _ = planned
    with_dali, _, _ = wheelhouse.plan(H200, flagged=["dali"])
    added = set(with_dali) - set(versions)
    assert {"nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13"} <= added
    assert not added & stack  # torch's CUDA libraries stay out


# --- the closure on a made-up graph ------------------------------------------------------------------------------

GRAPH = {
    "app": ["torch", "lib-a", "lib-b[x]", "new-py; python_version >= '3.12'", "win-only; sys_platform == 'win32'"],
    "torch": ["lib-a", "sympy", "cuda-toolkit[cublas]", "nvidia-cudnn-cu13; platform_system == 'Linux'"],
    "cuda-toolkit": ["nvidia-cublas; extra == 'cublas'", "nvidia-cufft; extra == 'cufft'"],
    "lib-b": ["lib-c; extra == 'x'", "lib-d; extra == 'y'"],
    "lib-c": ["lib-b[y]"],  # a cycle that asks for another extra
    "sympy": ["mpmath"],
}


def graph_requires(name: str) -> list[str]:
    return GRAPH.get(name, [])


@pytest.mark.parametrize(
    ("target", "extra"),
    [(Target("3.11", "manylinux_2_28_x86_64"), set()), (H200, {"new-py"}), (Target("3.12", "win_amd64"), {"new-py"})],
)
def test_the_closure_follows_extras_and_markers_and_stops_at_the_stack(target, extra):
    environment = target.marker_environment()
    stack = wheelhouse.node_stack(graph_requires, environment)
    names = wheelhouse.closure([Requirement("app")], graph_requires, environment, stop=stack.__contains__)
    windows = {"win-only"} if target.platform == "win_amd64" else set()
    assert names == {"app", "lib-a", "lib-b", "lib-c", "lib-d"} | extra | windows
    cudnn = set() if target.platform == "win_amd64" else {"nvidia-cudnn-cu13"}
    assert stack == {"torch", "torchvision", "triton", "cuda-toolkit", "nvidia-cublas"} | cudnn


def test_pins_win_and_a_stale_environment_is_refused():
    installed = {"a": "1.0", "b": "2.0"}.__getitem__
    assert wheelhouse.pinned_versions(["a", "b"], {"a": "1.0"}, installed) == {"a": "1.0", "b": "2.0"}
    with pytest.raises(wheelhouse.WheelhouseError, match=r"a: requirements/constraints.txt pins 1.1 but .* has 1.0"):
        wheelhouse.pinned_versions(["a"], {"a": "1.1"}, installed)


def test_a_dependency_missing_here_is_named():
    with pytest.raises(wheelhouse.WheelhouseError, match="no-such-dist-xyz is needed on the target but not installed"):
        wheelhouse.installed_requires("no-such-dist-xyz")


def test_read_pins(tmp_path: Path):
    (tmp_path / "c.txt").write_text("# comment\nTorch==2.14.1  # why\n\nimagecorruptions_imaug==1.1.5\n")
    assert wheelhouse.read_pins(tmp_path / "c.txt") == {"torch": "2.14.1", "imagecorruptions-imaug": "1.1.5"}


# --- the target ---------------------------------------------------------------------------------------------------


def test_a_manylinux_target_takes_the_older_manylinux_tags_too():
    tags = H200.platform_tags()
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64"} < set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert Target("3.12", "macosx_14_0_arm64").platform_tags() == ["macosx_14_0_arm64"]
    options = H200.pip_options()
    assert options[:4] == ["--python-version", "3.12", "--implementation", "cp"]
    assert options.count("--platform") == len(tags)


def test_the_markers_are_the_targets():
    linux = H200.marker_environment()
    assert (linux["python_version"], linux["python_full_version"]) == ("3.12", "3.12.0")
    assert (linux["sys_platform"], linux["platform_system"], linux["platform_machine"]) == ("linux", "Linux", "x86_64")
    windows = Target("3.12", "win_amd64").marker_environment()
    assert (windows["sys_platform"], windows["os_name"], windows["platform_machine"]) == ("win32", "nt", "AMD64")
    assert Target("3.13", "macosx_14_0_arm64").marker_environment()["platform_machine"] == "arm64"
    with pytest.raises(wheelhouse.WheelhouseError, match="unknown platform tag 'solaris_sparc'"):
        Target("3.12", "solaris_sparc").marker_environment()


# --- the manifest -------------------------------------------------------------------------------------------------


def test_the_manifest_lists_every_wheel_and_the_install_line():
    versions = {"timm": "1.0.31", "kpca-attention": "0.1.0", "addict": "2.4.0"}
    text = wheelhouse.manifest(H200, versions, ["addict"], ["torch", "triton"], Path("dist/wheelhouse-x"))
    pinned = [Requirement(line.split("#")[0]) for line in text.splitlines() if not line.startswith("#")]
    assert {r.name: str(r.specifier) for r in pinned} == {name: f"=={v}" for name, v in versions.items()}
    assert "CPython 3.12 on manylinux_2_28_x86_64" in text
    assert "torch, triton." in text
    assert "python3 -m pip install --no-index --no-deps --upgrade --target $HOME/kpca-site wheelhouse-x/*.whl" in text
    assert "addict==2.4.0  # no wheel on the index for the target: built from its sdist" in text
    assert max(len(line) for line in text.splitlines()) <= 120


def test_the_docs_give_the_install_line_the_script_writes():
    docs = (REPO / "docs" / "cluster.md").read_text()
    line = wheelhouse.install_line(Path("dist/wheelhouse-cp312-manylinux_2_28_x86_64"))
    assert line.replace("dist/", "") in docs or line in docs, line
    assert wheelhouse.environment_line() in docs


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--python", "3"], "'3' is not a Python version MAJOR.MINOR such as 3.12"),
        (["--python", "cp312"], "'cp312' is not a Python version"),
        (["--platform", "solaris_sparc"], "'solaris_sparc' is not a wheel platform tag such as manylinux_2_28_x86_64"),
    ],
)
def test_bad_arguments_are_refused_with_the_value(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        wheelhouse.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_python_the_project_does_not_support_is_refused_before_any_download(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wheelhouse, "run_pip", pytest.fail)
    assert wheelhouse.main(["--python", "3.9", "--dest", str(tmp_path / "w")]) == 1
    assert re.search(r"--python 3.9: kpca-[a-z-]+ needs Python >=3.10; choose such a version", capsys.readouterr().err)


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


class FakePip:
    """Stands in for pip: the index has no wheel for the target, ``here_wheel`` (if any) for this interpreter, and
    building from the sdist writes a wheel tagged ``built_tag``."""

    def __init__(self, built_tag="py3-none-any", download_error="No matching distribution found", here_wheel=None):
        self.built_tag, self.download_error, self.here_wheel, self.calls = built_tag, download_error, here_wheel, []

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        name, version = args[-1].split("==")
        if args[0] == "download" and "--platform" not in args and self.here_wheel:
            self.calls.append("download here")
            folder = Path(args[args.index("--dest") + 1])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / self.here_wheel).write_text("")
            return subprocess.CompletedProcess(args, 0, "", "")
        if args[0] == "download":
            self.calls.append("download" if "--platform" in args else "download here")
            return subprocess.CompletedProcess(args, 1, "", f"ERROR: {self.download_error} for {args[-1]}")
        self.calls.append(args[0])
        folder = Path(args[args.index("--wheel-dir") + 1])
        (folder / f"{name.replace('-', '_')}-{version}-{self.built_tag}.whl").write_text("")
        return subprocess.CompletedProcess(args, 0, "", "")


def test_a_pure_python_package_without_a_wheel_is_built_from_its_sdist(tmp_path, monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(wheelhouse, "run_pip", pip)
    wheel, built = wheelhouse.fetch("addict", "2.4.0", H200, tmp_path)
    assert built and wheel == tmp_path / "addict-2.4.0-py3-none-any.whl" and wheel.is_file()
    assert pip.calls == ["download", "download here", "wheel"]


def test_a_missing_platform_wheel_fails_naming_the_package_and_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "run_pip", FakePip(built_tag="cp311-cp311-linux_x86_64"))
    with pytest.raises(wheelhouse.WheelhouseError) as error:
        wheelhouse.fetch_all({"simplejpeg": "1.9.0", "numba": "0.68.1"}, H200, tmp_path)
    message = str(error.value)
    assert message.startswith("2 of 2 wheels could not be had")
    for name in ("simplejpeg==1.9.0", "numba==0.68.1"):
        assert f"no wheel of {name} for CPython 3.12 on manylinux_2_28_x86_64 on the index" in message
    assert "platform-specific wheel" in message and not list(tmp_path.glob("*.whl"))


def test_a_package_with_wheels_for_other_platforms_is_not_built(tmp_path, monkeypatch):
    pip = FakePip(here_wheel="numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl")
    monkeypatch.setattr(wheelhouse, "run_pip", pip)
    with pytest.raises(wheelhouse.WheelhouseError) as error:
        wheelhouse.fetch("numpy", "2.4.6", Target("3.12", "manylinux_2_5_x86_64"), tmp_path)
    assert str(error.value).startswith(
        "no wheel of numpy==2.4.6 for CPython 3.12 on manylinux_2_5_x86_64 on the index (there is"
        " numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl for this machine); pin a version of numpy"
    )
    assert pip.calls == ["download", "download here"]


def test_another_pip_failure_is_passed_on(tmp_path, monkeypatch):
    monkeypatch.setattr(wheelhouse, "run_pip", FakePip(download_error="HTTP error 503"))
    with pytest.raises(wheelhouse.WheelhouseError, match=r"pip download timm==1.0.31 failed:\n.*HTTP error 503"):
        wheelhouse.fetch("timm", "1.0.31", H200, tmp_path)


def test_is_pure():
    assert wheelhouse.is_pure(Path("addict-2.4.0-py3-none-any.whl"))
    assert not wheelhouse.is_pure(Path("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"))
    assert not wheelhouse.is_pure(Path("tensorboard_data_server-0.7.2-py3-none-manylinux_2_31_x86_64.whl"))


# --- the Makefile -----------------------------------------------------------------------------------------------


def make_dry_run(*args: str) -> str:
    """What ``make -n`` would run, with the .venv stamp out of date (``-W``).

    Run as a top-level make (no ``MAKEFLAGS`` / ``MAKELEVEL`` of a ``make test`` around the tests, which would add
    "Entering directory" lines and pass on its own flags).
    """
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    command = ["make", "--no-print-directory", "-n", "-W", "requirements/constraints.txt", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_test_gpu_with_a_given_python_creates_no_venv():
    assert "pip install" in make_dry_run("test-gpu")  # the ordinary case installs .venv first
    assert make_dry_run("test-gpu", "PY=python3").split() == ["python3", "benchmarks/gpu_proof.py"]


def test_make_wheelhouse_passes_the_target_on():
    out = make_dry_run("wheelhouse", "WHEELHOUSE_PYTHON=3.12", "WHEELHOUSE_PLATFORM=manylinux_2_28_x86_64")
    assert " ".join(out.split()).endswith("requirements/wheelhouse.py --python 3.12 --platform manylinux_2_28_x86_64")
    assert " ".join(make_dry_run("wheelhouse").split()).endswith("requirements/wheelhouse.py")


def test_a_nodes_freeze_is_read_and_bad_lines_named(tmp_path: Path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# pip freeze of the node\nnumpy==2.5.2\nLightning==2.6.6\n-e git+https://x/y#egg=y\n\n"
                      "torch @ file:///wheels/torch.whl\nPyYAML  # a bare name: a hand-written list\n")  # fmt: skip
    assert wheelhouse.read_freeze(freeze) == {"numpy": "2.5.2", "lightning": "2.6.6", "torch": "?", "pyyaml": "?"}
    freeze.write_text("numpy>=2\n")
    with pytest.raises(wheelhouse.WheelhouseError, match=r"freeze.txt:1: 'numpy>=2' is no 'name==version' line"):
        wheelhouse.read_freeze(freeze)


H200_RUN_CARRIED = {
    "jsonargparse", "docstring-parser", "typeshed-client", "simplejpeg", "timm", "imagecorruptions-imaug", "mmengine",
    "mmcv-lite", "mmsegmentation", "addict", "yapf", "termcolor", "prettytable", "wcwidth", "ftfy", "platformdirs",
    "datasets", "dill", "multiprocess", "pillow", "pytest",
}  # fmt: skip
"""What the first H200 run installed from carried wheels beside the five kpca distributions."""


def test_the_h200_image_list_leaves_exactly_what_that_run_carried_and_the_newer_dependencies(planned):
    versions, stack, _ = planned
    have = wheelhouse.read_freeze(REPO / "requirements" / "h200-image.txt")
    assert {name for name, version in have.items() if version != "?"} == {
        "torch", "torchvision", "triton", "lightning", "torchmetrics", "numba", "numpy",
    }  # fmt: skip
    assert set(have) <= set(versions) | stack  # no name the project does not need
    carry, _ = wheelhouse.leave_to_node(versions, have)
    assert set(carry) == H200_RUN_CARRIED | {"torchdata", "pytest-xdist", "execnet"}


def test_what_the_node_has_is_left_to_it_and_listed_in_the_manifest(tmp_path: Path):
    versions = {"numpy": "2.4.6", "timm": "1.0.31", "lightning": "2.6.6"}
    carry, on_node = wheelhouse.leave_to_node(versions, {"numpy": "2.5.2", "lightning": "2.6.6", "scipy": "1.16.0"})
    assert carry == {"timm": "1.0.31"}
    assert on_node == {"numpy": ("2.5.2", "2.4.6"), "lightning": ("2.6.6", "2.6.6")}
    target = wheelhouse.Target("3.12", "manylinux_2_28_x86_64")
    text = wheelhouse.manifest(target, carry, [], ["torch"], tmp_path / "wh", on_node)
    assert (
        "# Left out, already on the node (--have): lightning 2.6.6 (pinned 2.6.6), numpy 2.5.2 (pinned 2.4.6)." in text
    )
    assert "timm==1.0.31" in text and "numpy==" not in text
