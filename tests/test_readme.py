"""The README as a newcomer uses it: every shell command in it runs as shown (on the CPU), what
it shows as output is what the command prints, every link leads somewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!-- test: not run here \((.+)\) -->")


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, body, the line before the fence) of each fenced block, in order."""
    found = []
    for match in re.finditer(r"(?m)^```(\w*)\n(.*?)^```$", text, re.S):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((match.group(1), match.group(2), before))
    return found


def shell_blocks() -> list[tuple[int, str, str | None]]:
    """(index, commands, the output block that follows it, if any) of each sh block."""
    all_blocks = blocks(README.read_text())
    result = []
    for i, (language, body, before) in enumerate(all_blocks):
        if language != "sh" or SKIP.match(before):
            continue
        follows = all_blocks[i + 1] if i + 1 < len(all_blocks) else None
        output = follows[1] if follows is not None and follows[0] == "" else None
        result.append((i, body, output))
    return result


def test_the_readme_is_short_and_its_skipped_blocks_say_why() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    skipped = [(body, SKIP.match(before)) for language, body, before in blocks(text)
               if language == "sh" and SKIP.match(before)]
    ci = (ROOT / ".ci" / "run").read_text()
    for body, reason in skipped:  # what is not run here is what CI runs
        assert "ci/run" in reason.group(1)
        for line in body.splitlines():
            command = line.split("#")[0].strip()
            assert command and command.split()[-1] in ci, command
    assert len(shell_blocks()) >= 2


def shown_in(shown: str, printed: list[str]) -> bool:
    """Whether a line the README shows was printed: as it is; or, shortened with ``...``, a
    line that starts with its first part and holds the others in order (what varies from run
    to run — a path, a count — left out)."""
    if "..." not in shown:
        return shown in printed
    first, *rest = shown.split("...")
    for line in printed:
        if not line.startswith(first):
            continue
        at = len(first)
        for part in rest:
            found = line.find(part, at)
            if found < 0:
                break
            at = found + len(part)
        else:
            return True
    return False


@pytest.mark.parametrize("index", [i for i, _, _ in shell_blocks()])
def test_every_shell_command_runs_as_shown(index: int, tmp_path: Path) -> None:
    """In a copy of what the commands read (examples/, the committed traces), with the
    installed ``autoannot`` command, its temporary folder the test's; what they print on
    stdout and stderr (a job's log) is what the README shows."""
    _, body, output = next(b for b in shell_blocks() if b[0] == index)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "tests" / "data" / "gpu" / "graphs",
                    tmp_path / "tests" / "data" / "gpu" / "graphs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOANNOT")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["TMPDIR"] = str(tmp_path / "tmp")  # (a job's rings with the watch on: there)
    (tmp_path / "tmp").mkdir()
    printed = []
    for line in body.splitlines():
        command = line.split(" # ")[0].strip()
        if not command or command.startswith("#"):
            continue
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        printed += done.stdout.splitlines() + done.stderr.splitlines()
    for shown in (output or "").splitlines():
        if shown.strip() in ("", "..."):
            continue
        assert shown_in(shown, printed), (shown, printed)


def test_every_link_leads_somewhere() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (page.parent / target).exists(), (page.name, target)
    linked = set(re.findall(r"\]\(docs/([^)#]+)", README.read_text()))
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked  # every page reachable


def test_the_golden_folder_lists_what_it_holds() -> None:
    folder = ROOT / "tests" / "data" / "golden"
    text = (folder / "README.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([\w.{},]+)`", line.split("|")[1])}
    assert named == {p.name for p in folder.iterdir() if p.name != "README.md"}
