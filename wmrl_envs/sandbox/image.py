"""Build the Docker sandbox image offline: debootstrap a minimal Debian, import it as an image.

No container registry is needed: ``debootstrap --variant=minbase`` fetches packages from
the host's own apt mirror (the one in ``/etc/apt/sources.list*``), the tree is trimmed,
streamed through ``tar`` into ``docker import`` (via the SDK), and checked by importing
the pinned packages in a network-less container. The solutions' libraries are not Debian's:
the host's pinned runtime venv (:mod:`wmrl_envs.sandbox.runtime`, built first if missing) is
copied into the tree at the same path. The suite defaults to the host's Debian release, so
the venv's interpreter is the same ``/usr/bin/python3`` and both backends run the same
interpreter and library versions.
Needs root (debootstrap) and takes a few minutes, once per machine::

    python -m wmrl_envs.sandbox.cli build-image [--if-missing]

Functions: :func:`build_image`, :func:`image_tag`, :func:`image_exists`, :func:`host_suite`,
:func:`apt_mirror`, :func:`docker_client`. Constants: :data:`PACKAGES`, :data:`IMAGE_REVISION`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from wmrl_envs.sandbox.base import SANDBOX_DIR, SandboxUnavailable
from wmrl_envs.sandbox.runtime import RUNTIME_DIR, build_runtime, expected_versions

__all__ = [
    "PACKAGES",
    "IMAGE_REVISION",
    "build_image",
    "image_tag",
    "image_exists",
    "docker_client",
    "host_suite",
    "apt_mirror",
]

log = logging.getLogger(__name__)

#: Debian packages of the image besides the minbase system: the interpreter the runtime venv
#: is built on, and the OpenMP library LightGBM links against.
PACKAGES = ("python3", "libgomp1")

#: Bumped whenever the recipe changes, so ``--if-missing`` rebuilds stale images.
IMAGE_REVISION = 2

_FALLBACK_SUITE = "bookworm"
_FALLBACK_MIRROR = "http://deb.debian.org/debian"
# Trimmed after debootstrap: caches and docs nobody inside the sandbox needs.
_TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


def host_suite() -> str:
    """The host's Debian codename (``bookworm`` when the host is not Debian)."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return _FALLBACK_SUITE
    fields = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', text, re.M))
    codename = fields.get("VERSION_CODENAME")
    return codename if fields.get("ID") == "debian" and codename else _FALLBACK_SUITE


def image_tag(suite: str | None = None) -> str:
    """The image name the Docker backend uses by default, e.g. ``wmrl-sandbox:bookworm-1``."""
    return f"wmrl-sandbox:{suite or host_suite()}-{IMAGE_REVISION}"


def apt_mirror(suite: str, sources_dir: str = "/etc/apt") -> str:
    """The Debian archive URI the host's apt uses for ``suite`` (one-line or deb822 format)."""
    files = [Path(sources_dir, "sources.list")] + sorted(Path(sources_dir, "sources.list.d").glob("*"))
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                f = {k.lower(): v.split() for k, v in re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M)}
                if suite in f.get("suites", []) and f.get("uris"):
                    return f["uris"][0]
        else:
            for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
                if m.group(2) == suite:
                    return m.group(1)
    return _FALLBACK_MIRROR


def docker_client(client=None):
    """``client`` itself, or a pinged ``docker.from_env()``; :class:`SandboxUnavailable` if none."""
    if client is not None:
        return client
    try:
        import docker
    except ImportError as e:
        raise SandboxUnavailable("the docker SDK is not installed: pip install 'wmrl-envs[docker]'") from e
    try:
        c = docker.from_env()
        c.ping()
        return c
    except Exception as e:  # the SDK raises several unrelated types for "no engine"
        raise SandboxUnavailable(f"no Docker engine reachable ({e}); start dockerd first") from e


def image_exists(tag: str | None = None, client=None) -> bool:
    """Whether ``tag`` is present in the local engine."""
    import docker.errors

    try:
        docker_client(client).images.get(tag or image_tag())
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(
    tag: str | None = None,
    *,
    suite: str | None = None,
    mirror: str | None = None,
    packages: Sequence[str] = PACKAGES,
    if_missing: bool = False,
    client=None,
    work_base: str = "/var/tmp",
    progress: bool = True,
) -> str:
    """Build (or, with ``if_missing``, keep) the sandbox image; returns its tag.

    Args:
        tag: image name (default :func:`image_tag` of ``suite``).
        suite: Debian release to bootstrap (default: the host's, see :func:`host_suite`).
        mirror: apt archive URI (default: the host's, see :func:`apt_mirror`).
        packages: packages added to the minbase system.
        if_missing: do nothing when ``tag`` already exists.
        work_base: where the temporary root tree goes (~1.5 GB while building).
        progress: show a tqdm bar over the build stages.
    """
    suite = suite or host_suite()
    tag = tag or image_tag(suite)
    client = docker_client(client)
    if if_missing and image_exists(tag, client):
        log.info("sandbox image %s already present", tag)
        return tag
    if os.geteuid() != 0:
        raise PermissionError("building the sandbox image runs debootstrap, which needs root")
    if shutil.which("debootstrap") is None:
        raise SandboxUnavailable("debootstrap is not installed (apt-get install debootstrap)")
    mirror = mirror or apt_mirror(suite)
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="wmrl-image-", dir=work_base))
    root = tmp / "root"
    build_runtime(if_missing=True)
    stages = ["debootstrap", "trim", "import", "verify"]
    bar = tqdm(total=len(stages), desc=f"building {tag}", disable=not progress)
    try:
        bar.set_postfix_str(f"debootstrap {suite} from {mirror}")
        _debootstrap(suite, root, mirror, packages, bar)
        bar.update(1)
        for rel in _TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        (root / SANDBOX_DIR.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
        shutil.copytree(RUNTIME_DIR, root / str(RUNTIME_DIR).lstrip("/"), symlinks=True)
        bar.update(1)
        bar.set_postfix_str("docker import")
        _import(client, root, tag)
        bar.update(1)
        bar.set_postfix_str("verify")
        check = "import importlib, json, sys; print(json.dumps({m: importlib.import_module(m).__version__ for m in sys.argv[1:]}))"
        want = expected_versions()
        out = client.containers.run(
            tag,
            [str(RUNTIME_DIR / "bin" / "python"), "-c", check, *sorted(want)],
            network_mode="none",
            remove=True,
        )
        if json.loads(out) != want:
            raise RuntimeError(f"image {tag} failed its self-check: {out!r} (want {want})")
        bar.update(1)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built sandbox image %s in %.0f s", tag, time.monotonic() - t0)
    return tag


def _debootstrap(suite: str, root: Path, mirror: str, packages: Sequence[str], bar) -> None:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(root), mirror]
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-20:]
            bar.set_postfix_str(line.strip()[:60], refresh=True)
    if proc.returncode != 0:
        raise RuntimeError(f"debootstrap failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _import(client, root: Path, tag: str) -> None:
    repository, _, version = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
    changes = [
        f"WORKDIR {SANDBOX_DIR}",
        "ENV LANG=C.UTF-8",
        'CMD ["python3"]',
        f"LABEL org.wmrl.sandbox.revision={IMAGE_REVISION}",
    ]
    # tar keeps devices, hardlinks and ownership exactly; the SDK streams its output.
    with subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
        client.api.import_image_from_stream(tar.stdout, repository=repository, tag=version, changes=changes)
    if tar.returncode != 0:
        raise RuntimeError(f"tar of the image tree failed (exit {tar.returncode})")
