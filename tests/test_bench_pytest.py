"""benchmarks/bench_pytest.py: its command line (the timed arms themselves are not tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("bench_pytest", None)
    import bench_pytest

    yield bench_pytest
    sys.modules.pop("bench_pytest", None)


def test_against_takes_a_directory_holding_the_package(bench, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "pytest_loops" / "pytest_plugin" / "plugin.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("")
    assert bench.main(["--skip", "overhead,fixloop", "--against", str(tmp_path)]) == 0
    assert "took" in capsys.readouterr().out


def test_against_a_directory_without_the_package_is_one_usage_line(bench, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--skip", "overhead,fixloop", "--against", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--against {tmp_path}: no pytest_loops/pytest_plugin/plugin.py there" in err
    assert "Traceback" not in err
