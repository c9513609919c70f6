"""The command line's shape: the ``pytest-loops`` argument parser, its subcommands and
their flags (``run``'s settings flags come from :data:`pytest_loops.settings.SETTINGS`).
What each command does is :mod:`pytest_loops.cli.main`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from pytest_loops.cli.watching import add_watch_parser
from pytest_loops.errors import LoopUsageError
from pytest_loops.settings import ON_OFF, TAKES_VALUE, Setting, run_rows

PROG = "pytest-loops"
DEFAULT_CONFIG = Path("harness") / "loop-runner.config.yaml"


class _Spelled(argparse.Action):
    """Store a setting's value and the flag it was given under (``args.spelled``), so a
    later error names the spelling written (``--episodic``, not ``--lessons-page``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        spelled = getattr(namespace, "spelled", None) or {}
        spelled[self.dest] = option_string
        namespace.spelled = spelled


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a bad flag; 2 is MAX_ITER here, so raise instead."""

    def error(self, message: str) -> NoReturn:
        # main() prints "pytest-loops: error: ": name only a subcommand here, never the program twice
        where = self.prog.removeprefix(PROG).strip() or None
        raise LoopUsageError(message, location=where, fix=f"see `{self.prog} --help`")


def _flag_type(row: Setting, flag: str):
    def parse(text: str) -> Any:
        if row.run_accepts_path and text.strip().lower() not in ON_OFF:
            if not text.strip():
                raise LoopUsageError("an empty path", location=flag, fix="give on, off or a file path")
            return text  # a path; `--tine off` is off, never a file named off
        value = row.parse(text, flag)
        return value[0] if row.repeatable else value  # argparse appends each item
    parse.__name__ = row.name  # argparse names the type in its own messages
    return parse


def add_setting_flags(run: argparse.ArgumentParser) -> None:
    """The ``pytest-loops run`` flags of :data:`pytest_loops.settings.SETTINGS`, with their aliases."""
    for row in run_rows():
        flag = row.run_flag
        assert flag is not None
        metavar = row.shown_metavar + ("|PATH" if row.run_accepts_path else "")
        help_text = row.help + (" (repeatable)" if row.repeatable else "") + (
            "; a PATH: write it there" if row.run_accepts_path else "")
        action = "append" if row.repeatable else _Spelled
        run.add_argument(flag, dest=row.name, type=_flag_type(row, flag), metavar=metavar,
                         action=action, default=None, help=help_text)
        for alias, const in row.run_aliases:  # one dest: the last flag given wins
            if const is TAKES_VALUE:  # its own type, so a bad value names the spelling written
                run.add_argument(alias, dest=row.name, type=_flag_type(row, alias), metavar=metavar,
                                 action=action, default=None, help=f"the same as {flag}")
            else:
                run.add_argument(alias, dest=row.name, action="store_const", const=const,
                                 help=f"the same as {flag} {row.text(const)[0]}")


def build_parser() -> argparse.ArgumentParser:
    from pytest_loops import __version__

    parser = _Parser(prog=PROG, description="Bounded, recorded, test-driven fix loops.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run a loop: verify, guards, reflect, revise until a verdict",
                         description="Run a loop until every --verify check passes or a guard stops it. "
                                     "Exit codes: 0 SUCCESS, 2 MAX_ITER, 3 TIMEOUT, 4 NO_PROGRESS, "
                                     "5 ESCALATE, 64 bad input.")
    run.add_argument("loop", nargs="?", metavar="NAME", default=None,
                     help="run the loop of this name that `pytest-loops list` shows (instead of --verify)")
    run.add_argument("--verify", action="append", metavar="CMD", default=None,
                     help="a check: this shell command must exit 0 (repeatable; all must pass)")
    run.add_argument("--hidden-verify", action="append", metavar="CMD", default=None,
                     help="a hidden check: never run in the working tree nor shown to the revise step "
                          "(prompt, failure file, run log); it must pass in the clean room before "
                          "SUCCESS (repeatable)")
    run.add_argument("--cwd", metavar="DIR", help="the loop's working directory (default: .)")
    run.add_argument("--name", default=None, help="the loop's name (default: the config file's stem or 'loop')")
    run.add_argument("--goal", default="", help="the loop's goal, shown to the revise step")
    run.add_argument("-p", dest="plugins", action="append", default=[], metavar="MODULE",
                     help="load a plugin module implementing pytest_loop_* hooks (repeatable)")
    run.add_argument("--resume", metavar="RUNLOG",
                     help="continue a killed or stopped loop from its run log: its spec, iterations, "
                          "streak and spent budget carry over (guard flags may raise the limits)")
    run.add_argument("--protect", action="append", metavar="GLOB", default=None,
                     help="more paths the revise step must not change (besides tests, test directories, "
                          "conftest.py, pytest's config files, links and executables); a change is "
                          "undone and ends ESCALATE")
    run.add_argument("--scope", action="append", metavar="GLOB", default=None,
                     help="the only paths the revise step may change (default: every non-test source "
                          "file); a change elsewhere is undone and ends ESCALATE")
    add_setting_flags(run)
    run.add_argument("--quiet", "-q", action="store_true", help="print only the verdict line")

    show = sub.add_parser("show", help="show a loop file's parsed shape, or a run's iteration table",
                          description="FILE is a .loop / *.loop.yaml file (its loops, checks, guards and "
                                      "where each value came from) or a run log / .tine (its iterations).")
    show.add_argument("file", metavar="FILE")
    show.add_argument("-v", "--verbose", action="store_true", help="also list the lines not acted on")

    diff = sub.add_parser("diff", help="compare two runs loop by loop")
    diff.add_argument("a", metavar="RUN_A")
    diff.add_argument("b", metavar="RUN_B")

    compare = sub.add_parser("compare", help="two runs side by side, iteration by iteration",
                             description="A and B are run logs or .tine files. Prints each iteration's check "
                                         "results on both sides, the first iteration where they diverge, where "
                                         "each first reached its best and how each ended.")
    compare.add_argument("a", metavar="RUN_A")
    compare.add_argument("b", metavar="RUN_B")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")

    mcp = sub.add_parser("mcp", help="serve the runs in DIR to MCP clients over stdio (read-only)",
                         description="An MCP server over run artifacts (needs the extra: "
                                     "pip install 'pytest-loops[mcp]'). Its tools only read: list_runs, show_run, "
                                     "show_trajectory, compare_runs, verify_run, show_lessons.")
    mcp.add_argument("--runs-dir", metavar="DIR", default=".pytest-loops",
                     help="an artifacts directory (with runs/ and lessons/) or a directory of run logs "
                          "(default: .pytest-loops)")
    mcp.add_argument("--key-env", metavar="VAR", help="environment variable holding the HMAC key that "
                                                       "verify_run checks .tine signatures with")
    mcp.add_argument("--pubkey", metavar="FILE", help="Ed25519 public key file for verify_run")

    verify = sub.add_parser("verify", help="check that a .tine file is intact and authentic "
                                           "(exit 0 good, 1 tampered, mismatched or not authenticated)",
                            description="Exit 0 when the .tine is intact and authentic: signed with the key "
                                        "given (--key-env, --pubkey) or, without one, vouched by this "
                                        "machine's key (every .tine the harness writes is). Exit 1 otherwise, "
                                        "with one line saying why.")
    verify.add_argument("file", metavar="FILE.tine")
    verify.add_argument("--key-env", metavar="VAR", help="environment variable holding the HMAC key")
    verify.add_argument("--pubkey", metavar="FILE", help="Ed25519 public key file")
    verify.add_argument("--integrity-only", action="store_true",
                        help="exit 0 for an intact file that is not authenticated (a file from elsewhere); "
                             "the line still says it is not authenticated")

    report = sub.add_parser("report", help="write one self-contained HTML report of the runs in DIR")
    report.add_argument("directory", metavar="DIR", help="an artifacts directory (e.g. .pytest-loops)")
    report.add_argument("-o", "--output", metavar="FILE", default="report.html",
                        help="where to write the page (default: report.html in the current directory); its "
                             "directory must exist")

    selftest = sub.add_parser("selftest", help="check the harness's own guards (no LLM, no network)")
    selftest.add_argument("--quiet", "-q", action="store_true")

    demo = sub.add_parser("demo", help="run the bundled demo loop: a deterministic script fixes a bug")
    demo.add_argument("--dir", metavar="DIR", help="run the demo in DIR and keep it "
                                                     "(default: a temporary copy, removed at the end)")
    demo.add_argument("--config", metavar="FILE",
                      help=f"loop-runner config to use (default: {DEFAULT_CONFIG} if present, else the bundled one)")
    demo.add_argument("--init", nargs="?", const=".", metavar="DIR",
                      help="write the demo project, its config and a demo.loop into DIR (default: .) to edit")
    demo.add_argument("--quiet", "-q", action="store_true")
    from pytest_loops.cli.listing import add_list_parser

    add_list_parser(sub)
    add_watch_parser(sub)
    from pytest_loops.cli.merge import add_merge_parser

    add_merge_parser(sub)
    return parser
