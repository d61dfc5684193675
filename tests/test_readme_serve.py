"""The README's "Use it from TRL / OpenEnv" recipes run as written (issue 28): the section's bash
block is the ``wmrl-serve`` command, started here on a free loopback port; its Python blocks then
run in order, in-process, each printing, as a reader would run them."""

from __future__ import annotations

import contextlib
import io
import re
import socket

import pytest

pytest.importorskip("openenv")
pytest.importorskip("trl")

from serve_helpers import ROOT, Server, servers  # noqa: E402,F401

PORT = "8011"


def section_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Use it from TRL / OpenEnv\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(python|bash)\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_the_section_has_the_recipes_the_issue_asks_for():
    code = "\n".join(c for _, c in section_blocks())
    for must in ("wmrl-serve", "--stack wmrl", "wmrl/Remote-v0", "/reset", "GRPOTrainer", "environment_factory"):
        assert must in code, must


def test_use_it_from_trl_and_openenv_recipes_run(servers, tmp_path, monkeypatch):
    blocks = section_blocks()
    (language, command), rest = blocks[0], blocks[1:]
    assert language == "bash" and command.startswith("wmrl-serve ")
    port = free_port()
    args = command.split()[1:]
    args = [port if a == PORT else str(tmp_path / a) if a.startswith("runs/") else a for a in args]
    args.remove("--port")
    args.remove(port)
    server = Server(*[a for a in args if a not in ("--max-turns", "1")])  # the helper sets --port 0, --max-turns 1
    servers.append(server)
    monkeypatch.chdir(tmp_path)
    for language, code in rest:
        assert language == "python"
        code = code.replace("http://127.0.0.1:" + PORT, server.url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
        assert out.getvalue().strip(), "a recipe must print what it shows"
    assert server.get("/metrics")["steps"] >= 6
    server.stop()
    assert (tmp_path / "runs/serve/state.json").is_file()
