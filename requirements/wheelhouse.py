"""`make wheelhouse`: one folder of wheels that installs the project on a GPU node with its own torch and no internet.

The folder holds wheels of the five kpca distributions and of every distribution they need at run time (with
every extra a GPU run and ``make test-gpu`` need; ``kpca-vision-cls[dali]`` only with ``--dali``), at the
versions of requirements/constraints.txt, for one Python version and platform. It leaves out the node's own
stack: torch, torchvision, triton, the ``nvidia-*`` and ``cuda-*`` distributions they pull in, and whatever only
those need. The closure is read from the metadata of the distributions installed in this interpreter's environment
(``make install`` puts the pinned stack there), with the markers evaluated for the target. Each wheel comes from
the index (``pip download --only-binary=:all: --no-deps`` for the target); a pure-Python package with no wheel is
built here from its sdist. ``requirements.txt`` in the folder lists every wheel with its version and the install
line. Run from the repository root::

    python requirements/wheelhouse.py                                   # this interpreter's Python and platform
    python requirements/wheelhouse.py --python 3.12 --platform manylinux_2_28_x86_64 --dest dist/wheelhouse
    python requirements/wheelhouse.py --dali                            # also NVIDIA DALI (about 700 MB)
    python requirements/wheelhouse.py --have node-freeze.txt            # only what the node's `pip freeze` lacks
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
MEMBER_GLOBS = ("packages/*/pyproject.toml", "apps/*/pyproject.toml")
NODE_STACK = ("torch", "torchvision", "triton")
"""What the node's image provides, with the ``nvidia-*`` / ``cuda-*`` distributions these pull in."""
CUDA_PREFIXES = ("nvidia-", "cuda-")
FLAGGED_EXTRAS = ("dali",)
"""Extras left out unless their flag is given (``--dali``)."""
EXTRA_ROOTS = ("pytest",)
"""Wanted besides the kpca distributions: ``make test-gpu`` runs pytest."""
MANIFEST = "requirements.txt"
SITE = "$HOME/kpca-site"
"""The folder the install line installs into (any folder will do)."""
DOWNLOAD_WORKERS = 8


class WheelhouseError(RuntimeError):
    """A wheelhouse that cannot be made, with the reason and the way out."""


@dataclass(frozen=True)
class Target:
    """The node's interpreter: CPython ``python`` (``"3.12"``) on ``platform`` (a wheel platform tag)."""

    python: str
    platform: str

    PLATFORMS = (
        (r"(?:many|musl)?linux(?:_\d+_\d+|\d+)?_(?P<arch>\w+)", ("linux", "Linux", "posix")),
        (r"macosx_\d+_\d+_(?P<arch>\w+)", ("darwin", "Darwin", "posix")),
        (r"win_(?P<arch>\w+)", ("win32", "Windows", "nt")),
    )
    """Platform tag pattern -> (sys_platform, platform_system, os_name) for markers."""

    def platform_markers(self) -> dict[str, str]:
        """``sys_platform``, ``platform_system``, ``os_name`` and ``platform_machine`` of the target's platform."""
        for pattern, (sys_platform, system, os_name) in self.PLATFORMS:
            match = re.fullmatch(pattern, self.platform)
            if match:
                machine = match["arch"].upper() if os_name == "nt" else match["arch"]  # win_amd64: AMD64
                return dict(
                    sys_platform=sys_platform, platform_system=system, os_name=os_name, platform_machine=machine
                )
        raise WheelhouseError(f"unknown platform tag {self.platform!r}; e.g. manylinux_2_28_x86_64")

    def marker_environment(self) -> dict[str, str]:
        """The values PEP 508 markers are evaluated with on the target (the rest from this interpreter)."""
        here = default_environment()
        same = self.python == here["python_version"]
        return {
            **here,
            "python_version": self.python,
            "python_full_version": here["python_full_version"] if same else f"{self.python}.0",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            **self.platform_markers(),
        }

    def platform_tags(self) -> list[str]:
        """``platform`` and the older tags a node of that kind also runs (pip does not add them for manylinux_2_X)."""
        match = re.fullmatch(r"(many|musl)linux_(\d+)_(\d+)_(\w+)", self.platform)
        if not match:
            return [self.platform]
        family, major, minor, arch = match[1], int(match[2]), int(match[3]), match[4]
        oldest = 5 if family == "many" else 1
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"} if family == "many" else {}
        tags = []
        for m in range(minor, oldest - 1, -1):
            tags.append(f"{family}linux_{major}_{m}_{arch}")
            if m in legacy:
                tags.append(f"{legacy[m]}_{arch}")
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
    """The target of a plain run: this interpreter's version and its most specific platform tag."""
    platform = next(t.platform for t in sys_tags() if not t.platform.startswith("linux_"))
    return Target(default_environment()["python_version"], platform)


@dataclass(frozen=True)
class Member:
    """One kpca distribution of the repository, read from its pyproject.toml."""

    path: Path
    name: str
    version: str
    extras: tuple[str, ...]
    requires_python: str


def project_members(root: Path = REPO) -> list[Member]:
    """The kpca distributions under packages/ and apps/."""
    members = []
    for pyproject in sorted(p for pattern in MEMBER_GLOBS for p in root.glob(pattern)):
        project = tomllib.loads(pyproject.read_text())["project"]
        extras = tuple(sorted(project.get("optional-dependencies", {})))
        requires_python = project.get("requires-python", "")
        members.append(Member(pyproject.parent, project["name"], project["version"], extras, requires_python))
    return members


def root_requirements(members: Iterable[Member], flagged: Iterable[str] = ()) -> list[Requirement]:
    """Each member with all its extras but the flagged ones not asked for, and :data:`EXTRA_ROOTS`."""
    leave_out = set(FLAGGED_EXTRAS) - set(flagged)
    roots = []
    for member in members:
        extras = [e for e in member.extras if e not in leave_out]
        roots.append(Requirement(f"{member.name}[{','.join(extras)}]" if extras else member.name))
    return roots + [Requirement(name) for name in EXTRA_ROOTS]


def installed_requires(name: str) -> list[str]:
    """The requirement strings of the distribution ``name`` installed in this environment."""
    try:
        return importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        raise WheelhouseError(
            f"{name} is needed on the target but not installed in this environment ({sys.prefix}), whose metadata"
            " gives the closure; install the pinned stack with `make install` (for a dependency only the target's"
            " Python needs, add a pin for it to requirements/constraints.txt and install it here)"
        ) from None


def closure(
    roots: Iterable[Requirement],
    requires: Callable[[str], list[str]],
    environment: dict[str, str],
    stop: Callable[[str], bool] = lambda name: False,
) -> set[str]:
    """Canonical names of the distributions ``roots`` need, transitively, with their extras, on ``environment``.

    A name for which ``stop`` is true is neither included nor walked through: what only it needs stays out.
    """
    walked: dict[str, set[str]] = {}  # name -> extras whose requirements were followed ("" for the base ones)
    todo = list(roots)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if stop(name):
            continue
        new = {""} | {canonicalize_name(e) for e in requirement.extras}
        new -= walked.setdefault(name, set())
        if not new:
            continue
        walked[name] |= new
        for text in requires(name):
            dependency = Requirement(text)
            marker = dependency.marker
            if marker is None or any(marker.evaluate({**environment, "extra": extra}) for extra in new):
                todo.append(dependency)
    return set(walked)


def node_stack(requires: Callable[[str], list[str]], environment: dict[str, str]) -> set[str]:
    """The node's own stack: :data:`NODE_STACK` and the ``nvidia-*`` / ``cuda-*`` distributions they need."""
    reached = closure([Requirement(name) for name in NODE_STACK], requires, environment)
    return set(NODE_STACK) | {name for name in reached if name.startswith(CUDA_PREFIXES)}


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``name -> version`` of the ``name==version`` lines of a constraints file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def installed_version(name: str) -> str:
    """The version of the distribution ``name`` installed in this environment."""
    return importlib.metadata.version(name)


def pinned_versions(
    names: Iterable[str], pins: dict[str, str], installed: Callable[[str], str] = installed_version
) -> dict[str, str]:
    """The version of each name: its pin, else the version installed here (which the closure was read from).

    Raises:
        WheelhouseError: a pinned version that is not the installed one (the closure would not be the pins').
    """
    versions = {}
    for name in sorted(names):
        have = installed(name)
        pin = pins.get(name)
        if pin is not None and Version(pin) != Version(have):
            raise WheelhouseError(
                f"{name}: requirements/constraints.txt pins {pin} but this environment has {have}; run `make install`"
                " (or pip install -r requirements/dev.txt) to bring it to the pins, then rerun"
            )
        versions[name] = pin or have
    return versions


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
    """Split the third-party ``versions`` into what to carry and what the node ``have``s: name -> (its, pinned)."""
    carry = {name: version for name, version in versions.items() if name not in have}
    return carry, {name: (have[name], version) for name, version in versions.items() if name in have}


def plan(target: Target, flagged: Iterable[str] = ()) -> tuple[dict[str, str], set[str], list[Member]]:
    """What the wheelhouse holds for ``target``: third-party ``name -> version``, the left-out stack, the members."""
    members = project_members()
    environment = target.marker_environment()
    stack = node_stack(installed_requires, environment)
    names = closure(root_requirements(members, flagged), installed_requires, environment, stop=stack.__contains__)
    names -= {canonicalize_name(m.name) for m in members}
    pins = read_pins() | {canonicalize_name(m.name): m.version for m in members}
    return pinned_versions(names, pins), stack, members


def run_pip(*args: str) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` with this interpreter, its output captured."""
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def tail(result: subprocess.CompletedProcess, lines: int = 15) -> str:
    """The last ``lines`` lines of a pip run's output, for an error message."""
    return "\n".join((result.stdout + result.stderr).strip().splitlines()[-lines:])


def is_pure(wheel: Path) -> bool:
    """Whether ``wheel`` runs on any platform and Python 3 (``py3-none-any``)."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return all(t.abi == "none" and t.platform == "any" for t in tags)


def only_wheel(folder: Path) -> Path:
    """The one wheel in ``folder``."""
    (wheel,) = folder.glob("*.whl")
    return wheel


def fetch(name: str, version: str, target: Target, dest: Path) -> tuple[Path, bool]:
    """The wheel of ``name==version`` for ``target``, moved into ``dest``, and whether it was built here.

    Raises:
        WheelhouseError: the index has no wheel for the target and the sdist does not build a pure-Python one.
    """
    with tempfile.TemporaryDirectory(prefix=f"wheelhouse-{name}-") as tmp:
        result = run_pip(
            "download", "--no-deps", "--only-binary=:all:", *target.pip_options(), "--dest", tmp, f"{name}=={version}"
        )
        built = result.returncode != 0
        if built:
            if "No matching distribution" not in result.stdout + result.stderr:
                raise WheelhouseError(f"pip download {name}=={version} failed:\n{tail(result)}")
            build_pure_wheel(name, version, target, Path(tmp))
        wheel = only_wheel(Path(tmp))
        return Path(shutil.move(wheel, dest / wheel.name)), built


def build_pure_wheel(name: str, version: str, target: Target, folder: Path) -> None:
    """Build ``name==version`` from its sdist into ``folder``, for a package with no wheel at all, if pure Python."""
    no_wheel = f"no wheel of {name}=={version} for {target.describe()} on the index"
    here = wheel_for_this_interpreter(name, version, folder / "here")
    if here is not None:
        raise WheelhouseError(
            f"{no_wheel} (there is {here} for this machine); pin a version of {name} that has a wheel for the target"
            " in requirements/constraints.txt"
        )
    result = run_pip("wheel", "--no-deps", "--no-binary", name, "--wheel-dir", str(folder), f"{name}=={version}")
    if result.returncode != 0:
        raise WheelhouseError(f"{no_wheel}, and building one from its sdist failed:\n{tail(result)}")
    wheel = only_wheel(folder)
    if not is_pure(wheel):
        wheel.unlink()
        raise WheelhouseError(
            f"{no_wheel}, and its sdist builds a platform-specific wheel ({wheel.name}), which is not built here (it"
            f" would not be portable to the node); pin a version of {name} that has a wheel for the target in"
            " requirements/constraints.txt"
        )


def wheel_for_this_interpreter(name: str, version: str, folder: Path) -> str | None:
    """The file name of a wheel of ``name==version`` on the index for this interpreter, or None.

    A package with such a wheel is not one without wheels: its sdist is not built (it may compile for minutes).
    """
    result = run_pip("download", "--no-deps", "--only-binary=:all:", "--dest", str(folder), f"{name}=={version}")
    return only_wheel(folder).name if result.returncode == 0 else None


def fetch_all(versions: dict[str, str], target: Target, dest: Path) -> dict[str, tuple[Path, bool]]:
    """:func:`fetch` of every ``name==version``, a few at a time; every failure is reported, in one error."""
    with ThreadPoolExecutor(DOWNLOAD_WORKERS) as pool:
        futures = {name: pool.submit(fetch, name, version, target, dest) for name, version in versions.items()}
    results, errors = {}, []
    for name, future in futures.items():
        try:
            results[name] = future.result()
        except WheelhouseError as error:
            errors.append(str(error))
    if errors:
        raise WheelhouseError(f"{len(errors)} of {len(versions)} wheels could not be had:\n" + "\n".join(errors))
    return results


def build_members(members: Iterable[Member], dest: Path) -> list[Path]:
    """Wheels of the kpca distributions (``pip wheel --no-deps``), in ``dest``."""
    before = set(dest.glob("*.whl"))
    result = run_pip("wheel", "--no-deps", "--wheel-dir", str(dest), *(str(m.path) for m in members))
    if result.returncode != 0:
        raise WheelhouseError(f"building the kpca wheels failed:\n{tail(result)}")
    return sorted(set(dest.glob("*.whl")) - before)


def install_line(dest: Path) -> str:
    """The command that installs the wheelhouse ``dest`` on the node, beside its torch."""
    return f"python3 -m pip install --no-index --no-deps --upgrade --target {SITE} {dest.name}/*.whl"


def environment_line() -> str:
    """The command that puts the installed wheels on the node's Python path and their console scripts on PATH."""
    return f'export PYTHONPATH="{SITE}${{PYTHONPATH:+:$PYTHONPATH}}" PATH="{SITE}/bin:$PATH"'


def manifest(
    target: Target,
    versions: dict[str, str],
    built: Iterable[str],
    stack: Iterable[str],
    dest: Path,
    on_node: dict[str, tuple[str, str]] | None = None,
) -> str:
    """The folder's ``requirements.txt``: what it holds for which target, what it leaves out, how to install it.

    ``on_node`` maps what ``--have`` left out to (the node's version, the version the wheelhouse would have carried).
    """
    built = set(built)
    left_out = "Left out, the node's own stack (and whatever only it needs): " + ", ".join(sorted(stack)) + "."
    node = ", ".join(f"{name} {have} (pinned {pin})" for name, (have, pin) in sorted((on_node or {}).items()))
    from_node = [f"Left out, already on the node (--have): {node}."] if node else []
    wrap = {"width": 118, "initial_indent": "# ", "subsequent_indent": "# ", "break_on_hyphens": False}
    lines = [
        f"# kpca wheelhouse for {target.describe()}, written by requirements/wheelhouse.py at the versions of",
        "# requirements/constraints.txt.",
        *textwrap.wrap(left_out, **wrap),
        *(line for text in from_node for line in textwrap.wrap(text, **wrap)),
        "# Install on the node, beside its torch (docs/cluster.md), from the folder above this one:",
        f"#   {install_line(dest)}",
        f"#   {environment_line()}",
    ]
    for name in sorted(versions):
        note = "  # no wheel on the index for the target: built from its sdist (pure Python)" if name in built else ""
        lines.append(f"{name}=={versions[name]}{note}")
    return "\n".join(lines) + "\n"


def prepare(dest: Path) -> None:
    """An empty ``dest``: an earlier wheelhouse there (it has the manifest) is removed, anything else refused."""
    if dest.exists() and any(dest.iterdir()):
        if not (dest / MANIFEST).is_file():
            raise WheelhouseError(f"{dest} is not empty and holds no wheelhouse ({MANIFEST}); choose another --dest")
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)


def check_python(target: Target, members: Iterable[Member]) -> None:
    """Refuse a target Python some kpca distribution does not support."""
    for member in members:
        if member.requires_python and Version(target.python) not in SpecifierSet(member.requires_python):
            raise WheelhouseError(
                f"--python {target.python}: {member.name} needs Python {member.requires_python}; choose such a version"
            )


def build(target: Target, dest: Path, flagged: Iterable[str] = (), have: dict[str, str] | None = None) -> str:
    """Make the wheelhouse; returns a summary (wheel count, size, time, the install line).

    ``have``: the node's installed distributions (``--have``); those are not carried, whatever their version.
    """
    start = time.monotonic()
    check_python(target, project_members())
    versions, stack, members = plan(target, flagged)
    versions, on_node = leave_to_node(versions, have or {})
    prepare(dest)
    kpca = build_members(members, dest)
    fetched = fetch_all(versions, target, dest)
    all_versions = versions | {canonicalize_name(m.name): m.version for m in members}
    built = [name for name, (_, was_built) in fetched.items() if was_built]
    (dest / MANIFEST).write_text(manifest(target, all_versions, built, stack, dest, on_node))
    wheels = list(dest.glob("*.whl"))
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    return (
        f"{len(wheels)} wheels ({len(kpca)} kpca, {len(built)} built from sdists, {len(on_node)} left to the node),"
        f" {size_mb:.0f} MB, for"
        f" {target.describe()}, in {time.monotonic() - start:.0f} s: {dest}\n"
        f"install on the node, from {dest.parent}:\n  {install_line(dest)}"
    )


def python_version(text: str) -> str:
    """``--python``: ``MAJOR.MINOR``."""
    if not re.fullmatch(r"3\.\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python version MAJOR.MINOR such as 3.12")
    return text


def platform_tag(text: str) -> str:
    """``--platform``: a wheel platform tag whose markers :class:`Target` knows."""
    try:
        Target("3.12", text).marker_environment()
    except WheelhouseError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a wheel platform tag such as manylinux_2_28_x86_64, manylinux_2_28_aarch64,"
            " macosx_14_0_arm64 or win_amd64"
        ) from None
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
        have = read_freeze(args.have) if args.have else None
        print(build(Target(args.python, args.platform), args.dest.resolve(), flagged, have))
    except WheelhouseError as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
