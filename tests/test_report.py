"""The HTML report: self-contained, escaped, redacted, and right in a real browser."""

from __future__ import annotations

import copy
import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_loops.artifacts.report import VERDICT_COLOURS, collect_runs, write_html_report
from pytest_loops.errors import LoopUsageError
from pytest_loops.results import CheckResult, IterationRecord, LoopResult
from pytest_loops.spec import Check, LoopSpec
from pytest_loops.verdict import Verdict

CHROMIUM = Path("/usr/bin/chromium")
SECRET = "rep0rt-secret-value-77"
EVIL = "<script>alert('x')</script>"



def run_dict(name: str, outcomes: list[list[bool]], verdict: Verdict | None, reason: str,
             guard: str | None = None) -> dict:
    """A finished run log dict (verdict None: a killed run)."""
    spec = LoopSpec(name=name, goal=f"goal of {name}", revise="./fix.sh",
                    checks=(Check.command_passes("make lint"), Check.test_passes("t.py::test_p")))
    records = []
    for i, passes in enumerate(outcomes, 1):
        checks = [CheckResult(name=spec.checks[n].name, kind="command", passed=ok,
                              exit_code=0 if ok else 1, duration_s=0.5,
                              output_tail="" if ok else f"E   failure in {n}")
                  for n, ok in enumerate(passes)]
        records.append(IterationRecord(
            iter=i, started_at="2026-01-01T00:00:00Z", checks=checks, verify_exit=0 if all(passes) else 1,
            passed=all(passes), duration_s=float(i), state_changed=None if i == 1 else i % 2 == 0,
            unchanged_streak=0, lesson=None if all(passes) else f"lesson {i} of {name}",
            revise_exit=0, guard=guard if i == len(outcomes) else None, elapsed_s=float(i)))
    result = LoopResult(spec=spec, verdict=verdict or Verdict.MAX_ITER, reason=reason,
                        iterations=records, started_at="2026-01-01T00:00:00Z",
                        ended_at="2026-01-01T00:00:09Z", elapsed_s=9.0)
    return {
        "schema": "pytest-loops.runlog/1", "loop": name, "goal": spec.goal, "source": None,
        "verdict": verdict.value if verdict else None, "exit_code": verdict.exit_code if verdict else None,
        "reason": reason, "iterations_run": len(records), "guards": spec.guards.to_dict(),
        "state_paths": [], "started_at": result.started_at, "ended_at": result.ended_at,
        "elapsed_s": result.elapsed_s, "cwd": ".", "revise": spec.revise, "spec": spec.to_dict(),
        "spec_digest": spec.digest(), "memory_page": None, "lessons_read": [],
        "lessons": [r.lesson for r in records if r.lesson], "run_dir": None, "artifacts": {},
        "iterations": [r.to_dict() for r in records], "pytest_loops_version": "0+unknown",
    }


def all_verdicts() -> list[dict]:
    return [
        run_dict("parser loop", [[True, False], [True, True]], Verdict.SUCCESS, "all checks pass"),
        run_dict("capped loop", [[False, False]] * 3, Verdict.MAX_ITER, "cap of 3 reached", "max_iter"),
        run_dict("slow loop", [[True, False]], Verdict.TIMEOUT, "budget ran out", "budget"),
        run_dict("stuck loop", [[True, False]] * 2, Verdict.NO_PROGRESS, "nothing changed", "no_progress"),
        run_dict("human loop", [[True, False]], Verdict.ESCALATE, "a human must confirm", "human"),
        run_dict("killed loop", [[True, False]], None, "the run did not finish (killed or interrupted)"),
    ]


class Elements(HTMLParser):
    """Every start tag with its attributes, and the visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(html_text: str) -> Elements:
    parser = Elements()
    parser.feed(html_text)
    return parser


# --------------------------------------------------------------------------- collect_runs


def test_collect_runs_finds_our_logs_and_skips_others(tmp_path):
    runs = all_verdicts()
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "first.json").write_text(json.dumps(runs[0]))
    (tmp_path / "a" / "b" / "second.json").write_text(json.dumps(runs[1]))
    (tmp_path / "package.json").write_text('{"name": "not ours"}')
    (tmp_path / "broken.json").write_text('{"schema": "pytest-loops.runlog/1", "iterat')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "notes.txt").write_text(json.dumps(runs[2]))  # not *.json
    killed = tmp_path / "killed.json"
    killed.write_text(json.dumps({"event": "start", "schema": "pytest-loops.runlog/1", "loop": "k"}) + "\n")
    found = collect_runs(tmp_path)
    assert sorted(r["loop"] for r in found) == ["capped loop", "k", "parser loop"]
    assert {Path(r["_file"]).name for r in found} == {"first.json", "second.json", "killed.json"}
    assert next(r for r in found if r["loop"] == "k")["verdict"] is None


def test_collect_runs_on_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(LoopUsageError, match="not a directory"):
        collect_runs(tmp_path / "x.json")
    with pytest.raises(LoopUsageError, match="not a directory"):
        collect_runs(tmp_path / "missing")


# --------------------------------------------------------------------------- the page


def test_the_page_is_self_contained(tmp_path):
    out = write_html_report(all_verdicts(), tmp_path / "report.html")
    text = Path(out).read_text()
    page = parse(text)
    tags = {tag for tag, _ in page.tags}
    assert not tags & {"script", "link", "img", "iframe", "object", "embed", "audio", "video", "base"}
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "srcset"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http:", "https:", "//", "data:", "javascript:")), (tag, value)
    assert "url(" not in text and "@import" not in text
    csp = [a for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]


def test_every_loop_is_in_the_overview_with_its_verdict_and_colour(tmp_path):
    runs = all_verdicts()
    text = Path(write_html_report(runs, tmp_path / "report.html")).read_text()
    page = parse(text)
    rows = [a for t, a in page.tags if t == "tr" and "run" in (a.get("class") or "")]
    assert [r["data-verdict"] for r in rows] == [
        "SUCCESS", "MAX_ITER", "TIMEOUT", "NO_PROGRESS", "ESCALATE", "INCOMPLETE"]
    for verdict, colour in VERDICT_COLOURS.items():
        assert f'background:{colour}">{verdict or "INCOMPLETE"}</span>' in text
    sections = [a for t, a in page.tags if t == "section" and a.get("class") == "loop"]
    assert len(sections) == len(runs)
    assert "cap of 3 reached" in text and "lesson 2 of capped loop" in text
    assert "6 loop runs" in text


def test_the_timeline_has_a_mark_per_check_a_bar_per_iteration_and_the_guard(tmp_path):
    run = run_dict("capped loop", [[True, False], [False, False], [True, False]],
                   Verdict.MAX_ITER, "cap", "max_iter")
    page = parse(Path(write_html_report([run], tmp_path / "r.html")).read_text())
    classes = [a.get("class") for t, a in page.tags]
    assert classes.count("pass") == 2 and classes.count("fail") == 4
    assert classes.count("bar") == 3
    assert classes.count("changed") == 1 and classes.count("same") == 1  # iteration 1 is not compared
    assert classes.count("guard") == 1
    assert "guard max_iter stopped the loop in iteration 3" in "".join(page.text)


def test_many_checks_are_summed_up_in_one_row(tmp_path):
    run = run_dict("wide", [[True, False]], Verdict.MAX_ITER, "cap")
    checks = run["iterations"][0]["checks"]
    run["iterations"][0]["checks"] = [dict(checks[1], name=f"check {i}") for i in range(20)]
    run["spec"]["checks"] = []
    text = Path(write_html_report([run], tmp_path / "r.html")).read_text()
    assert "+8 more" in text and "8✗" in text


def test_untrusted_text_is_escaped_everywhere(tmp_path):
    run = run_dict(EVIL, [[True, False]], Verdict.MAX_ITER, f"reason {EVIL}", f"g{EVIL}")
    run["goal"] = EVIL
    run["lessons"] = [EVIL]
    run["iterations"][0]["checks"][1]["name"] = EVIL
    run["iterations"][0]["checks"][1]["output_tail"] = f"E   {EVIL}\n\"quoted\" & 'single'"
    run["artifacts"] = {"log": f"/tmp/{EVIL}.json"}
    text = Path(write_html_report([run], tmp_path / "r.html", title=EVIL)).read_text()
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    page = parse(text)
    assert not [t for t, _ in page.tags if t == "script"]
    assert EVIL in "".join(page.text)  # shown as text, not run


def test_links_are_relative_and_never_a_url_scheme(tmp_path):
    run = run_dict("linked", [[True, True]], Verdict.SUCCESS, "ok")
    (tmp_path / "runs").mkdir()
    run["artifacts"] = {
        "log": str(tmp_path / "runs" / "linked.json"),
        "tine": str(tmp_path / "runs" / "linked.tine"),
        "handoff": str(tmp_path / "runs" / "javascript:alert(1).md"),
        "memory": str(tmp_path.parent / "lessons.md"),
    }
    page = parse(Path(write_html_report([run], tmp_path / "report.html")).read_text())
    hrefs = [a["href"] for t, a in page.tags if t == "a" and not a["href"].startswith("#")]
    assert hrefs == ["./runs/linked.json", "./runs/linked.tine", "./runs/javascript%3Aalert%281%29.md",
                     "../lessons.md"]


def test_the_found_log_file_is_the_log_link(tmp_path):
    run = run_dict("found", [[True, True]], Verdict.SUCCESS, "ok")
    run["artifacts"] = {"log": "/elsewhere/old/path.json"}
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "found.json").write_text(json.dumps(run))
    out = write_html_report(collect_runs(tmp_path / "logs"), tmp_path / "report.html")
    assert 'href="./logs/found.json"' in Path(out).read_text()


def test_env_secrets_never_reach_the_page(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOY_TOKEN", SECRET)
    run = run_dict(f"loop {SECRET}", [[True, False]], Verdict.MAX_ITER, f"reason {SECRET}")
    run["iterations"][0]["checks"][1]["output_tail"] = f"printing {SECRET}\nmore"
    run["lessons"] = [f"lesson {SECRET}"]
    text = Path(write_html_report([run], tmp_path / "r.html")).read_text()
    assert SECRET not in text
    assert "[REDACTED:DEPLOY_TOKEN]" in text


def test_odd_values_do_not_break_the_page(tmp_path):
    run = run_dict("odd", [[True, False], [True, False]], Verdict.MAX_ITER, "cap")
    run["elapsed_s"] = float("nan")
    run["iterations"][0]["duration_s"] = -5
    run["iterations"][1]["duration_s"] = "slow"
    run["iterations"].append("not a dict")
    sparse = {"schema": "pytest-loops.runlog/1", "verdict": "SUCCESS"}
    text = Path(write_html_report([run, sparse], tmp_path / "r.html")).read_text()
    assert "(unnamed loop)" in text and "No iteration finished." in text


def test_no_runs(tmp_path):
    text = Path(write_html_report([], tmp_path / "r.html")).read_text()
    assert "No loop runs were found." in text and "0 loop runs" in text


def test_report_of_runs_written_by_the_engine(harness, tmp_path):
    harness.run(verify=[1, 0], revise=None, max_iter=4, no_progress_k=0)
    harness.run(verify=[1, 1, 1], revise=None, max_iter=3, no_progress_k=0)
    runs = collect_runs(harness.base_dir)
    assert len(runs) == 2
    text = Path(write_html_report(runs, tmp_path / "report.html")).read_text()
    assert {"SUCCESS", "MAX_ITER"} <= {r["verdict"] for r in runs}
    for run in runs:
        assert f'data-verdict="{run["verdict"]}"' in text


# --------------------------------------------------------------------------- a real browser


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
        capture_output=True, text=True, timeout=120)


needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium); CI installs it")


@needs_chromium
def test_a_browser_renders_every_loop_with_its_verdict(tmp_path):
    runs = all_verdicts()
    evil = copy.deepcopy(runs[1])
    evil["loop"] = EVIL
    evil["iterations"][-1]["checks"][1]["output_tail"] = EVIL
    runs.append(evil)
    out = Path(write_html_report(runs, tmp_path / "report.html"))
    done = chromium(tmp_path, "--dump-dom", out.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    page = parse(dom)
    assert not [t for t, _ in page.tags if t == "script"]  # the loop name did not become code
    rows = dom.split('<tr class="run"')[1:]
    assert len(rows) == len(runs)
    expected = [(r["loop"], r["verdict"] or "INCOMPLETE") for r in runs]
    for row, (name, verdict) in zip(rows, expected, strict=True):
        row_text = "".join(parse("<tr" + row.split("</tr>")[0]).text)
        assert name in row_text and verdict in row_text
    assert dom.count('class="timeline"') == len(runs)


@needs_chromium
def test_a_browser_takes_a_screenshot(tmp_path):
    out = Path(write_html_report(all_verdicts(), tmp_path / "report.html"))
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, "--window-size=1200,1600", f"--screenshot={shot}", out.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_collect_runs_finds_a_log_written_with_sorted_keys(tmp_path):
    run = run_dict("sorted", [[True, True]] * 30, Verdict.SUCCESS, "ok")
    (tmp_path / "sorted.json").write_text(json.dumps(run, sort_keys=True, indent=2))
    assert [r["loop"] for r in collect_runs(tmp_path)] == ["sorted"]


def test_relative_artifact_paths_are_found_beside_the_log(tmp_path):
    logs = tmp_path / "logs"
    (logs / "r1").mkdir(parents=True)
    (logs / "r1" / "run.tine").write_text("x")
    run = run_dict("relative", [[True, True]], Verdict.SUCCESS, "ok")
    run["artifacts"] = {"tine": "r1/run.tine", "handoff": "missing/h.md"}
    run["cwd"] = str(tmp_path / "work")
    (logs / "relative.json").write_text(json.dumps(run))
    text = Path(write_html_report(collect_runs(logs), tmp_path / "report.html")).read_text()
    assert 'href="./logs/r1/run.tine"' in text  # found beside the log
    assert 'href="./work/missing/h.md"' in text  # not found: relative to the loop's cwd


def test_lessons_from_the_lessons_page_lose_their_list_dash(tmp_path):
    run = run_dict("dash", [[True, False]], Verdict.MAX_ITER, "cap")
    run["lessons"] = ["- 2026-01-01T00:00:00Z dash iter 1: exit 1"]
    text = Path(write_html_report([run], tmp_path / "r.html")).read_text()
    assert "<li>2026-01-01T00:00:00Z dash iter 1: exit 1</li>" in text
