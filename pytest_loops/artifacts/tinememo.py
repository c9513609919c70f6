"""opentine's save-time redaction, each distinct string scanned once, for one write.

Used by :func:`pytest_loops.artifacts.provenance.write_tine` around opentine's
save. opentine is imported inside the methods, never when this module is
imported.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

_HEX_DIGEST = re.compile(r"\A(?:sha256:)?[0-9a-f]{64}\Z")


class RedactionMemo:
    """opentine's save-time redaction, each distinct string scanned once, for one write.

    ``redact_text`` is a pure function of its string, so a dict in front of it
    changes no output. The wrappers also note whether redaction changed anything
    (a changed string, or the field walk replacing a secret-named field): when
    nothing changed, the saved steps are exactly the payloads and need no reading
    back. Should opentine's internals move, the memo steps aside and
    ``unchanged()`` answers False, so the file is read back and checked as before.
    """

    def __init__(self) -> None:
        self._cache: dict[str, str] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self._changed = False
        self._active = False

    # opentine's module functions are swapped for the write: one write at a time in
    # a process, so two loops saving at once never restore each other's wrappers
    _lock = threading.Lock()

    def __enter__(self) -> RedactionMemo:
        self._lock.acquire()
        try:
            return self._install()
        except BaseException:
            self.__exit__()
            raise

    def _install(self) -> RedactionMemo:
        try:
            from opentine import _graph_serde, redaction
        except ImportError:  # pragma: no cover - another opentine layout
            return self
        text_fn = getattr(redaction, "redact_text", None)
        walk_fn = getattr(_graph_serde, "_redact", None)
        if not callable(text_fn) or not callable(walk_fn) or not callable(
                getattr(_graph_serde, "redact_value", None)):
            return self  # pragma: no cover - another opentine layout
        cache = self._cache

        def redact_text(value: str) -> str:
            try:
                return cache[value]
            except KeyError:
                pass
            clean = text_fn(value)
            if clean != value:
                self._changed = True
            else:
                clean = value  # the same object: the redacted copy shares it
            cache[value] = clean
            return clean

        def walk(value: Any, *args: Any, **kwargs: Any) -> Any:
            out = walk_fn(value, *args, **kwargs)
            if out != value:
                self._changed = True
                return out
            return value  # equal: the copy is dropped at once (a save's peak memory)

        def scrub_value(value: Any, *args: Any, **kwargs: Any) -> Any:
            out = value_fn(value, *args, **kwargs)
            return out if out != value else value

        value_fn = _graph_serde.redact_value
        self._patched = [(redaction, "redact_text", text_fn), (_graph_serde, "_redact", walk_fn),
                         (_graph_serde, "redact_value", value_fn)]
        redaction.redact_text = redact_text
        _graph_serde._redact = walk
        _graph_serde.redact_value = scrub_value
        self._memo_field_names()
        self._active = True
        return self

    def _memo_field_names(self) -> None:
        """The field walk's name tests, once per distinct name (both pure)."""
        try:
            from opentine import _canon_redact as canon
        except ImportError:  # pragma: no cover - another opentine layout
            return
        name_fn = getattr(canon, "_field_name", None)
        secret_fn = getattr(canon, "_secret_field", None)
        if not callable(name_fn) or not callable(secret_fn):
            return  # pragma: no cover - another opentine layout
        names: dict[str, str] = {}
        secrets: dict[tuple[str, tuple[str, ...]], bool] = {}
        seen: list[Any] = []  # the credential names the memo answers for

        def field_name(value: Any) -> str:
            if type(value) is not str:
                return name_fn(value)
            try:
                return names[value]
            except KeyError:
                name = names[value] = name_fn(value)
                return name

        def secret_field(name: str, credential_names: Any, suffixes: tuple[str, ...]) -> bool:
            if not seen:
                seen.append(frozenset(credential_names))
            elif credential_names != seen[0]:
                return secret_fn(name, credential_names, suffixes)
            key = (name, suffixes)
            try:
                return secrets[key]
            except KeyError:
                found = secrets[key] = secret_fn(name, credential_names, suffixes)
                return found

        self._patched += [(canon, "_field_name", name_fn), (canon, "_secret_field", secret_fn)]
        canon._field_name = field_name
        canon._secret_field = secret_field

    def __exit__(self, *exc: Any) -> None:
        try:
            for module, name, original in reversed(self._patched):
                setattr(module, name, original)
        finally:
            self._patched = []
            self._active = False
            self._lock.release()

    def known_clean(self, values: Iterable[Any]) -> None:
        """Strings that are sha256 digests in lowercase hex (opentine's step ids, the
        outputs' digests and state hashes of this write) are not scanned: a digest
        holds no secret, opentine's redaction leaves them as they are
        (tests/test_cost_tine.py pins it), and each costs it about 0.1 ms."""
        cache = self._cache
        for value in values:
            if isinstance(value, str) and _HEX_DIGEST.match(value):
                cache.setdefault(value, value)

    def unchanged(self) -> bool:
        return self._active and not self._changed

    def reset_changes(self) -> None:
        self._changed = False
