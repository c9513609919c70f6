"""The standalone runner: ``pytest-loops run | selftest | demo`` (and more).

Exit codes: 0 SUCCESS, 2 MAX_ITER, 3 TIMEOUT, 4 NO_PROGRESS, 5 ESCALATE,
64 bad input (one line, never a traceback), 70 internal error. The commands and
their flags are :mod:`pytest_loops.cli.arguments`; here, what each command does.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pluggy

from pytest_loops.cli.arguments import DEFAULT_CONFIG, PROG, build_parser
from pytest_loops.cli.watching import cmd_watch
from pytest_loops.errors import LoopUsageError
from pytest_loops.pytest_plugin.terminal import ReviseView, adapter_lines, iteration_line, verify_line
from pytest_loops.runtime.outpaths import REPORT, TINE, check_artifact_paths, check_output_path
from pytest_loops.settings import (
    BY_NAME,
    DEFAULTS,
    ENV_NAMES,
    GUARD_KEYS,
    env_layer,
    record_origin,
    resolve,
    run_rows,
)
from pytest_loops.sources.config import read_runner_config
from pytest_loops.spec import Check, Guards, LoopSpec
from pytest_loops.verdict import EXIT_INTERNAL, EXIT_USAGE

hookimpl = pluggy.HookimplMarker("pytest")
USAGE_VARIABLE = "LOOP_USAGE_FILE"


# -- live output ----------------------------------------------------------------------

class _LivePrinter:
    def __init__(self, stream, revise_output: str = "status") -> None:
        self.stream = stream
        tty = _is_tty(stream)
        self.view = ReviseView(revise_output, lambda text: _say(text, stream),
                               (lambda text: _rewrite(text, stream)) if tty else None)

    @hookimpl
    def pytest_loop_revise_started(self, spec: LoopSpec, record: Any) -> None:
        _say(verify_line(spec, record), self.stream)  # the checks' result, before the revise step runs

    @hookimpl
    def pytest_loop_revise_progress(self, spec: LoopSpec, progress: Any) -> None:
        self.view.show(spec, progress)

    @hookimpl
    def pytest_loop_iteration_finished(self, spec: LoopSpec, record: Any) -> None:
        _say(iteration_line(spec, record), self.stream)
        for line in adapter_lines(spec, record):
            _say(line, self.stream)
        if getattr(record, "usage_warning", None):
            _say(f"{PROG}: warning: {USAGE_VARIABLE} {record.usage_warning}; the figures of iteration "
                 f"{record.iter} are not counted", sys.stderr)


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, OSError, ValueError):
        return False


def _rewrite(text: str, stream) -> None:
    """The status line, rewritten in place (``""``: cleared)."""
    from pytest_loops.redact import redact, strip_control

    width = shutil.get_terminal_size((100, 20)).columns - 1
    try:
        stream.write("\r\x1b[K" + strip_control(redact(text))[:max(10, width)])
        stream.flush()
    except (OSError, ValueError):
        _to_devnull(stream)


def _say(text: str, stream) -> None:
    """Print, masked and without escape sequences, but a closed pipe
    (`pytest-loops run ... | head -1`) or a full device (`> /dev/full`) never stops a
    loop nor changes its exit code: as Python's documentation advises for SIGPIPE, the
    stream's descriptor is pointed at /dev/null and the loop carries on unheard."""
    from pytest_loops.redact import redact, strip_control

    try:
        print(strip_control(redact(text)), file=stream, flush=True)
    except (OSError, ValueError):
        _to_devnull(stream)


def _to_devnull(stream) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # closed or not a real file: nothing is flushed to it at exit


def verdict_lines(result: Any) -> list[str]:
    lines = [f"{result.verdict.value} (exit {result.exit_code}) after {result.iterations_run} "
             f"iteration(s) in {result.elapsed_s:.1f}s: {result.reason}"]
    for key, path in result.artifacts.items():
        if key != "run_dir":  # the run log's key "memory" is the lessons page
            lines.append(f"  {'lessons' if key == 'memory' else key}: {path}")
    return lines


# -- run ----------------------------------------------------------------------------

SANDBOX_KEYS = ("sandbox", "sandbox_writable", "sandbox_network")


def revise_output(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str:
    """What the terminal shows while a revise step runs: defaults < environment < flag."""
    chosen = resolve([("environment", {k: v for k, v in env_layer(environ).items() if k == "revise_output"}),
                      ("command line", {"revise_output": getattr(args, "revise_output", None)})],
                     defaults={"revise_output": BY_NAME["revise_output"].default})
    return str(chosen["revise_output"])


def sandbox_settings(args: argparse.Namespace, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The engine's isolation settings: defaults < environment < flags."""
    flags = {key: getattr(args, key, None) for key in SANDBOX_KEYS}
    settings = resolve([("environment", env_layer(environ)), ("command line", flags)],
                       defaults={key: BY_NAME[key].default for key in SANDBOX_KEYS})
    return {"sandbox": settings["sandbox"], "sandbox_writable": tuple(settings["sandbox_writable"] or ()),
            "sandbox_network": bool(settings["sandbox_network"])}


def spec_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> tuple[LoopSpec, dict[str, Any]]:
    """Build the LoopSpec: defaults < config file < environment < flags."""
    cwd = Path(args.cwd or ".")
    if not cwd.is_dir():
        what = "does not exist" if not cwd.exists() else "is not a directory"
        raise LoopUsageError(f"{str(cwd)!r} {what}", location="--cwd", fix="give an existing directory")
    config_path = Path(args.config) if args.config else None
    if config_path is None and (cwd / DEFAULT_CONFIG).is_file():
        config_path = cwd / DEFAULT_CONFIG
    layers: list[tuple[str, dict[str, Any]]] = []
    unknown: list[str] = []
    if config_path is not None:
        layer = read_runner_config(config_path)
        unknown = layer.pop("unknown_keys", [])
        layer.pop("verified", None)  # the skill's "not yet proven" mark: nothing to act on
        layers.append((str(config_path), layer))
    layers.append(("environment", env_layer(environ)))
    flags = {row.name: getattr(args, row.name) for row in run_rows() if row.name in DEFAULTS or row.name in ENV_NAMES}
    flags.update(verify=args.verify, protect=args.protect, scope=args.scope)
    layers.append(("command line", flags))
    settings = resolve(layers)
    verify = settings["verify"]
    if not verify:
        raise LoopUsageError("no check to run", location="--verify",
                             fix="give --verify CMD (repeatable) or verify.cmd in the config file")
    name = args.name or (config_path.stem.replace(".config", "") if config_path else "loop")
    guards = Guards(**{key: settings[key] for key in GUARD_KEYS})
    spec = LoopSpec(
        name=name, goal=args.goal,
        checks=(*(Check.command_passes(cmd) for cmd in verify),
                *(Check.command_passes(cmd, hidden=True) for cmd in (args.hidden_verify or ()))),
        revise=settings["revise"], guards=guards, state_paths=tuple(settings["state_paths"]),
        memory_page=settings["lessons_page"], reflexion=bool(settings["lessons"]),
        no_progress_signal=settings["no_progress_signal"],
        protect=tuple(settings["protect"]), scope=tuple(settings["scope"]),
        branches=settings["branches"], max_parallel=settings["max_parallel"],
        cwd=str(cwd.resolve()), origin=record_origin(settings.origin),
        source=str(config_path) if config_path else "command line",
        anonymous=not args.name and config_path is None,
        context_adapter=settings.values.get("context_adapter"),
    )
    for key in _OUTPUT_PATHS:
        _check_output_path(settings.values.get(key), key, settings.origin.get(key, ""), cwd,
                           flag=(getattr(args, "spelled", None) or {}).get(key), environ=environ)
    if settings.values.get("artifacts") is None:  # the default: where the run log and lessons go
        check_output_path(".pytest-loops", "--artifacts (default .pytest-loops under --cwd)", base=cwd,
                          directory=True)
    return spec, {"log_path": settings["log_path"], "unknown_keys": unknown, "config": config_path,
                  "artifacts": settings.values.get("artifacts"), "output_cap": settings["output_cap"]}


# setting -> (flag, config file key, environment variables) that may have set it
_OUTPUT_PATHS = {key: (BY_NAME[key].run_flag, BY_NAME[key].config_key, BY_NAME[key].envs)
                 for key in ("log_path", "lessons_page", "artifacts")}


def _check_output_path(value: str | None, key: str, origin: str, cwd: Path, where: str | None = None,
                       flag: str | None = None, environ: Mapping[str, str] | None = None) -> None:
    """A path the run will write to is bad input (64) up front, not an OSError (70) mid-run.
    The error names the spelling given (``flag``; the variable that is set)."""
    if not value:
        return
    main_flag, file_key, variables = _OUTPUT_PATHS[key]
    flag = flag or main_flag
    environ = os.environ if environ is None else environ
    variable = next((v for v in variables if environ.get(v)), variables[0] if variables else None)
    where = where or {"command line": str(flag), "environment": f"environment variable {variable}"}.get(
        origin, f"{origin}: {file_key}")
    if key == "log_path":  # a run log (and the .tine and hand-off beside it) writes over no other file
        check_artifact_paths(value, where, base=cwd)
        return
    check_output_path(value, where, base=cwd, directory=key == "artifacts")


def resume_spec(args: argparse.Namespace) -> tuple[LoopSpec, dict[str, Any], dict[str, Any]]:
    """The spec of the run log given to --resume, with guard and revise flags on top.

    The log must be trusted first (``check_trusted``): its MACs hold, its
    spec_digest is its spec's, its loop file is unchanged and, when the command
    line names a loop too (--verify, --config), that loop is the log's.
    """
    from pytest_loops.artifacts.runlog import check_resumable, check_trusted, load_runlog
    from pytest_loops.results import IterationRecord

    data = load_runlog(args.resume)
    data["log_path"] = str(Path(args.resume).resolve())  # the new log's resumed_from: unambiguous from anywhere
    where = f"--resume {args.resume}"
    given, fields = _command_line_loop(args)
    check_trusted(data, where, spec=given, what="the loop on the command line", fields=fields)
    if data.get("verdict") == "SUCCESS":
        raise LoopUsageError("that loop already ended SUCCESS; nothing to resume", location=where)
    spec = LoopSpec.from_dict(data.get("spec") or {})
    check_resumable(data, where)
    try:
        [IterationRecord.from_dict(r) for r in data["iterations"]]
    except (TypeError, ValueError, AttributeError) as exc:
        raise LoopUsageError(f"an iteration record is not valid: {exc}", location=where) from None
    guards = spec.guards.to_dict()
    guards.update({k: getattr(args, k) for k in GUARD_KEYS if getattr(args, k) is not None})
    changes: dict[str, Any] = {"guards": Guards(**guards)}
    if args.revise:
        changes["revise"] = args.revise
    if args.no_progress_signal:
        changes["no_progress_signal"] = args.no_progress_signal
    if args.cwd:
        changes["cwd"] = str(Path(args.cwd).resolve())
    cwd = Path(changes.get("cwd", spec.cwd))
    if not cwd.is_dir():
        raise LoopUsageError(f"the loop's working directory {spec.cwd!r} does not exist", location=where,
                             fix="give --cwd DIR")
    _check_output_path(args.log_path, "log_path", "command line", cwd)
    _check_output_path(args.artifacts, "artifacts", "command line", cwd)
    if spec.reflexion:
        _check_output_path(spec.memory_page, "lessons_page", "", cwd, where=f"{where}: memory_page")
    if not args.artifacts:
        check_output_path(".pytest-loops", "--artifacts (default .pytest-loops under --cwd)", base=cwd,
                          directory=True)
    cap = resolve([("environment", env_layer()), ("command line", {"output_cap": args.output_cap})])["output_cap"]
    return spec.replace(**changes), {"log_path": args.log_path, "unknown_keys": [], "config": None,
                                     "output_cap": cap}, data


def _command_line_loop(args: argparse.Namespace) -> tuple[LoopSpec | None, list[str] | None]:
    """With --resume: the loop the command line names besides the log (--verify,
    --config), and the spec fields it sets, to compare with the log's; (None, None)
    when it names none."""
    if not args.verify and not args.config:
        return None, None
    fields = ["checks"]
    for flag, field in (("name", "name"), ("goal", "goal"), ("state_paths", "state_paths"),
                        ("protect", "protect"), ("scope", "scope")):
        if getattr(args, flag, None):
            fields.append(field)
    if args.config:
        fields += [f for f in ("state_paths", "protect", "scope") if f not in fields]
    spec, _ = spec_from_args(argparse.Namespace(**{**vars(args), "log_path": None}))
    return spec, fields


def _tine_path(args: argparse.Namespace) -> str | None:
    """``--tine PATH``: where the .tine goes (``--tine on`` or none: beside the run log)."""
    return args.tine if isinstance(args.tine, str) else None


def artifact_options(args: argparse.Namespace, resume_base: list[str]):
    from pytest_loops.artifacts.finishers import ArtifactOptions

    def resume_command(result) -> str:
        raise_limit: list[str] = []
        g = result.spec.guards
        if result.verdict.value == "MAX_ITER":
            raise_limit = ["--max-iter", str(g.max_iter * 2)]
        elif result.verdict.value == "TIMEOUT" and g.budget_seconds > 0:
            raise_limit = ["--budget-seconds", f"{g.budget_seconds * 2:g}"]
        return " ".join(shlex.quote(a) for a in [PROG, "run", "--resume", str(result.log_path),
                                                   *raise_limit, *resume_base])

    private = resolve([("environment", env_layer()),
                       ("command line", {"private_artifacts": getattr(args, "private_artifacts", None)})],
                      defaults={"private_artifacts": BY_NAME["private_artifacts"].default})["private_artifacts"]
    return ArtifactOptions(tine=args.tine is not False, tine_path=_tine_path(args), hmac_key_env=args.sign_key_env,
                           ed25519_key=args.sign_key_file, resume_command=resume_command,
                           private_artifacts=bool(private))


_SESSION_KEYS = ("state_unmatched", "context_adapter", "context_adapter_failure", "context_adapter_timeout",
                 "grants", "own_model", "context_mcp")


def _with_session_ctx(spec: LoopSpec, session: Any) -> LoopSpec:
    """Grants given to the runner replace the loop's line; its context adapter fills the
    loop's when the loop (a discovered loop file, a resumed run) has none."""
    from pytest_loops.settings import given_grants

    changes: dict[str, Any] = {}
    grants = given_grants(session)
    if grants is not None:
        changes["grants"] = grants
    if not spec.context_adapter and session.values.get("context_adapter"):
        changes["context_adapter"] = session.values["context_adapter"]
    if not changes:
        return spec
    origin = {**spec.origin, **{key: session.origin.get(key, "command line") for key in changes}}
    return spec.replace(origin=origin, **changes)


def _state_origin(origin: str) -> str:
    """The flag, variable or config key the state paths were given under."""
    return {"command line": "--state", "environment": "PYTEST_LOOPS_STATE", "": "--state"}.get(
        origin, f"{origin}: progress.state_paths")


def cmd_run(args: argparse.Namespace) -> int:
    from pytest_loops.artifacts.finishers import make_engine, writers
    from pytest_loops.core.pluginmanager import make_plugin_manager
    from pytest_loops.redact import export_masks
    from pytest_loops.runtime.process import ProcessRunner, TerminationGuard

    export_masks(args.mask or ())  # before anything is written or printed
    resume_from = None
    if args.loop is not None:  # a discovered loop by name
        from pytest_loops.cli.listing import named_spec

        spec, extra = named_spec(args)
    elif args.resume:
        spec, extra, resume_from = resume_spec(args)
    else:
        spec, extra = spec_from_args(args)
    if args.tine is not False:
        check_output_path(_tine_path(args), "--tine", kind=TINE)
    if not args.plugins:  # a plugin's pytest_loop_revise may stand in for the command
        from pytest_loops.agents import program_to_check
        from pytest_loops.runtime.preflight import check_revise

        origin = spec.origin.get("revise", "")
        where = {"command line": "--revise", "environment": "PYTEST_LOOPS_REVISE"}.get(origin, f"{origin}: revise.cmd")
        check_revise(program_to_check(spec.revise), spec.cwd, where)
    from pytest_loops.runtime.preflight import check_state_paths

    session = resolve([("environment", env_layer()),
                       ("command line", {key: getattr(args, key, None) for key in _SESSION_KEYS})], defaults={})
    unmatched = session.values.get("state_unmatched")
    spec = _with_session_ctx(spec, session)
    state_warning = check_state_paths(spec.state_paths, spec.cwd, unmatched or "warn",
                                      _state_origin(spec.origin.get("state_paths", "")))
    options = artifact_options(args, ["--cwd", spec.cwd])
    writers(options)  # a bad signing key is bad input before anything runs
    out = sys.stdout
    for key in extra["unknown_keys"]:
        print(f"{PROG}: warning: {extra['config']}: unknown key {key!r} ignored", file=sys.stderr)
    if state_warning:
        print(f"{PROG}: warning: {state_warning}", file=sys.stderr)
    pm = make_plugin_manager(args.plugins)
    if not args.quiet:
        pm.register(_LivePrinter(out, revise_output(args)))
        g = spec.guards
        _say(f"[{spec.name}] {len(spec.checks)} check(s); max_iter={g.max_iter} "
             f"budget={g.budget_seconds:g}s no_progress_k={g.no_progress_k} "
             f"escalate_after={g.escalate_after}; state: {', '.join(spec.state_paths) or '(none: no-progress off)'}",
             out)
    runner = ProcessRunner(output_cap=extra["output_cap"])
    from pytest_loops.core.ctxadapter import adapter_options

    artifacts_dir = extra.get("artifacts", args.artifacts)
    adapter = adapter_options(session.values, artifacts_dir or str(Path(spec.cwd) / ".pytest-loops"))
    engine = make_engine(runner=runner, plugin_manager=pm, artifacts=options, adapter=adapter,
                         artifacts_dir=extra.get("artifacts", args.artifacts), localize=args.suspects is not False,
                         audit=args.audit or "error", audit_allow=tuple(args.audit_allow or ()),
                         hide_env=[args.sign_key_env or ""], **sandbox_settings(args))
    if not args.quiet and engine.sandbox is not None:
        _say(f"[{spec.name}] sandbox: {engine.sandbox.describe()}", out)
    with TerminationGuard(runner):
        result = engine.run(spec, log_path=extra["log_path"], resume_from=resume_from)
    lines = verdict_lines(result)
    _say("\n".join(lines[:1] if args.quiet else lines), out)
    from pytest_loops.artifacts.finishers import artifact_errors_line

    problem = artifact_errors_line(engine.artifact_errors)
    if problem:
        _say(problem, sys.stderr)
    return result.exit_code


# -- selftest and demo ----------------------------------------------------------------

def cmd_selftest(args: argparse.Namespace) -> int:
    from pytest_loops.cli.selftest import run_selftest

    return run_selftest(quiet=args.quiet)


def cmd_demo(args: argparse.Namespace) -> int:
    from pytest_loops.cli.demo import demo_command

    return demo_command(args, lambda argv: cmd_run(build_parser().parse_args(argv)), DEFAULT_CONFIG)


def cmd_show(args: argparse.Namespace) -> int:
    from pytest_loops.sources import format_loop_file, is_loop_file, load_any

    if is_loop_file(args.file):
        print(format_loop_file(load_any(args.file), verbose=args.verbose))
        return 0
    from pytest_loops.cli.watching import format_watch_log, is_watch_log

    if is_watch_log(args.file):
        print(format_watch_log(args.file))
        return 0
    from pytest_loops.cli.runview import format_run, load_run

    print(format_run(load_run(args.file)))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from pytest_loops.cli.runview import diff_runs, load_run

    print(diff_runs(load_run(args.a), load_run(args.b)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import json

    from pytest_loops.cli.compare import compare_runs, format_compare
    from pytest_loops.cli.runview import load_run

    data = compare_runs(load_run(args.a), load_run(args.b), labels=(args.a, args.b))
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else format_compare(data), end="\n" if args.json
          else "")
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    from pytest_loops.cli.mcpserver import serve

    return serve(args.runs_dir, key_env=args.key_env, pubkey=args.pubkey)


def cmd_verify(args: argparse.Namespace) -> int:
    from pytest_loops.cli.runview import verify_command

    code, message = verify_command(args.file, key_env=args.key_env, pubkey=args.pubkey,
                                   integrity_only=args.integrity_only)
    print(message, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_loops.artifacts.report import collect_runs, write_html_report

    directory = Path(args.directory)
    if not directory.is_dir():
        raise LoopUsageError("not a directory", location=str(directory),
                             fix="pass the artifacts directory, e.g. .pytest-loops")
    parent = Path(args.output).parent
    if not parent.is_dir():  # never made here: a typo in -o would leave a stray directory tree
        what = "is not a directory" if parent.exists() else "does not exist"
        raise LoopUsageError(f"cannot write {args.output!r}: the directory {str(parent)!r} {what}",
                             location="--output", fix="create it first, or give a path in an existing directory")
    check_output_path(args.output, "--output", kind=REPORT)
    runs = collect_runs(directory)
    path = write_html_report(runs, args.output)
    print(f"report written to {Path(path).resolve()}: {len(runs)} loop run(s)")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pytest_loops.cli.merge import cmd_merge as merge

    return merge(args)


def cmd_list(args: argparse.Namespace) -> int:
    from pytest_loops.cli.listing import cmd_list as list_loops

    return list_loops(args)


COMMANDS = {"run": cmd_run, "selftest": cmd_selftest, "demo": cmd_demo, "show": cmd_show,
            "diff": cmd_diff, "compare": cmd_compare, "mcp": cmd_mcp, "verify": cmd_verify,
            "report": cmd_report, "list": cmd_list, "watch": cmd_watch, "merge": cmd_merge}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pytest-loops`` console script."""
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            command = f"{PROG} {args.command}" if args.command else PROG
            raise LoopUsageError(f"unrecognized arguments: {' '.join(extra)}", fix=f"see `{command} --help`")
        if args.command is None:
            raise LoopUsageError("a command is required",
                                 fix=f"one of: {', '.join(COMMANDS)} (`{PROG} --help` lists them)")
        from pytest_loops.runtime.procimage import hide_secrets
        from pytest_loops.runtime.trust import signing_key_variables

        # the signing key and the hidden checks, out of what /proc shows of this process
        hide_secrets(signing_key_variables(args), getattr(args, "hidden_verify", None) or ())
        return COMMANDS[args.command](args)
    except LoopUsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pytest-loops show RUN | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit as exc:  # --help / --version, or a termination signal
        return exc.code if isinstance(exc.code, int) else 0
    except Exception as exc:  # noqa: BLE001 - the contract is one line and exit 70
        if os.environ.get("PYTEST_LOOPS_DEBUG"):
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} "
              "(set PYTEST_LOOPS_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
