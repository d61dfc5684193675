"""The solutions' runtime: one pinned, modern ML stack for both sandbox backends.

Agents write scikit-learn >= 1.4, LightGBM and XGBoost. Debian bookworm's packages stop at
scikit-learn 1.2 and have no LightGBM, so solutions run under a dedicated virtual
environment instead: :data:`RUNTIME_DIR` (``/opt/wmrl-runtime``), built on the system
``python3`` with exactly :data:`RUNTIME_PINS` (binary wheels from PyPI, no dependency
resolution: the list is the whole closure). It is world-readable, so the sandbox's
non-root uids can use it; the local backend mounts it read-only, and the Docker image
copies it to the same path (:mod:`wmrl_envs.sandbox.image`), so both backends run the same
interpreter with the same library versions. Build it once (root, a minute)::

    python -m wmrl_envs.sandbox.cli build-runtime --if-missing

What a policy may import is listed in every task's prompt (:func:`runtime_prompt_line`),
and the world model checks imports against :func:`runtime_inventory` (a committed JSON
snapshot of the runtime's modules and public names, so predicting needs no runtime).

Functions: :func:`build_runtime`, :func:`runtime_python`, :func:`runtime_versions`,
:func:`runtime_inventory`, :func:`write_inventory`, :func:`runtime_prompt_line`.
Constants: :data:`RUNTIME_DIR`, :data:`RUNTIME_PINS`, :data:`IMPORT_NAMES`.

>>> RUNTIME_PINS["scikit-learn"] >= "1.4"
True
>>> "lightgbm" in runtime_prompt_line()
True
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wmrl_envs.sandbox.base import SandboxUnavailable

__all__ = [
    "RUNTIME_DIR",
    "RUNTIME_PINS",
    "IMPORT_NAMES",
    "INVENTORY_PATH",
    "build_runtime",
    "runtime_python",
    "runtime_versions",
    "runtime_inventory",
    "write_inventory",
    "runtime_prompt_line",
]

log = logging.getLogger(__name__)

#: Where the runtime lives on the host (and, copied, in the Docker image).
RUNTIME_DIR = Path(os.environ.get("WMRL_RUNTIME_DIR", "/opt/wmrl-runtime"))

#: The whole runtime: distribution -> exact version (every dependency listed, installed
#: with ``--no-deps``, so nothing floats). ``xgboost-cpu`` is XGBoost without the CUDA
#: libraries (it imports as ``xgboost``).
RUNTIME_PINS: Mapping[str, str] = {
    "numpy": "2.2.6",
    "scipy": "1.15.3",
    "pandas": "2.2.3",
    "python-dateutil": "2.9.0.post0",
    "pytz": "2025.2",
    "tzdata": "2025.2",
    "six": "1.17.0",
    "scikit-learn": "1.6.1",
    "joblib": "1.5.1",
    "threadpoolctl": "3.6.0",
    "lightgbm": "4.6.0",
    "xgboost-cpu": "2.1.4",
}

#: The import name of each pinned distribution a solution would import.
IMPORT_NAMES: Mapping[str, str] = {
    "numpy": "numpy",
    "scipy": "scipy",
    "pandas": "pandas",
    "scikit-learn": "sklearn",
    "joblib": "joblib",
    "lightgbm": "lightgbm",
    "xgboost-cpu": "xgboost",
}

#: Committed snapshot of the runtime's importable modules and public names.
INVENTORY_PATH = Path(__file__).parent / "runtime_inventory.json"

_STAMP = "wmrl-runtime.json"
_BASE_PYTHON = "/usr/bin/python3"

# Run inside the runtime: versions, every top-level module, the public names of the
# sklearn / xgboost / lightgbm submodules an agent imports from, and the keyword parameters
# of every class whose constructor takes no **kwargs (a removed keyword is a TypeError).
_INVENTORY_SCRIPT = r"""
import importlib, inspect, json, pkgutil, sys
mods = sorted({m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names) | set(sys.stdlib_module_names))
versions, names, params = {}, {}, {}
for dist, mod in json.loads(sys.argv[1]).items():
    m = importlib.import_module(mod)
    versions[mod] = m.__version__
    subs = [mod]
    if hasattr(m, "__path__"):
        subs += [mod + "." + s.name for s in pkgutil.iter_modules(m.__path__) if not s.name.startswith("_")
                 and s.name not in ("tests", "conftest")]
    for sub in subs:
        try:
            sm = importlib.import_module(sub)
        except Exception:
            continue
        names[sub] = sorted(n for n in dir(sm) if not n.startswith("_"))
        for n in names[sub]:
            obj = getattr(sm, n, None)
            if not inspect.isclass(obj) or n in params:
                continue
            try:
                sig = inspect.signature(obj.__init__)
            except (TypeError, ValueError):
                continue
            if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                params[n] = [p for p in sig.parameters if p != "self"]
print(json.dumps({"modules": mods, "versions": versions, "names": names, "params": params}))
"""


def runtime_python(root: str | Path | None = None) -> str | None:
    """The runtime's interpreter, or ``None`` when it is not built (or built with other pins)."""
    root = Path(root or RUNTIME_DIR)
    python = root / "bin" / "python"
    try:
        stamp = json.loads((root / _STAMP).read_text())
    except (OSError, ValueError):
        return None
    return str(python) if stamp.get("pins") == dict(RUNTIME_PINS) and python.exists() else None


def runtime_versions(python: str) -> dict[str, str]:
    """``{import name: __version__}`` of the pinned packages, as ``python`` imports them."""
    code = (
        "import importlib, json, sys; print(json.dumps({m: importlib.import_module(m).__version__ "
        "for m in json.loads(sys.argv[1])}))"
    )
    out = subprocess.run(
        [python, "-I", "-c", code, json.dumps(sorted(set(IMPORT_NAMES.values())))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise SandboxUnavailable(f"the runtime {python} cannot import its packages: {out.stderr.strip()[-500:]}")
    return dict(json.loads(out.stdout))


def expected_versions() -> dict[str, str]:
    """``{import name: version}`` the pins promise (what :func:`runtime_versions` must return)."""
    return {IMPORT_NAMES[d]: RUNTIME_PINS[d] for d in IMPORT_NAMES}


def build_runtime(root: str | Path | None = None, *, if_missing: bool = False, base_python: str = _BASE_PYTHON) -> str:
    """Create the runtime venv at ``root`` with exactly :data:`RUNTIME_PINS`; returns its python.

    Installs binary wheels only, with ``--no-deps``, using this process's pip (the system
    python may lack pip and ``ensurepip``); verifies every pinned version imports, then
    makes the tree world-readable. With ``if_missing``, an existing runtime with the same
    pins is kept.
    """
    root = Path(root or RUNTIME_DIR)
    if if_missing and runtime_python(root):
        return str(root / "bin" / "python")
    if not Path(base_python).exists():
        raise SandboxUnavailable(f"the runtime is built on {base_python}, which is missing (apt-get install python3)")
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    pins = [f"{d}=={v}" for d, v in RUNTIME_PINS.items()]
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*cmd, "--no-compile", *pins], check=True)
    # byte-compile as root now: the sandbox uids cannot write __pycache__ later
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(root / "lib")], check=False, capture_output=True)
    got = runtime_versions(python)
    if got != expected_versions():
        raise SandboxUnavailable(f"the runtime at {root} imports {got}, not the pinned {expected_versions()}")
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    (root / _STAMP).write_text(json.dumps({"pins": dict(RUNTIME_PINS), "versions": got}, indent=1))
    log.info("solutions' runtime ready at %s: %s", root, got)
    return python


def write_inventory(python: str, path: str | Path = INVENTORY_PATH) -> dict[str, Any]:
    """Snapshot what ``python`` can import (modules, versions, public names) to ``path``."""
    out = subprocess.run(
        [python, "-I", "-c", _INVENTORY_SCRIPT, json.dumps(dict(IMPORT_NAMES))],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    if out.returncode != 0:
        raise SandboxUnavailable(f"cannot take the runtime inventory: {out.stderr.strip()[-500:]}")
    inventory = json.loads(out.stdout)
    inventory["pins"] = dict(RUNTIME_PINS)
    Path(path).write_text(json.dumps(inventory, sort_keys=True, separators=(",", ":")) + "\n")
    runtime_inventory.cache_clear()
    return dict(inventory)


@functools.lru_cache(maxsize=1)
def runtime_inventory() -> dict[str, Any]:
    """The committed snapshot: ``{"modules": [...], "versions": {...}, "names": {module: [...]},
    "params": {class: [keyword, ...]}, "pins": {...}}``."""
    return dict(json.loads(INVENTORY_PATH.read_text()))


def runtime_prompt_line() -> str:
    """The sentence every task prompt carries about what a solution may import."""
    libs = ", ".join(f"{d.removesuffix('-cpu')} {RUNTIME_PINS[d]}" for d in IMPORT_NAMES if d != "joblib")
    return f"Python 3.11 with {libs} (and the standard library); nothing else is installed, no network."
