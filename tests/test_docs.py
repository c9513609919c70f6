"""Every code sample in README.md and docs/*.md runs, so the docs cannot rot.

Fenced blocks are read in order, one temporary directory per document:

- ``sh`` / ``bash`` blocks run as one bash script (``set -e``): the block's exit
  status is the first failing command's, or 0;
- ``console`` blocks run each ``$ command`` on its own (a line ending in ``\\``
  continues it on the next, which may start with the ``>`` prompt); the lines
  under a command are its expected output, each one a whole line where ``...``
  stands for anything;
- ``python`` blocks run as a script, or are written as a file with ``file=``;
- ``ini`` / ``toml`` / ``yaml`` / ``loop`` blocks are file contents: they need
  ``file=`` and are parsed (a ``.loop`` or ``*.loop.yaml`` by pytest-loops itself)
  unless marked ``invalid`` (a sample of bad input);
- ``json`` blocks are parsed; ``text``, ``diff`` and ``markdown`` are not run.

An HTML comment right above a block steers it::

    <!-- doc-test: setup=buggy-project expect-exit=2 expect="MAX_ITER" -->
    <!-- doc-test: file=fix.loop -->
    <!-- doc-test: skip reason="needs a real agent CLI" -->

``pytest`` and ``pytest-loops`` in a sample are this interpreter's, through a
shim directory first on PATH, so samples run verbatim. Agent CLIs get a
stand-in executable of the same name (``setup=agent-stand-in``). The README
carries no comments: its blocks get their directives from ``README_BLOCKS``.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_FILES = [README, *sorted(DOCS.glob("*.md"))]

SHELL = {"sh", "bash", "shell"}
CONSOLE = {"console"}
PYTHON = {"python", "py"}
FILE_LANGS = {"ini", "toml", "yaml", "yml", "loop", "cfg"}
NOT_RUN = {"", "text", "diff", "markdown", "md", "json"}
KNOWN_KEYS = {"setup", "file", "expect-exit", "expect", "skip", "reason", "same-keys-as", "timeout",
              "invalid", "run", "ci-command"}
BLOCK_TIMEOUT_S = 120

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")


@dataclass
class Block:
    """One fenced code block and the directives written above it."""

    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    directives: dict[str, list[str]] = field(default_factory=dict)

    def get(self, key: str, default: str | None = None) -> str | None:
        values = self.directives.get(key)
        return values[-1] if values else default

    def where(self) -> str:
        return f"{self.doc.name}:{self.line}"


def parse_directives(body: str, where: str) -> dict[str, list[str]]:
    """``key=value key2="two words" flag`` -> {key: [value], key2: ["two words"], flag: [""]}."""
    found: dict[str, list[str]] = {}
    for word in shlex.split(body):
        key, _, value = word.partition("=")
        if key not in KNOWN_KEYS:
            raise ValueError(f"{where}: unknown doc-test directive {key!r}; known: {sorted(KNOWN_KEYS)}")
        found.setdefault(key, []).append(value)
    return found


def parse_blocks(path: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a markdown file, with their directives."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    pending: dict[str, list[str]] = {}
    pending_at = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _DIRECTIVE.match(line)
        if m:
            for key, values in parse_directives(m.group("body"), f"{path.name}:{i + 1}").items():
                pending.setdefault(key, []).extend(values)
            pending_at = pending_at or i + 1
            i += 1
            continue
        m = _FENCE.match(line)
        if m:
            indent, fence, info = len(m.group("indent")), m.group("fence"), m.group("info").strip()
            body: list[str] = []
            j = i + 1
            while j < len(lines):
                stripped = lines[j].strip()
                if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                    break
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            else:
                raise ValueError(f"{path.name}:{i + 1}: a code fence is never closed")
            lang = info.split()[0].lower() if info else ""
            blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", pending))
            pending, pending_at = {}, 0
            i = j + 1
            continue
        if pending and line.strip():
            raise ValueError(f"{path.name}:{pending_at}: a doc-test comment must sit right above "
                             "its code block (only blank lines between)")
        i += 1
    if pending:
        raise ValueError(f"{path.name}:{pending_at}: a doc-test comment with no code block after it")
    return blocks


# -- the README: no comments there, so its blocks are described here -----------------------

# (a piece of text that identifies the block, its directives)
README_BLOCKS: list[tuple[str, dict[str, list[str]]]] = [
    (".venv/bin/pytest-loops demo", {"run": ["pytest-loops demo"], "expect": ["SUCCESS (exit 0)"]}),
    ("pip install -q -e '.[test]'", {"ci-command": [""]}),
    ('--state "src/**/*.py"', {"setup": ["buggy-project"], "expect": ["SUCCESS (exit 0)"]}),
    ('claude -p "$(cat "$LOOP_PROMPT_FILE")"', {"setup": ["buggy-project", "agent-stand-in"],
                                                 "expect": ["SUCCESS (exit 0)"]}),
    ("--revise claude --max-cost 5", {"setup": ["buggy-project", "agent-stand-in"],
                                      "expect": ["SUCCESS (exit 0)"]}),
    ("@pytest.mark.loop(", {"setup": ["marked-project"], "file": ["tests/test_checkout.py"]}),
    ("pytest --loop --loop-revise", {"expect": ["repaired"]}),
    ('loop "fix calc":', {"setup": ["buggy-project"], "file": ["fix.loop"]}),
    ("pytest --loop fix.loop", {"expect": ["1 repaired"]}),
    ("pytest-loops report .pytest-loops", {"expect": ["loop run(s)"]}),
    ("pytest-loops watch fix.loop", {"skip": [""], "reason": ["a watch stays up until its silence window: "
                                                                "tests/test_watch.py runs both kinds"]}),
]


def readme_blocks() -> list[Block]:
    blocks = parse_blocks(README)
    for block in blocks:
        matches = [d for key, d in README_BLOCKS if key in block.text]
        if len(matches) != 1:
            raise ValueError(f"{block.where()}: README block matches {len(matches)} README_BLOCKS "
                             "entries; describe each README block in tests/test_docs.py exactly once")
        block.directives = {k: list(v) for k, v in matches[0].items()}
    return blocks


# -- project set-ups a sample can ask for ------------------------------------------------

BUGGY_FILES = {
    "pytest.ini": "[pytest]\npythonpath = src\n",
    "src/calc.py": "def add(a, b):\n    return a - b  # the bug\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    "fix.py": textwrap.dedent('''\
        """Repairs src/calc.py: the revise step of the examples."""
        from pathlib import Path

        path = Path("src/calc.py")
        path.write_text(path.read_text().replace("a - b", "a + b"))
        print("fixed src/calc.py")
        '''),
}

MARKED_TEST = textwrap.dedent('''\
    import pytest

    from calc import add


    @pytest.mark.loop(revise="python fix.py", max_iter=3)
    def test_add():
        assert add(2, 3) == 5
    ''')

# A stand-in for an agent CLI: it insists on the prompt it is given, then makes
# the fix a real agent would make. Named like the CLI, first on PATH.
AGENT_STAND_IN = textwrap.dedent('''\
    #!/bin/sh
    # stand-in for an agent CLI: `NAME -p PROMPT` (the prompt must be pytest-loops' prompt file)
    [ "$1" = "-p" ] || { echo "stand-in: expected -p PROMPT, got: $*" >&2; exit 2; }
    case "$2" in
      *"# Loop: "*"## Failing checks"*) ;;
      *) echo "stand-in: the prompt is not the loop's prompt file" >&2; exit 3 ;;
    esac
    [ -f "$LOOP_PROMPT_FILE" ] || { echo "stand-in: LOOP_PROMPT_FILE is not a file" >&2; exit 4; }
    exec python fix.py
    ''')
AGENT_NAMES = ("claude", "codex", "aider")


def _write(base: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def setup_buggy(work: Path, bin_dir: Path) -> None:
    _write(work, BUGGY_FILES)


def setup_marked(work: Path, bin_dir: Path) -> None:
    _write(work, {**BUGGY_FILES, "tests/test_calc.py": MARKED_TEST})


def setup_agent(work: Path, bin_dir: Path) -> None:
    for name in AGENT_NAMES:
        _write(bin_dir, {name: AGENT_STAND_IN})
        (bin_dir / name).chmod(0o755)


SETUPS: dict[str, Callable[[Path, Path], None]] = {
    "buggy-project": setup_buggy,
    "marked-project": setup_marked,
    "agent-stand-in": setup_agent,
}


# -- running --------------------------------------------------------------------------

SHIMS = {
    # -P: like the console scripts, the current directory is not put on sys.path
    "pytest": f'exec {shlex.quote(sys.executable)} -P -m pytest "$@"\n',
    "pytest-loops": f'exec {shlex.quote(sys.executable)} -P -m pytest_loops "$@"\n',
    "python": f'exec {shlex.quote(sys.executable)} "$@"\n',
    "python3": f'exec {shlex.quote(sys.executable)} "$@"\n',
}


def make_env(bin_dir: Path, temp_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "LOOP_")) and k not in ("PY_COLORS", "FORCE_COLOR", "NO_COLOR")}
    env["PATH"] = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), env.get("PATH", "")])
    # `pytest-loops demo` and `selftest` make temporary directories: keep them in the test's
    temp_dir.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(temp_dir)
    # hypothesis' pytest plugin costs seconds of start-up per pytest process on a
    # loaded machine; no sample uses it
    env["PYTEST_ADDOPTS"] = "-p no:hypothesispytest"
    env["COLUMNS"] = "80"
    return env


def make_shims(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in SHIMS.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
        path.chmod(0o755)


def _show(out: str, limit: int = 6000) -> str:
    return out if len(out) <= limit else "...\n" + out[-limit:]


def run_shell(script: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    # bash execs a lone command: a signal then shows as -N, where a shell says 128+N
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return code, proc.stdout


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (with ``\\`` continuations) and the output lines under each."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1  # a continuation line may carry the `> ` prompt of a shell
                command = command + "\n" + lines[i].removeprefix("> ")
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"output before the first `$ ` command: {line!r}")
        i += 1
    return steps


def line_pattern(expected: str) -> re.Pattern[str]:
    """An expected output line: literal text, where ``...`` stands for anything."""
    parts = [re.escape(p) for p in expected.rstrip().split("...")]
    return re.compile(".*?".join(parts))


def check_output(block: Block, command: str, expected: list[str], output: str) -> None:
    actual = [line.rstrip() for line in output.splitlines()]
    for want in expected:
        if not want.strip():
            continue
        pattern = line_pattern(want)
        if not any(pattern.fullmatch(line) for line in actual):
            pytest.fail(f"{block.where()}: `{command}` printed no line like\n  {want}\n"
                        f"output:\n{_show(output)}", pytrace=False)


def write_file(block: Block, work: Path, rel: str) -> None:
    target = work / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.text, encoding="utf-8")
    if block.get("invalid") is not None:  # a sample of bad input: written as it is
        return
    name = target.name.lower()
    try:
        if name.endswith((".yaml", ".yml")):
            yaml.safe_load(block.text)
        elif name.endswith(".toml"):
            tomllib.loads(block.text)
        elif name.endswith((".ini", ".cfg")):
            configparser.ConfigParser(interpolation=None).read_string(block.text)
        elif name.endswith(".py"):
            compile(block.text, str(target), "exec")
    except Exception as exc:  # noqa: BLE001 - any parse error fails the sample
        pytest.fail(f"{block.where()}: {rel} does not parse: {exc}", pytrace=False)
    from pytest_loops.errors import LoopUsageError
    from pytest_loops.sources import is_loop_file, load_any

    if is_loop_file(target):
        try:
            load_any(target)
        except LoopUsageError as exc:
            pytest.fail(f"{block.where()}: {rel} is not a valid loop file: {exc}", pytrace=False)


def key_shape(value):
    """The keys of nested dicts (a list stands for its first item)."""
    if isinstance(value, dict):
        return {k: key_shape(v) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [key_shape(value[0])]
    return None


def shape_differences(doc, real, path: str = "") -> list[str]:
    if isinstance(doc, dict) and isinstance(real, dict):
        out = [f"{path}{k}: documented, not in the real file" for k in doc if k not in real]
        out += [f"{path}{k}: in the real file, not documented" for k in real if k not in doc]
        for k in doc:
            if k in real:
                out += shape_differences(doc[k], real[k], f"{path}{k}.")
        return out
    if isinstance(doc, list) and isinstance(real, list):
        return shape_differences(doc[0], real[0], f"{path}[0].")
    return []


def run_block(block: Block, work: Path, bin_dir: Path, env: dict[str, str]) -> None:
    if block.get("skip") is not None:
        assert block.get("reason"), f"{block.where()}: a skipped block needs reason=..."
        return
    for name in block.directives.get("setup", []):
        assert name in SETUPS, f"{block.where()}: unknown setup {name!r}; known: {sorted(SETUPS)}"
        SETUPS[name](work, bin_dir)
    timeout = float(block.get("timeout") or BLOCK_TIMEOUT_S)
    expect_exit = int(block.get("expect-exit") or 0)
    rel = block.get("file")
    if block.get("ci-command") is not None:
        command = block.text.strip()
        assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8"), \
            f"{block.where()}: .ci/run does not run the README's test command {command!r}"
        return
    if rel:
        write_file(block, work, rel)
        return
    if block.lang in FILE_LANGS:
        pytest.fail(f"{block.where()}: a {block.lang} block is file contents: give it "
                    "<!-- doc-test: file=PATH --> (or skip reason=...)", pytrace=False)
    if block.lang == "json":
        try:
            data = json.loads(block.text)
        except json.JSONDecodeError as exc:
            pytest.fail(f"{block.where()}: not valid JSON: {exc}", pytrace=False)
        other = block.get("same-keys-as")
        if other:
            real = json.loads((work / other).read_text(encoding="utf-8"))
            problems = shape_differences(key_shape(data), key_shape(real))
            assert not problems, f"{block.where()}: the documented keys drifted:\n" + "\n".join(problems)
        return
    if block.lang in NOT_RUN:
        return
    if block.lang in CONSOLE:
        for command, expected in console_steps(block.text):
            code, out = run_shell(command, work, env, timeout)
            if code != expect_exit:
                pytest.fail(f"{block.where()}: `{command}` exited {code}, expected {expect_exit}\n"
                            f"{_show(out)}", pytrace=False)
            check_output(block, command, expected, out)
            for text in block.directives.get("expect", []):
                assert text in out, f"{block.where()}: {text!r} not in the output of `{command}`:\n{_show(out)}"
        return
    if block.lang in SHELL:
        script = block.get("run") or block.text
        code, out = run_shell(script, work, env, timeout)
    elif block.lang in PYTHON:
        proc = subprocess.run([sys.executable, "-c", block.text], cwd=work, env=env, text=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
        code, out = proc.returncode, proc.stdout
    else:
        pytest.fail(f"{block.where()}: unknown block language {block.lang!r}", pytrace=False)
    if code != expect_exit:
        pytest.fail(f"{block.where()}: exited {code}, expected {expect_exit}\n{_show(out)}", pytrace=False)
    for text in block.directives.get("expect", []):
        assert text in out, f"{block.where()}: {text!r} not in the output:\n{_show(out)}"


def blocks_of(path: Path) -> list[Block]:
    return readme_blocks() if path == README else parse_blocks(path)


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOC_FILES, ids=[p.name for p in DOC_FILES])
def test_samples_run(doc: Path, tmp_path: Path) -> None:
    """Every block of one document, in order, in one working directory."""
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    make_shims(bin_dir)
    env = make_env(bin_dir, tmp_path / "tmp")
    for block in blocks_of(doc):
        run_block(block, work, bin_dir, env)


# -- the options page lists every option ------------------------------------------------


def documented(name: str, page: str) -> bool:
    """``name`` appears as inline code: alone, or followed by its argument or ``=value``."""
    return re.search("`" + re.escape(name) + r"(?=[`\s=])", page) is not None


def _help(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_pytest_option_and_ini_key_is_on_the_options_page(tmp_path: Path) -> None:
    out = _help("-m", "pytest", "--help", "-p", "no:hypothesispytest", cwd=tmp_path)
    flags = set(re.findall(r"(?<![\w-])(--loop(?:-[a-z]+)*)\b", out))
    keys = set(re.findall(r"^\s+(loop_[a-z_]+) \(", out, re.M))
    assert "--loop-max-iter" in flags and "loop_max_iter" in keys  # the help was read
    page = (DOCS / "options.md").read_text(encoding="utf-8")
    missing = sorted(n for n in flags | keys if not documented(n, page))
    assert not missing, f"docs/options.md does not list: {missing}"


def test_every_runner_flag_is_on_the_options_page(tmp_path: Path) -> None:
    out = _help("-m", "pytest_loops", "run", "--help", cwd=tmp_path)
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", out)) - {"-h", "--help"}
    assert "--max-iter" in flags and "--resume" in flags  # the help was read
    page = (DOCS / "options.md").read_text(encoding="utf-8")
    missing = sorted(f for f in flags if not documented(f, page))
    assert not missing, f"docs/options.md does not list: {missing}"


def test_every_environment_variable_is_on_the_options_page() -> None:
    from pytest_loops.sources.config import ENV_NAMES

    page = (DOCS / "options.md").read_text(encoding="utf-8")
    missing = sorted(v for v in [*ENV_NAMES.values(), "PYTEST_LOOPS_DEBUG"] if not documented(v, page))
    assert not missing, f"docs/options.md does not list: {missing}"


def test_every_config_file_key_is_on_the_options_page() -> None:
    from pytest_loops.sources.config import _RUNNER_KEYS

    page = (DOCS / "options.md").read_text(encoding="utf-8")
    keys = [f"{section}.{key}" for section, names in _RUNNER_KEYS.items() for key in names]
    missing = sorted(k for k in keys if not documented(k, page))
    assert not missing, f"docs/options.md does not list: {missing}"


# -- links between the pages --------------------------------------------------------

_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]+))?\)")


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a markdown text (outside code blocks)."""
    anchors, fenced = set(), False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_link_between_the_pages_resolves() -> None:
    broken = []
    for doc in DOC_FILES:
        for target, anchor in _LINK.findall(doc.read_text(encoding="utf-8")):
            path = (doc.parent / target).resolve() if target else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path.read_text(encoding="utf-8")):
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


# -- the harness itself ---------------------------------------------------------------


def test_the_parser_reads_blocks_directives_and_console_steps(tmp_path: Path) -> None:
    text = textwrap.dedent("""\
        Intro.

        <!-- doc-test: setup=buggy-project expect-exit=2 expect="two words" -->

        ```sh
        echo hi
        ```

        - a list item:

          ```console
          $ echo one \\
              two
          one two
          ```
        """)
    blocks = parse_blocks(tmp_path / "x.md", text)
    assert [(b.lang, b.line) for b in blocks] == [("sh", 5), ("console", 11)]
    assert blocks[0].directives == {"setup": ["buggy-project"], "expect-exit": ["2"], "expect": ["two words"]}
    assert blocks[1].directives == {}
    assert console_steps(blocks[1].text) == [("echo one \\\n    two", ["one two"])]
    assert line_pattern("SUCCESS (exit 0) after ... iteration(s)").fullmatch("SUCCESS (exit 0) after 2 iteration(s)")
    assert not line_pattern("exit 0").fullmatch("exit 2")


def test_documented_json_keys_are_compared_with_the_real_file() -> None:
    doc = {"a": 1, "b": {"c": 1}, "items": [{"x": 1}], "gone": 0}
    real = {"a": 2, "b": {"c": 2, "d": 3}, "items": [{"x": 2, "y": 3}, {}], "new": 1}
    assert sorted(shape_differences(key_shape(doc), key_shape(real))) == [
        "b.d: in the real file, not documented",
        "gone: documented, not in the real file",
        "items.[0].y: in the real file, not documented",
        "new: in the real file, not documented",
    ]
    assert shape_differences(key_shape(real), key_shape(real)) == []


def test_an_option_counts_as_documented_only_as_inline_code() -> None:
    page = "Use `--loop`, `--loop-max-iter N`, `PYTEST_LOOPS_DEBUG=1`; not --loop-state."
    assert documented("--loop", page) and documented("--loop-max-iter", page)
    assert documented("PYTEST_LOOPS_DEBUG", page)
    assert not documented("--loop-state", page) and not documented("--loop-max", page)


@pytest.mark.parametrize("text, message", [
    ("<!-- doc-test: file=a.ini -->\nprose\n```ini\n```\n", "right above"),
    ("<!-- doc-test: bogus=1 -->\n```sh\n```\n", "unknown doc-test directive"),
    ("```sh\necho\n", "never closed"),
    ("text\n<!-- doc-test: skip -->\n", "no code block after it"),
])
def test_the_parser_rejects_misplaced_or_unknown_directives(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_blocks(tmp_path / "x.md", text)


def test_every_document_parses_and_has_a_known_language_per_block() -> None:
    known = SHELL | CONSOLE | PYTHON | FILE_LANGS | NOT_RUN
    for doc in DOC_FILES:
        for block in blocks_of(doc):
            assert block.lang in known, f"{block.where()}: unknown block language {block.lang!r}"
    assert len(DOC_FILES) > 1, "docs/ holds no markdown"
