"""An artifact given a path is never written over a file of another kind (runtime/outpaths.py):
a run log, the `.tine` and hand-off beside it, a `.tine` given its own path, an HTML report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_loops.errors import LoopUsageError
from pytest_loops.runtime.outpaths import (
    HANDOFF,
    REPORT,
    RUN_LOG,
    TINE,
    beside_log,
    check_artifact_paths,
    check_output_path,
    is_artifact,
)

SAMPLES = {
    RUN_LOG: ['{"event": "start", "schema": "pytest-loops.runlog/1", "loop": "x"}\n',
              json.dumps({"schema": "pytest-loops.runlog/1", "iterations": []}, indent=2)],
    TINE: ["TINEZ1\0\x01rest", '{"format_version": 1, "graph": {}}'],
    HANDOFF: ["# Hand-off: loop `x` stopped with MAX_ITER\n\nmore\n"],
    REPORT: ['<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
             '<meta name="generator" content="pytest-loops">\n'],
}
OTHERS = ["def test_add():\n    assert add(2, 3) == 5\n", "[tool.pytest.ini_options]\n", '{"not": "a log"}\n',
          "<!DOCTYPE html><html><body>mine</body></html>\n", "# Notes\n"]


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_each_kind_is_told_by_its_first_bytes(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "file"
    for text in SAMPLES[kind]:
        path.write_text(text)
        assert is_artifact(path, kind), text
        check_output_path(path, "--x", kind=kind)
    for other in [*OTHERS, *(t for k, ts in SAMPLES.items() if k != kind for t in ts)]:
        path.write_text(other)
        assert not is_artifact(path, kind), (kind, other)
        with pytest.raises(LoopUsageError, match=f"it exists and is not {kind}"):
            check_output_path(path, "--x", kind=kind)
    for empty in ("", "\n  \n"):
        path.write_text(empty)
        assert is_artifact(path, kind)


def test_the_error_is_one_line_naming_the_path_and_the_fix(tmp_path: Path) -> None:
    (tmp_path / "test_calc.py").write_text(OTHERS[0])
    with pytest.raises(LoopUsageError) as caught:
        check_output_path("test_calc.py", "harness/loop-runner.config.yaml: run_log.path", base=tmp_path,
                          kind=RUN_LOG)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("harness/loop-runner.config.yaml: run_log.path: cannot write 'test_calc.py': "
                           "it exists and is not a pytest-loops run log")
    assert "give a path that does not exist yet" in text
    assert (tmp_path / "test_calc.py").read_text() == OTHERS[0]


def test_what_goes_beside_a_run_log_is_checked_too(tmp_path: Path) -> None:
    assert beside_log(tmp_path / "out.json") == {TINE: tmp_path / "out.tine", HANDOFF: tmp_path / "out.handoff.md"}
    check_artifact_paths("out.json", "--log", base=tmp_path)  # nothing there yet
    (tmp_path / "out.handoff.md").write_text("# My own notes\n")
    with pytest.raises(LoopUsageError, match=r"--log \(the pytest-loops hand-off beside it\): cannot write"):
        check_artifact_paths("out.json", "--log", base=tmp_path)
    (tmp_path / "out.handoff.md").unlink()
    (tmp_path / "out.tine").write_text("x = 1\n")
    with pytest.raises(LoopUsageError, match=r"\.tine provenance file beside it"):
        check_artifact_paths("out.json", "--log", base=tmp_path)
    check_artifact_paths("out.json", "--log", base=tmp_path, tine=False)  # a .tine given its own path
    (tmp_path / "out.tine").unlink()
    (tmp_path / "out.json").write_text(SAMPLES[RUN_LOG][1])  # the run log of an earlier run: written over
    check_artifact_paths("out.json", "--log", base=tmp_path)


def test_a_link_to_a_test_file_is_judged_by_what_it_points_at(tmp_path: Path) -> None:
    (tmp_path / "test_calc.py").write_text(OTHERS[0])
    (tmp_path / "run.json").symlink_to("test_calc.py")
    with pytest.raises(LoopUsageError, match="is not a pytest-loops run log"):
        check_output_path("run.json", "--log", base=tmp_path, kind=RUN_LOG)
