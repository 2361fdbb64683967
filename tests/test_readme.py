"""The README as a user meets it: every command block runs, in order, on `unmask example-data`'s sample; the figures
it shows are what the commands print (the lesson's JSON, the demo variations' figures, the quickstart's sample lines,
the keys of the JSON a command prints)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import shared_data

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def unmask(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "unmask.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of `language` ("" for plain ones), in order."""
    found, current, opened = [], None, ""
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, opened = [], line[3:].strip()
            else:
                if opened == language:
                    found.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return found


def test_the_lesson_json_is_what_demo_prints():
    shown = next(block for block in blocks("json") if '"masking"' in block)
    assert json.loads(shown) == json.loads(unmask("demo", "--json"))


def test_the_quickstart_sample_lines_are_printed(tmp_path):
    shown = next(block for block in blocks("") if "<- right" in block)
    printed = unmask("quickstart", "--output_dir", str(tmp_path / "qs"))
    for line in shown.strip().splitlines():
        assert " ".join(line.split()) in " ".join(printed.split()), line


SMALL = [(r"--max_steps \d+", "--max_steps 6"), (r"max_steps=\d+", "max_steps=6"), (r"--warmup_steps \d+",
         "--warmup_steps 1"), (r"--(save|eval)_steps \d+", r"--\1_steps 3"), (r"--num_train_epochs \d+",
                                                                          "--num_train_epochs 1")]


def small(command: str) -> str:
    """The command with its step and epoch counts cut to a few (the sample data is small; so is the test's time)."""
    for pattern, replacement in SMALL:
        command = re.sub(pattern, replacement, command)
    return command


def commands(block: str) -> list[tuple[str, str]]:
    """A bash block's commands (continuation lines joined), each with the comment line under it ("" if none)."""
    lines = block.replace("\\\n", " ").splitlines()
    found = []
    for n, line in enumerate(lines):
        if line.strip() and not line.startswith("#"):
            below = lines[n + 1] if n + 1 < len(lines) and lines[n + 1].startswith("#") else ""
            found.append((line, below))
    return found


class ReadmeSession:
    """What a user's terminal keeps between blocks: the working directory, the shell variables, the servers."""

    def __init__(self, workdir: Path, server_class):
        self.workdir, self.server_class = workdir, server_class
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.servers: dict[str, object] = {}  # the README's port -> the running server

    def shell(self, command: str) -> subprocess.CompletedProcess:
        for port, server in self.servers.items():
            command = command.replace(f"localhost:{port}", f"127.0.0.1:{server.port}")
        if command.startswith("curl ") and shutil.which("curl") is None:  # the same request, without curl
            words = shlex.split(command)
            url = next(w for w in words if w.startswith("127.0.0.1:"))
            request = urllib.request.Request(f"http://{url}", data=words[words.index("-d") + 1].encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                return subprocess.CompletedProcess(command, 0, response.read().decode(), "")
        done = subprocess.run(["bash", "-c", small(command)], cwd=self.workdir, env=self.env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr[-3000:])
        assert "\r" not in done.stderr, (command, "a progress bar drew into a log")  # stderr is a pipe here
        return done

    def run(self, command: str, comment: str) -> None:
        variable = re.match(r"(\w+)=(.*)", command)
        if variable:  # M=$(python -c ...): kept for the block's next commands, as a shell keeps it
            self.env[variable[1]] = self.shell(f"echo {variable[2]}").stdout.strip()
        elif command.startswith("unmask serve "):
            words = shlex.split(command, comments=True)
            port = words[words.index("--port") + 1]
            flags = words[3:words.index("--port")] + words[words.index("--port") + 2:]
            self.servers[port] = self.server_class(self.workdir / words[2], *flags)
        else:
            printed = self.shell(command).stdout
            for figure in re.findall(r"\d+\.\d+", command.partition("#")[2]):  # `unmask demo ... # falls to 0.696`
                assert figure in printed, (command, figure)
            if command.startswith("curl"):
                assert "error" not in json.loads(printed), (command, printed)
            shown = re.findall(r'"([\w@]+)":', comment)
            if shown:  # the keys the README shows under the command are the keys it prints
                assert set(shown) <= set(json.loads(printed)), (command, printed)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()


def test_every_readme_command_runs_on_the_sample_data(tmp_path, server_class):
    """Every bash and Python block in the README's order, in one working directory, on `unmask example-data`'s
    files; only `make` (which runs this suite) and the torchrun lines written as templates (`...`) are left out."""
    session = ReadmeSession(tmp_path, server_class)
    ran = 0
    try:
        for language, block in ((m[1], m[2]) for m in re.finditer(r"```(bash|python)\n(.*?)```", README, re.S)):
            if language == "python":
                script = tmp_path / "block.py"
                script.write_text(small(block))
                session.shell(f"python {script}")
                ran += 1
                continue
            for command, comment in commands(block):
                if command.startswith("make ") or " ..." in command:
                    assert command.startswith(("make quickstart", "make test", "torchrun")), command
                    continue
                session.run(command, comment)
                ran += 1
            session.stop()
    finally:
        session.stop()
    assert ran >= 30


@pytest.mark.slow
def test_the_figures_shown_under_commands_are_the_public_datas(tmp_path, server_class):
    """The JSON figures the README shows under a command (`# {"spearman": 0.8672, ...}`) are what it prints on the
    public datasets laid out as `data/` (slow: retrieval embeds SciFact's 5,183 abstracts)."""
    (tmp_path / "data").symlink_to(shared_data())
    session = ReadmeSession(tmp_path, server_class)
    checked = 0
    for block in blocks("bash"):
        for command, comment in commands(block):
            if re.match(r"\w+=", command):
                session.run(command, comment)
            elif re.search(r'": \d', comment):
                printed = json.loads(session.shell(command).stdout)
                for key, figure in re.findall(r'"([\w@]+)": (\d+(?:\.\d+)?)', comment):
                    # one query's ranking may flip with another CPU's kernels: 1e-3 is about one of 809 queries
                    assert printed[key] == pytest.approx(float(figure), abs=1e-3), (command, key)
                checked += 1
    assert checked >= 2  # eval sts, eval retrieval
