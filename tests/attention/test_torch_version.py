"""The torch floor: an older torch is refused at import with the installed version and the fix in the message."""

import subprocess
import sys

import pytest

from kpca.attention._torch_version import ALLOW_ENV_VAR, MIN_TORCH, check_torch_version, release


@pytest.mark.parametrize(
    ("version", "expected"),
    [("2.11.0+cu130", (2, 11)), ("2.14.1", (2, 14)), ("2.12.0.dev20260301+cpu", (2, 12)), ("3.0.0a0", (3, 0))],
)
def test_release_reads_major_and_minor(version, expected):
    assert release(version) == expected


def test_release_refuses_an_unreadable_version():
    with pytest.raises(ValueError, match="'unknown'"):
        release("unknown")


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.14.1", "3.0.0"])
def test_supported_versions_pass(version):
    check_torch_version(version, environ={})


@pytest.mark.parametrize("version", ["2.10.1+cu128", "2.4.0", "1.13.1"])
def test_an_older_torch_is_refused_with_the_fix(version):
    with pytest.raises(ImportError) as error:
        check_torch_version(version, environ={})
    message = str(error.value)
    assert f"found torch {version}" in message
    assert "torch>=2.11" in message and f"{ALLOW_ENV_VAR}=1" in message


def test_the_override_imports_an_older_torch():
    check_torch_version("2.10.1", environ={ALLOW_ENV_VAR: "1"})
    with pytest.raises(ImportError):
        check_torch_version("2.10.1", environ={ALLOW_ENV_VAR: "yes"})  # only the documented value


def test_the_floor_is_the_one_the_distribution_declares():
    from importlib.metadata import requires

    declared = [r for r in requires("kpca-attention") if r.startswith("torch")]
    assert declared == [f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}"], declared


def test_importing_the_package_on_an_older_torch_fails_with_the_message():
    code = "import torch; torch.__version__ = '2.10.1'; import kpca.attention"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "ImportError: kpca.attention needs torch >= 2.11" in done.stderr and "found torch 2.10.1" in done.stderr
