"""The local vouch of a `.tine` file: proof that this machine's harness wrote it.

opentine's integrity digest is a checksum, not a proof: it is unkeyed, so anyone
who edits a step can recompute it, and it does not cover the run's metadata at
all. A `.tine` rewritten to say SUCCESS, digest recomputed, is "intact".

So every `.tine` the harness writes carries a vouch in its metadata
(``pytest_loops_vouch``): an HMAC-SHA256 under the per-user key that also
authenticates run logs (:func:`pytest_loops.runtime.trust.runlog_key`), over the
file's whole content as opentine reads it back (every step, the refs, the status
and every metadata key but opentine's ``integrity`` block and the vouch itself).
Editing anything, the verdict in a step or in the metadata, breaks it; a file
from another machine (another key) does not carry this machine's vouch.

The vouch is the MAC over ``Run.load(path).to_dict()``: what every reader of the
file sees. opentine round-trips unknown metadata keys and its ``tine-sig/2``
signature covers them, so a file that is also signed is signed over its vouch.
opentine is never imported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_loops.runtime.trust import KeyFileError, json_mac, mac, mac_matches, runlog_key, runlog_key_path

VOUCH_FIELD = "pytest_loops_vouch"
"""The metadata key holding the vouch."""
SCHEME = "pytest-loops.tine-vouch/1"
_KEY_ID_DOMAIN = SCHEME + " key id"
VOUCHED = "vouched by this machine's key"


def key_id(key: bytes) -> str:
    """A short name of a key that says nothing about it: tells "another machine's
    key" from "edited" in a reader's message (a hint only; the MAC decides)."""
    return mac(key, _KEY_ID_DOMAIN)[:16]


def vouched_content(data: Mapping[str, Any]) -> dict[str, Any]:
    """What a vouch covers: ``data`` (a run's ``to_dict()``) without opentine's
    ``integrity`` block (its digest and signature, computed after the vouch) and
    without the vouch itself."""
    content = dict(data)
    metadata = content.get("metadata")
    if isinstance(metadata, Mapping):
        content["metadata"] = {k: v for k, v in metadata.items() if k not in ("integrity", VOUCH_FIELD)}
    return content


def make_vouch(key: bytes, data: Mapping[str, Any]) -> dict[str, str] | None:
    """The vouch of ``data`` under ``key``; None when it has no canonical JSON form."""
    value = json_mac(key, SCHEME, vouched_content(data))
    if value is None:
        return None
    return {"scheme": SCHEME, "key_id": key_id(key), "mac": value}


def writer_key() -> tuple[bytes | None, str | None]:
    """The local key to vouch with (made on first use), or None and why not."""
    try:
        return runlog_key(create=True), None
    except KeyFileError as exc:
        return None, str(exc)


def reader_key() -> tuple[bytes | None, str | None]:
    """The local key to check a vouch with (never made here), or None and why not."""
    try:
        key = runlog_key(create=False)
    except KeyFileError as exc:
        return None, str(exc)
    if key is None:
        return None, f"this machine has no local key ({runlog_key_path()} is missing)"
    return key, None


def check_vouch(data: Mapping[str, Any], key: bytes | None, key_error: str | None = None) -> tuple[bool, str]:
    """Whether ``data`` (a loaded run's ``to_dict()``) carries a vouch that holds
    under ``key``; ``(True, VOUCHED)`` or ``(False, why)`` in a few words."""
    metadata = data.get("metadata")
    given = metadata.get(VOUCH_FIELD) if isinstance(metadata, Mapping) else None
    if given is None:
        return False, "not vouched by this machine's key"
    if not isinstance(given, Mapping) or given.get("scheme") != SCHEME:
        return False, "its vouch is malformed or of an unknown scheme"
    if key is None:
        return False, f"vouched, but not by a key this machine has ({key_error or 'no local key'})"
    expected = json_mac(key, SCHEME, vouched_content(data))
    if expected is not None and mac_matches(expected, given.get("mac")):
        return True, VOUCHED
    if given.get("key_id") != key_id(key):
        return False, "vouched by another machine's key (or by this machine's key before it was replaced)"
    return False, "its vouch does not match: the file was changed after it was written"
