"""Amending pytest's JUnit XML after the session fix-loop ran.

pytest writes the XML when the session finishes; the session loop's outcome
comes after. The tests the loop covered get its properties (verdict, reasons,
one per iteration) and, when it repaired them, lose the first run's failure.
Under ``--loop`` secret values left in it (a node id's parametrize id) are masked.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) as pytest's junitxml writes them for a node id."""
    parts = nodeid.split("::")
    path = parts[0]
    if path.endswith(".py"):
        path = path[:-3]
    names = [path.replace("/", ".").replace(os.sep, ".")] + parts[1:]
    return ".".join(names[:-1]), names[-1]


def mark_repaired(xml_path: Path, nodeids: Sequence[str], properties: Sequence[tuple[str, str]], *,
                  repaired: bool, prefix: str | None = None) -> int:
    """Amend the test cases of `nodeids`; returns how many were found. Never raises
    on a missing or unreadable file (the report is pytest's; ours is extra)."""
    try:
        tree = ET.parse(xml_path)
    except (OSError, ET.ParseError):
        return 0
    wanted = {junit_address(n) for n in nodeids}
    found = 0
    for suite in tree.getroot().iter("testsuite"):
        changed_failures = 0
        for case in suite.iter("testcase"):
            classname = case.get("classname", "")
            if prefix and classname.startswith(prefix + "."):
                classname = classname[len(prefix) + 1:]
            if (classname, case.get("name", "")) not in wanted:
                continue
            found += 1
            props = case.find("properties")
            if props is None:
                props = ET.Element("properties")
                case.insert(0, props)
            for name, value in properties:
                ET.SubElement(props, "property", name=name, value=str(value))
            if repaired:
                for tag in ("failure", "error"):
                    for element in case.findall(tag):
                        case.remove(element)
                        changed_failures += 1 if tag == "failure" else 0
                        if tag == "error":
                            suite.set("errors", str(max(0, int(suite.get("errors", "0")) - 1)))
        if changed_failures:
            suite.set("failures", str(max(0, int(suite.get("failures", "0")) - changed_failures)))
    if found:
        tree.write(xml_path, encoding="utf-8", xml_declaration=True)
    return found


def mask_xml(xml_path: Path) -> None:
    """Mask secret values left in the JUnit XML (test names made from node ids).
    Never raises: the report is pytest's."""
    from pytest_loops.redact import redact, secret_values

    if not secret_values():
        return
    try:
        text = xml_path.read_text(encoding="utf-8")
        clean = redact(text)
        if clean != text:
            from pytest_loops.artifacts.runlog import atomic_write_text

            atomic_write_text(xml_path, clean)
    except (OSError, UnicodeDecodeError):
        pass
