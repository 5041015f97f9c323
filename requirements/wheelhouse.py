"""`make wheelhouse`: one folder of wheels that installs the project on a GPU node with its own torch and no internet.

The folder holds wheels of the five kpca distributions and of every distribution they need at run time (with every
extra a GPU run and ``make test-gpu`` need; ``kpca-vision-cls[dali]`` only with ``--dali``), for one Python version
and manylinux platform. It leaves out the node's own stack: torch, torchvision, triton and whatever only they need
(their ``nvidia-*`` and ``cuda-*`` libraries, sympy, ...). uv resolves the closure for the target (``uv pip compile
--python-version --python-platform --only-binary :all:``) at the pins of requirements/constraints.txt, with the node's
stack overridden away; pip downloads the locked wheels for the target (``pip download --no-deps --only-binary=:all:``)
and builds the kpca ones (``pip wheel --no-deps``). ``requirements.txt`` in the folder lists every wheel with its
version and the install line. Run from the repository root::

    python requirements/wheelhouse.py                                   # this interpreter's Python and platform
    python requirements/wheelhouse.py --python 3.12 --platform manylinux_2_28_x86_64 --dest dist/wheelhouse
    python requirements/wheelhouse.py --dali                            # also NVIDIA DALI (about 700 MB)
    python requirements/wheelhouse.py --have node-freeze.txt            # only what the node's `pip freeze` lacks

uv and pip read their usual index settings (``UV_INDEX_URL`` / ``PIP_INDEX_URL``, ``--find-links`` as
``UV_FIND_LINKS`` / ``PIP_FIND_LINKS``, ...).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
MEMBER_GLOBS = ("packages/*/pyproject.toml", "apps/*/pyproject.toml")
NODE_STACK = ("torch", "torchvision", "triton")
"""What the node's image provides; overridden away, so that whatever only these need stays out too."""
FLAGGED_EXTRAS = ("dali",)
"""Extras left out unless their flag is given (``--dali``)."""
EXTRA_ROOTS = ("pytest",)
"""Wanted besides the kpca distributions: ``make test-gpu`` runs pytest."""
UV_GLIBC_MINORS = (17, 28, *range(31, 41))
"""The glibc versions 2.X that uv's ``--python-platform`` names (``x86_64-manylinux_2_28``)."""
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MANIFEST = "requirements.txt"
SITE = "$HOME/kpca-site"
"""The folder the install line installs into (any folder will do)."""


class WheelhouseError(RuntimeError):
    """A wheelhouse that cannot be made, with the reason and the way out."""


@dataclass(frozen=True)
class Target:
    """The node's interpreter: CPython ``python`` (``"3.12"``) on ``platform`` (``manylinux_2_<X>_<arch>``)."""

    python: str
    platform: str

    def glibc(self) -> tuple[int, str]:
        """The glibc minor version X and the architecture of the platform tag."""
        match = re.fullmatch(r"manylinux_2_(\d+)_(x86_64|aarch64)", self.platform)
        if match is None or int(match[1]) < UV_GLIBC_MINORS[0]:
            raise WheelhouseError(
                f"unknown platform tag {self.platform!r}: a manylinux_2_X_<x86_64|aarch64> tag with X >= 17,"
                " e.g. manylinux_2_28_x86_64"
            )
        return int(match[1]), match[2]

    def uv_platform(self) -> str:
        """The ``--python-platform`` of uv: the newest one it names that the target runs (``x86_64-manylinux_2_28``)."""
        minor, arch = self.glibc()
        return f"{arch}-manylinux_2_{max(m for m in UV_GLIBC_MINORS if m <= minor)}"

    def platform_tags(self) -> list[str]:
        """The platform tag and every older manylinux tag the target also runs (pip adds none of them itself)."""
        minor, arch = self.glibc()
        tags = []
        for m in range(minor, 4, -1):
            tags += [f"manylinux_2_{m}_{arch}"] + ([f"{LEGACY_MANYLINUX[m]}_{arch}"] if m in LEGACY_MANYLINUX else [])
        return tags

    def pip_options(self) -> list[str]:
        """The options that make ``pip download`` pick wheels for the target rather than for this interpreter."""
        options = ["--python-version", self.python, "--implementation", "cp"]
        for tag in self.platform_tags():
            options += ["--platform", tag]
        return options

    def describe(self) -> str:
        """``CPython 3.12 on manylinux_2_28_x86_64``."""
        return f"CPython {self.python} on {self.platform}"


def this_interpreter() -> Target:
    """The target of a plain run: this interpreter's version and its most specific manylinux tag."""
    platform = next((t.platform for t in sys_tags() if t.platform.startswith("manylinux_")), "manylinux_2_28_x86_64")
    return Target(f"{sys.version_info.major}.{sys.version_info.minor}", platform)


@dataclass(frozen=True)
class Member:
    """One kpca distribution of the repository, read from its pyproject.toml."""

    path: Path
    name: str
    version: str
    extras: tuple[str, ...]


def project_members(root: Path = REPO) -> list[Member]:
    """The kpca distributions under packages/ and apps/."""
    members = []
    for pyproject in sorted(p for pattern in MEMBER_GLOBS for p in root.glob(pattern)):
        project = tomllib.loads(pyproject.read_text())["project"]
        extras = tuple(sorted(project.get("optional-dependencies", {})))
        members.append(Member(pyproject.parent, project["name"], project["version"], extras))
    return members


def root_requirements(members: list[Member], flagged: list[str]) -> list[str]:
    """Each member, from its folder, with all its extras but the flagged ones not asked for; and :data:`EXTRA_ROOTS`."""
    leave_out = set(FLAGGED_EXTRAS) - set(flagged)
    roots = []
    for member in members:
        extras = ",".join(e for e in member.extras if e not in leave_out)
        roots.append(f"{member.name}{f'[{extras}]' if extras else ''} @ {member.path.as_uri()}")
    return roots + list(EXTRA_ROOTS)


def run(command: list[str], what: str) -> str:
    """Run ``command``; its standard output, or a WheelhouseError naming ``what`` with the end of its output."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise WheelhouseError(f"{what} failed:\n{tail}")
    return result.stdout


def lock(target: Target, members: list[Member], flagged: list[str]) -> dict[str, str]:
    """``name -> version`` of every third-party distribution the wheelhouse carries, as uv resolves it for ``target``.

    Only versions with a wheel for the target are chosen; the node's stack is overridden with a marker that never
    holds, which drops it and whatever only it needs from the resolution.
    """
    target_options = ["--python", sys.executable, "--python-version", target.python]
    target_options += ["--python-platform", target.uv_platform(), "--only-binary", ":all:"]
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        roots, overrides = Path(tmp, "roots.txt"), Path(tmp, "overrides.txt")
        roots.write_text("\n".join(root_requirements(members, flagged)) + "\n")
        overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in NODE_STACK))
        uv = [sys.executable, "-m", "uv", "pip", "compile", str(roots), "--constraint", str(CONSTRAINTS)]
        output = ["--override", str(overrides), "--no-header", "--no-annotate", "--quiet"]
        text = run(
            [*uv, *output, *target_options], f"resolving the dependencies for {target.describe()} (uv pip compile)"
        )
    pinned = (line.split("==") for line in text.splitlines() if "==" in line)
    return {canonicalize_name(name): version for name, version in pinned}


def read_freeze(path: Path) -> dict[str, str]:
    """``name -> version`` of a node's ``pip freeze`` (or ``pip list --format=freeze``) output.

    ``name==version``, ``name @ url`` and bare ``name`` lines count (the last two with version ``?``: a hand-written
    list of what a node's image has, such as ``requirements/h200-image.txt``); comments, blank lines and ``-e`` lines
    are skipped.
    """
    have = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*\S+)?", line)
        if match is None:
            raise WheelhouseError(f"{path}:{number}: {raw!r} is no 'name==version' line of pip freeze, nor a bare name")
        have[canonicalize_name(match[1])] = match[2] or "?"
    return have


def leave_to_node(versions: dict[str, str], have: dict[str, str]) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Split the third-party ``versions`` into what to carry and what the node ``have``s: name -> (its, locked)."""
    carry = {name: version for name, version in versions.items() if name not in have}
    return carry, {name: (have[name], version) for name, version in versions.items() if name in have}


def install_line(dest: Path) -> str:
    """The command that installs the wheelhouse ``dest`` on the node, beside its torch."""
    return f"python3 -m pip install --no-index --no-deps --upgrade --target {SITE} {dest.name}/*.whl"


def environment_line() -> str:
    """The command that puts the installed wheels on the node's Python path and their console scripts on PATH."""
    return f'export PYTHONPATH="{SITE}${{PYTHONPATH:+:$PYTHONPATH}}" PATH="{SITE}/bin:$PATH"'


def manifest(target: Target, versions: dict[str, str], dest: Path, on_node: dict[str, tuple[str, str]]) -> str:
    """The folder's ``requirements.txt``: what it holds for which target, what it leaves out, how to install it.

    ``on_node`` maps what ``--have`` left out to (the node's version, the version the wheelhouse would have carried).
    """
    stack = ", ".join(NODE_STACK)
    node = ", ".join(f"{name} {have} (locked {locked})" for name, (have, locked) in sorted(on_node.items()))
    wrap = {"width": 118, "initial_indent": "# ", "subsequent_indent": "# ", "break_on_hyphens": False}
    lines = [
        f"# kpca wheelhouse for {target.describe()}, written by requirements/wheelhouse.py at the versions of",
        "# requirements/constraints.txt.",
        f"# Left out, the node's own stack: {stack} and whatever only they need.",
        *(textwrap.wrap(f"Left out, already on the node (--have): {node}.", **wrap) if node else []),
        "# Install on the node, beside its torch (docs/cluster.md), from the folder above this one:",
        f"#   {install_line(dest)}",
        f"#   {environment_line()}",
    ]
    return "\n".join(lines + [f"{name}=={versions[name]}" for name in sorted(versions)]) + "\n"


def prepare(dest: Path) -> None:
    """An empty ``dest``: an earlier wheelhouse there (it has the manifest) is removed, anything else refused."""
    if dest.exists() and any(dest.iterdir()):
        if not (dest / MANIFEST).is_file():
            raise WheelhouseError(f"{dest} is not empty and holds no wheelhouse ({MANIFEST}); choose another --dest")
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)


def build_members(members: list[Member], dest: Path) -> None:
    """Wheels of the kpca distributions (``pip wheel --no-deps``), in ``dest``."""
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dest), *(str(m.path) for m in members)],
        "building the kpca wheels (pip wheel)")  # fmt: skip


def download(versions: dict[str, str], target: Target, dest: Path) -> None:
    """The wheel of each ``name==version`` for ``target``, in ``dest`` (one ``pip download --no-deps``)."""
    if versions:
        wanted = [f"{name}=={version}" for name, version in sorted(versions.items())]
        options = ["--no-deps", "--only-binary=:all:", *target.pip_options(), "--dest", str(dest)]
        run([sys.executable, "-m", "pip", "download", *options, *wanted], "downloading the wheels (pip download)")


def build(target: Target, dest: Path, flagged: list[str], have: dict[str, str]) -> str:
    """Make the wheelhouse; returns a summary (wheel count, size, time, the install line).

    ``have``: the node's installed distributions (``--have``); those are not carried, whatever their version.
    """
    start = time.monotonic()
    members = project_members()
    versions, on_node = leave_to_node(lock(target, members, flagged), have)
    prepare(dest)
    build_members(members, dest)
    download(versions, target, dest)
    kpca = {canonicalize_name(m.name): m.version for m in members}
    (dest / MANIFEST).write_text(manifest(target, versions | kpca, dest, on_node))
    wheels = list(dest.glob("*.whl"))
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    return (
        f"{len(wheels)} wheels ({len(kpca)} kpca, {len(on_node)} left to the node), {size_mb:.0f} MB, for"
        f" {target.describe()}, in {time.monotonic() - start:.0f} s: {dest}\n"
        f"install on the node, from {dest.parent}:\n  {install_line(dest)}"
    )


def python_version(text: str) -> str:
    """``--python``: ``MAJOR.MINOR``."""
    if not re.fullmatch(r"3\.\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version MAJOR.MINOR such as 3.12")
    return text


def platform_tag(text: str) -> str:
    """``--platform``: a manylinux platform tag that uv can resolve for."""
    try:
        Target("3.12", text).glibc()
    except WheelhouseError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--dest`` defaults to a folder under dist/ named after the target."""
    here = this_interpreter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=python_version, default=here.python, help=f"default: {here.python}")
    parser.add_argument("--platform", type=platform_tag, default=here.platform, help=f"default: {here.platform}")
    parser.add_argument("--dest", type=Path, help="default: dist/wheelhouse-cp<version>-<platform>")
    parser.add_argument("--dali", action="store_true", help="also kpca-vision-cls[dali]: NVIDIA DALI, about 700 MB")
    parser.add_argument(
        "--have",
        type=Path,
        help="the node's `pip freeze`: leave out what it already has, whatever the version (the manifest lists them)",
    )
    args = parser.parse_args(argv)
    if args.dest is None:
        args.dest = REPO / "dist" / f"wheelhouse-cp{args.python.replace('.', '')}-{args.platform}"
    return args


def main(argv: list[str] | None = None) -> int:
    """Make the wheelhouse the command line asks for; 1 with the reason on stderr when it cannot be made."""
    args = parse_args(argv)
    flagged = [extra for extra in FLAGGED_EXTRAS if getattr(args, extra)]
    try:
        have = read_freeze(args.have) if args.have else {}
        print(build(Target(args.python, args.platform), args.dest.resolve(), flagged, have))
    except WheelhouseError as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
