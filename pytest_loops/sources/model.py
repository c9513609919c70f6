"""What reading a loop file gives: its loops, pipelines, flows and the lines kept as written."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_loops.spec import IgnoredLine, LoopSpec, Pipeline


@dataclass(frozen=True)
class Flow:
    """A LoopFlow ``flow``: a chain of ``.loop`` files, each step running a whole file.

    pytest-loops keeps flows for ``show`` but does not run them as a unit: each
    referenced file is an ordinary loop file, collected and run on its own.
    ``steps`` are the referenced files as written (relative to the flow's file);
    for a ``for each`` step it is the template file. Gates, ``with the result of``
    and ``for each`` sources are kept in ``notes``.
    """

    name: str
    steps: tuple[str, ...]
    source: str | None = None
    notes: tuple[IgnoredLine, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "notes", tuple(self.notes))


@dataclass(frozen=True)
class LoopFile:
    """A parsed ``.loop`` or YAML loop file.

    Stage LoopSpecs are named ``"<pipeline> / <stage>"``.
    ``config`` holds the config-tier lines as written (not acted on unless their
    ``why`` says so); ``ignored`` holds other file-level lines not acted on.
    """

    path: str
    loops: tuple[LoopSpec, ...] = ()
    pipelines: tuple[Pipeline, ...] = ()
    flows: tuple[Flow, ...] = ()
    config: tuple[IgnoredLine, ...] = ()
    ignored: tuple[IgnoredLine, ...] = field(default=())

    def __post_init__(self) -> None:
        for attr in ("loops", "pipelines", "flows", "config", "ignored"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))

    def all_loops(self) -> list[LoopSpec]:
        """Top-level loops in file order, then each pipeline's stages in order."""
        out = list(self.loops)
        for pipeline in self.pipelines:
            out.extend(pipeline.stages)
        return out
