"""Hooks of pytest-loops (specs only).

Implement them in a ``conftest.py`` or a plugin. The standalone runner
(``pytest-loops run``) calls the same hooks through its own plugin manager, which
loads ``-p MODULE`` plugins and the ``pytest_loops.plugins`` entry point group.
Hooks are always called with keyword arguments; an implementation may accept
fewer arguments than the spec.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec(firstresult=True)
def pytest_loop_run_check(check, context):
    """Run one check and return a :class:`pytest_loops.CheckResult`, or None to pass.

    Called for every check of every iteration. The built-in implementation
    (``trylast``) runs command, finds-nothing and pytest-node-id checks as
    subprocesses and reports human checks as needing a human. Skill and judge
    checks (``check.kind == "hook"``) reach the built-in only when no plugin
    answers; it reports that they cannot pass.

    :param check: the :class:`pytest_loops.Check`.
    :param context: the :class:`pytest_loops.core.context.LoopContext` of this iteration.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def pytest_loop_revise(spec, iteration, context):
    """Revise the code after a failed iteration, in Python instead of a shell command.

    Return an ``int`` exit code (0 = the revise step ran; non-zero is recorded and
    the loop goes on), or None to let the next implementation (in the end the
    loop's shell ``revise`` command) handle it.

    :param spec: the :class:`pytest_loops.LoopSpec`.
    :param iteration: the number of the iteration that just failed (1-based).
    :param context: the :class:`pytest_loops.core.context.LoopContext`; its
        ``prompt_file`` and ``failure_file`` are written before this is called.

    .. versionadded:: 0.1
    """


@hookspec
def pytest_loop_context(spec, context, payload):
    """Add read-only sections to the revise step's context file (``LOOP_CONTEXT_FILE``).

    Called before every revise step, after the prompt is written. Return a mapping
    of section name to JSON data, or None. A section is kept only under a name the
    loop grants (``grants: skills, agents, mcps, harnesses``); any other name, a
    core key, a name another plugin gave first, data that is not JSON or over the
    section cap is dropped, and the run log's ``context_dropped`` says which and why.
    An implementation that raises loses its sections, never the loop's verdict.

    :param spec: the :class:`pytest_loops.LoopSpec`.
    :param context: the :class:`pytest_loops.core.context.LoopContext` of this iteration.
    :param payload: a copy of the contract so far (schema ``pytest-loops.context/1``);
        changing it changes nothing.

    .. versionadded:: 0.4
    """


@hookspec
def pytest_loop_started(spec, run):
    """Called once per loop before its first iteration (a writer opens its record here).

    :param spec: the :class:`pytest_loops.LoopSpec`.
    :param run: the :class:`pytest_loops.core.context.LoopRun`: paths, the run log's
        header, the iterations of a resumed run, ``artifact_failed(path, error)``.

    .. versionadded:: 0.3
    """


@hookspec(firstresult=True)
def pytest_loop_recall(spec, run):
    """Return the lessons earlier runs left for this loop (a list of lines), or None.

    Called once per loop before ``pytest_loop_started``; the lessons go into every
    prompt and the run log's ``lessons_read``. The built-in lessons page answers
    when the loop keeps one (``remember in``, ``--lessons-page``).

    .. versionadded:: 0.3
    """


@hookspec(firstresult=True)
def pytest_loop_reflect(spec, run, record, failed, state_changed):
    """Record a lesson for a failed iteration; return its line, or None for none.

    Called after the guards of every failed iteration that a machine can still fix.

    :param record: the :class:`pytest_loops.IterationRecord` so far.
    :param failed: its failed :class:`pytest_loops.CheckResult` objects.
    :param state_changed: whether the watched state changed (None on the first
        measurement, ``"untracked"`` when nothing is watched).

    .. versionadded:: 0.3
    """


@hookspec
def pytest_loop_revise_started(spec, run, record):
    """Called just before the revise step, with the iteration so far (verify, guards).

    .. versionadded:: 0.3
    """


@hookspec
def pytest_loop_revise_progress(spec, run, record, progress):
    """Called a few times a second while the revise step runs, and once more when it ends.

    ``progress`` is a :class:`pytest_loops.core.live.ReviseProgress`: elapsed time,
    files changed so far, the output's last line and the new lines since the last
    call (masked), the loop's cost and tokens so far, ``final`` on the last call.
    Called from a thread of its own: an implementation only shows it (the terminal
    reporters: a line that updates, a heartbeat, or the stream). Without any
    implementation no thread is started.

    .. versionadded:: 0.5
    """


@hookspec(firstresult=True)
def pytest_loop_revise_line(spec, line):
    """How one line of the revise step's output is shown live: a short text, ``""`` for
    nothing, or None for the line as it is. The agent presets turn their CLI's JSON
    events into a line a human reads.

    .. versionadded:: 0.5
    """


@hookspec
def pytest_loop_revise_finished(spec, run, record, exit_code):
    """Called just after the revise step with its exit code (None: none).

    .. versionadded:: 0.3
    """


@hookspec
def pytest_loop_iteration_finished(spec, record, context, run, verdict, reason):
    """Called after every iteration with its :class:`pytest_loops.IterationRecord`.

    ``verdict`` (a :class:`pytest_loops.Verdict`) and ``reason`` are set when the
    iteration ended the loop, else None and "".

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``run``, ``verdict`` and ``reason``
    """


@hookspec
def pytest_loop_aborted(spec, run, error):
    """Called when the loop stops on an exception (``error``: one line) before a verdict.

    .. versionadded:: 0.3
    """


@hookspec
def pytest_loop_finished(spec, result, run):
    """Called once per loop with its final :class:`pytest_loops.LoopResult`.

    The built-in writers are implementations too (``tryfirst``): the ``.tine`` and
    the hand-off first, then the run log's summary, so an implementation without
    ``tryfirst`` sees every artifact in ``result.artifacts``.

    .. versionadded:: 0.1
    .. versionchanged:: 0.3 ``run``
    """


@hookspec
def pytest_loop_audit(diff, context):
    """Audit the revise step's in-scope changes for gaming; return a list of findings.

    Called after every revise step that changed in-scope files, with every
    in-scope Python file changed since the loop started. The built-in auditor
    flags literals of the failing assertions newly special-cased in the code,
    comparison methods returning a constant (or ``other == other``), pytest or
    harness variables, the wall clock, ``/proc``, environment scans, the parent
    process, replaced output streams and ``sys.path`` changes in library code, and
    exits added to library code. Any finding ends the loop ESCALATE with the lines
    quoted (``--audit warn`` records them instead).

    :param diff: a sequence of :class:`pytest_loops.runtime.audit.FileChange` (path,
        text at loop start or None, text now or None).
    :param context: the :class:`pytest_loops.core.context.LoopContext`; its
        ``audit_literals`` holds the literals of the failing assertions so far.
    :return: a list of :class:`pytest_loops.runtime.audit.Finding` (or objects with a
        ``describe()`` method), empty when nothing looks wrong.

    .. versionadded:: 0.2
    """
