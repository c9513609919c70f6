"""The one JUnit XML reader: where pytest's junitxml puts a node id, what a file says
of each test, and amending it after the session fix-loop ran.

pytest writes the XML when the session finishes; the session loop's outcome
comes after. The tests the loop covered get its properties (verdict, reasons,
one per iteration) and, when it repaired them, lose the first run's failure.
Under ``--loop`` secret values left in it (a node id's parametrize id) are masked.

A node id's address is the ``(classname, name)`` pair junitxml writes for it: the
file's dotted path and the classes make the classname, the function and its
parametrize id (kept whole, whatever ``::``, ``[``, ``]``, spaces or other
characters it holds) the name.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_loops.limits import open_own

Address = tuple[str, str]

# what junitxml replaces in a test's name (bin_xml_escape): characters XML 1.0 cannot hold, and DEL
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NOT_PASSED = ("failure", "error", "skipped")


def _xml_visible(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}" if ord(m.group()) <= 0xFF
                        else f"#x{ord(m.group()):04X}", text)


def _address(path: str, names: list[str], params: str | None, prefix: str | None) -> Address:
    dotted = re.sub(r"\.py$", "", path.replace("/", "."))
    parts = [dotted, *names]
    if params is not None:
        parts[-1] += params
    classes = parts[:-1]
    if prefix:
        classes.insert(0, prefix)
    return ".".join(classes), _xml_visible(parts[-1])


def junit_address(nodeid: str, prefix: str | None = None) -> Address:
    """(classname, name) as pytest's junitxml writes them for a node id (``--junit-prefix``
    ``prefix`` before the classname). The path ends at the first ``::``; the parametrize
    id starts at the first ``[`` after it and is kept whole."""
    path, sep, tail = nodeid.partition("::")
    if not sep:
        return _address(path, [], None, prefix)
    names, bracket, params = tail.partition("[")
    return _address(path, names.split("::"), bracket + params if bracket else None, prefix)


def junit_addresses(nodeid: str, prefix: str | None = None) -> set[Address]:
    """Every address a pytest this package supports gives ``nodeid``: before pytest 9.2
    the parametrize id started at the first ``[`` anywhere (a file named ``t[1].py``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    older = _address(names[0], names[1:], bracket + params if bracket else None, prefix)
    return {junit_address(nodeid, prefix), older}


@dataclass(frozen=True)
class JUnitCase:
    """One ``<testcase>``: its address, whether it passed outright, and its seconds."""

    classname: str
    name: str
    passed: bool
    seconds: float

    @property
    def address(self) -> Address:
        return self.classname, self.name


def read_cases(path: Path) -> list[JUnitCase] | None:
    """Every test case of a JUnit XML file, in order; None if it is missing or unreadable.
    A case passed outright when it holds no failure, error or skip."""
    try:
        with open_own(path) as f:  # in the run directory: never a file a check linked there
            root = ET.parse(f).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = []
    for case in root.iter("testcase"):
        try:
            seconds = float(case.get("time") or 0.0)
        except ValueError:
            seconds = 0.0
        cases.append(JUnitCase(case.get("classname", ""), case.get("name", ""),
                               not any(child.tag in _NOT_PASSED for child in case), seconds))
    return cases


def _by_node(nodeids: Iterable[str], prefix: str | None) -> dict[Address, list[str]]:
    wanted: dict[Address, list[str]] = {}
    for node in dict.fromkeys(nodeids):
        for address in junit_addresses(node, prefix):
            wanted.setdefault(address, []).append(node)
    return wanted


def passed_nodeids(path: Path, nodeids: Iterable[str], prefix: str | None = None) -> set[str] | None:
    """The node ids that ran and passed (every case of theirs, subtests too), from a JUnit
    XML file; None if it is unreadable."""
    cases = read_cases(path)
    if cases is None:
        return None
    wanted = _by_node(nodeids, prefix)
    ok: dict[str, bool] = {}
    for case in cases:
        for node in wanted.get(case.address, ()):
            ok[node] = ok.get(node, True) and case.passed
    return {node for node, passed in ok.items() if passed}


def seconds_by_nodeid(path: Path, nodeids: Iterable[str], prefix: str | None = None) -> dict[str, float]:
    """Seconds per node id (its cases summed) from a JUnit XML file; {} if it is unreadable."""
    wanted = _by_node(nodeids, prefix)
    times: dict[str, float] = {}
    for case in read_cases(path) or ():
        for node in wanted.get(case.address, ()):
            times[node] = times.get(node, 0.0) + case.seconds
    return times


def mark_repaired(xml_path: Path, nodeids: Sequence[str], properties: Sequence[tuple[str, str]], *,
                  repaired: bool, prefix: str | None = None) -> int:
    """Amend the test cases of `nodeids`; returns how many were found. Never raises
    on a missing or unreadable file (the report is pytest's; ours is extra)."""
    try:
        tree = ET.parse(xml_path)
    except (OSError, ET.ParseError):
        return 0
    wanted = _by_node(nodeids, prefix)
    found = 0
    for suite in tree.getroot().iter("testsuite"):
        changed_failures = 0
        for case in suite.iter("testcase"):
            if (case.get("classname", ""), case.get("name", "")) not in wanted:
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


def write_loops_junit(runs: Sequence[Mapping[str, Any]], xml_path: Path, *, suite: str = "pytest-loops") -> None:
    """One JUnit XML file of loop runs (run-log dicts): a test case per check of each
    loop, as its last iteration left it, carrying the loop's verdict as properties
    (the names the session's own cases carry: loop, verdict, exit_code, iterations,
    reason, elapsed_s, and shard when the run was one). For ``pytest-loops merge``."""
    from pytest_loops.redact import make_redactor

    scrub = make_redactor()
    root = ET.Element("testsuites")
    tests = failures = 0
    cases = ET.Element("testsuite", name=suite)
    for run in runs:
        name = str(run.get("loop") or "?")
        iterations = [i for i in run.get("iterations") or [] if isinstance(i, dict)]
        last = iterations[-1] if iterations else {}
        checks = [c for c in last.get("checks") or [] if isinstance(c, dict)] or [{"name": "(no check ran)"}]
        props = {"loop": name, "verdict": str(run.get("verdict") or "INCOMPLETE"),
                 "exit_code": str(run.get("exit_code")), "iterations": str(run.get("iterations_run", 0)),
                 "reason": str(run.get("reason") or ""), "elapsed_s": f"{float(run.get('elapsed_s') or 0):.2f}",
                 "artifact_log": str(run.get("log_path") or "")}
        if run.get("shard"):
            props["shard"] = str(run["shard"])
        if run.get("verified") is False:
            props["unverified"] = str(run.get("unverified_why") or "")
        for check in checks:
            tests += 1
            case = ET.SubElement(cases, "testcase", classname=_xml_visible(scrub(name)),
                                 name=_xml_visible(scrub(str(check.get("name")))),
                                 time=f"{float(check.get('duration_s') or 0):.3f}")
            holder = ET.SubElement(case, "properties")
            for key, value in props.items():
                ET.SubElement(holder, "property", name=key, value=_xml_visible(scrub(value)))
            if props["verdict"] != "SUCCESS" or check.get("passed") is False:
                failures += 1
                failure = ET.SubElement(case, "failure", message=_xml_visible(scrub(
                    f"loop {name} ended {props['verdict']}: {props['reason']}")))
                failure.text = _xml_visible(scrub(str(check.get("output_tail") or check.get("reason") or "")))
    cases.set("tests", str(tests))
    cases.set("failures", str(failures))
    cases.set("errors", "0")
    root.append(cases)
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(xml_path, encoding="utf-8", xml_declaration=True)
