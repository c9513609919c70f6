"""The state fingerprint and failure signatures behind the no-progress guard.

Every fingerprint test works on real files under tmp_path. Files get an old mtime
(one hour ago) unless the test is about the racy window, so no test sleeps.

Each fingerprint test runs twice: as the fingerprint runs by default (a change
journal after the first compute, where inotify exists) and walking every time.
Tests about the journal itself ask for the ``journal`` fixture and run once.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import hashlib
import os
import random
import re
import shutil
import string
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_loops.errors import LoopUsageError
from pytest_loops.progress import fingerprint as progress
from pytest_loops.progress import journal as fswatch
from pytest_loops.progress import matching, treehash
from pytest_loops.progress.fingerprint import (
    JOURNAL_REWALK_EVERY,
    StateFingerprint,
    failure_signature,
    first_meaningful_line,
    normalize_failure,
)
from pytest_loops.progress.matching import DEFAULT_EXCLUDES
from pytest_loops.progress.treehash import RACY_WINDOW_NS
from pytest_loops.spec import CheckKind

HOUR_NS = 3600 * 1_000_000_000
SIG = re.compile(r"sha256:[0-9a-f]{64}\Z")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every fingerprint test (they all use tmp_path) in both modes, except the
    # journal's own tests.
    names = metafunc.fixturenames
    if "tmp_path" in names and "journal" not in names:
        metafunc.parametrize("fingerprint_mode", ["default", "walk"], indirect=True)


def _no_journal(root: str) -> fswatch.DirectoryJournal:
    raise fswatch.JournalLost("walking, as the test asks", sticky=True)


@pytest.fixture(autouse=True)
def fingerprint_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    mode = getattr(request, "param", "default")
    if mode == "walk":
        monkeypatch.setattr(progress, "_open_journal", _no_journal)
    return mode


def test_the_walk_mode_really_walks(tmp_path: Path, fingerprint_mode: str) -> None:
    # The walk mode swaps fingerprint._open_journal: this fails if the swap stops taking effect.
    write(tmp_path, "a.txt")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    sf.compute()
    if fingerprint_mode == "walk":
        assert (sf.last_stats["mode"], sf.last_stats["journal"]) == ("walk", "walking, as the test asks")
    elif fswatch.unavailable_reason() is None:
        assert (sf.last_stats["mode"], sf.last_stats["journal"]) == ("journal", "on")


@pytest.fixture
def journal() -> None:
    """The test is about the change journal: skip where inotify does not exist."""
    reason = fswatch.unavailable_reason()
    if reason is not None:  # pragma: no cover - Linux in CI
        pytest.skip(reason)


def write(root: Path, rel: str, content: str | bytes = "x", *, old: bool = True) -> Path:
    """Create root/rel; an old mtime puts it outside the racy window."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    if old:
        age_out(path)
    return path


def age_out(path: Path) -> None:
    then = time.time_ns() - HOUR_NS
    os.utime(path, ns=(then, then))


def tree(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        write(root, rel, content)


def fp(root: Path, patterns=(".",), **kw) -> str:
    return StateFingerprint(root, patterns, **kw).compute()


def counts(sf: StateFingerprint) -> dict[str, int]:
    """The counters of last_stats, without how the compute was done."""
    return {k: v for k, v in sf.last_stats.items() if k in ("files", "hashed", "stat_only")}


def matched(root: Path, patterns, **kw) -> list[str]:
    sf = StateFingerprint(root, patterns, **kw)
    sf.compute()
    return sf.files


# ------------------------------------------------------------------ basics


def test_compute_returns_a_sha256_never_empty(tmp_path: Path) -> None:
    assert SIG.match(fp(tmp_path))  # empty tree
    assert SIG.match(fp(tmp_path, []))  # no patterns at all
    write(tmp_path, "a.txt")
    assert SIG.match(fp(tmp_path))


def test_same_tree_gives_same_fingerprint_across_instances(tmp_path: Path) -> None:
    tree(tmp_path, {"a.txt": "1", "src/b.py": "2", "src/deep/c.py": "3"})
    warm = StateFingerprint(tmp_path, ["."])
    first = warm.compute()
    assert warm.compute() == first  # from the cache
    assert fp(tmp_path) == first  # a cold instance agrees


def test_empty_tree_differs_from_tree_with_an_empty_file(tmp_path: Path) -> None:
    empty = fp(tmp_path)
    write(tmp_path, "a.txt", "")
    assert fp(tmp_path) != empty


def test_files_and_last_stats_shape(tmp_path: Path) -> None:
    tree(tmp_path, {"b.txt": "1", "a/c.txt": "2"})
    sf = StateFingerprint(tmp_path, ["."])
    assert sf.files == [] and counts(sf) == {"files": 0, "hashed": 0, "stat_only": 0}
    assert sf.last_stats["mode"] == "none"
    sf.compute()
    assert sf.files == ["a/c.txt", "b.txt"]
    assert counts(sf) == {"files": 2, "hashed": 2, "stat_only": 0}
    assert sf.last_stats["mode"] == "walk"  # the first compute always walks
    assert isinstance(sf.last_stats["journal"], str)
    sf.files.append("mutated")  # a copy: callers cannot corrupt it
    assert sf.files == ["a/c.txt", "b.txt"]
    assert sf.root == str(tmp_path)


# ------------------------------------------------------------------ changes


def test_content_change_changes_fingerprint_and_reverting_restores_it(tmp_path: Path) -> None:
    tree(tmp_path, {"a.txt": "one", "b.txt": "two"})
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    write(tmp_path, "a.txt", "ONE plus more")
    changed = sf.compute()
    assert changed != before
    write(tmp_path, "a.txt", "one")
    assert sf.compute() == before  # content-addressed, not time-addressed


def test_same_size_rewrite_in_the_racy_window_with_mtime_forced_back(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "aaaa", old=False)  # fresh: inside the racy window
    st = path.stat()
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    with open(path, "r+b") as f:  # same inode, same size
        f.write(b"bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after_stat = path.stat()
    assert (after_stat.st_size, after_stat.st_mtime_ns, after_stat.st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )
    assert sf.compute() != before


def test_racy_rule_alone_catches_the_rewrite_when_ctime_is_not_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some filesystems have no meaningful ctime: only the racy window protects then.
    monkeypatch.setattr(
        treehash, "stat_signature", lambda st: (st.st_size, st.st_mtime_ns, st.st_ino, 0, 0)
    )
    path = write(tmp_path, "a.txt", "aaaa", old=False)
    st = path.stat()
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sf.compute() != before


def test_rewrite_of_an_old_file_with_old_mtime_restored_is_caught_by_ctime(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "aaaa")  # old: outside the racy window, trusted
    st = path.stat()
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    assert sf.compute() == before and sf.last_stats["hashed"] == 0
    time.sleep(0.05)  # let the coarse kernel clock tick so ctime can differ
    path.write_bytes(b"bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    if path.stat().st_ctime_ns == st.st_ctime_ns:  # pragma: no cover - no usable ctime here
        pytest.skip("this filesystem did not move ctime")
    assert sf.compute() != before


def test_add_delete_and_rename_change_the_fingerprint(tmp_path: Path) -> None:
    tree(tmp_path, {"a.txt": "same", "b.txt": "other"})
    sf = StateFingerprint(tmp_path, ["."])
    base = sf.compute()

    write(tmp_path, "new.txt", "")
    added = sf.compute()
    assert added != base and "new.txt" in sf.files

    (tmp_path / "new.txt").unlink()
    assert sf.compute() == base and "new.txt" not in sf.files

    (tmp_path / "a.txt").unlink()
    deleted = sf.compute()
    assert deleted not in (base, added)
    write(tmp_path, "a.txt", "same")
    assert sf.compute() == base

    os.rename(tmp_path / "a.txt", tmp_path / "c.txt")  # same bytes, new name
    renamed = sf.compute()
    assert renamed not in (base, added, deleted)
    assert sf.files == ["b.txt", "c.txt"]

    (tmp_path / "sub").mkdir()
    os.rename(tmp_path / "c.txt", tmp_path / "sub" / "c.txt")  # moved, not renamed
    assert sf.compute() not in (base, added, deleted, renamed)


def test_empty_directories_are_not_state(tmp_path: Path) -> None:
    write(tmp_path, "a.txt")
    before = fp(tmp_path)
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    assert fp(tmp_path) == before


# ------------------------------------------------------------- incremental


def test_unchanged_tree_is_not_rehashed(tmp_path: Path) -> None:
    tree(tmp_path, {f"d{i % 3}/f{i}.txt": str(i) for i in range(30)})
    sf = StateFingerprint(tmp_path, ["."])
    first = sf.compute()
    assert counts(sf) == {"files": 30, "hashed": 30, "stat_only": 0}
    assert sf.compute() == first
    assert counts(sf) == {"files": 30, "hashed": 0, "stat_only": 30}


def test_only_the_changed_file_is_rehashed(tmp_path: Path) -> None:
    tree(tmp_path, {f"f{i}.txt": str(i) for i in range(10)})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    write(tmp_path, "f3.txt", "changed")  # new content, new (old) mtime
    sf.compute()
    assert counts(sf) == {"files": 10, "hashed": 1, "stat_only": 9}


def test_fresh_file_is_rehashed_until_it_leaves_the_racy_window(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "x", old=False)
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    assert sf.last_stats["hashed"] == 1
    sf.compute()
    assert sf.last_stats["hashed"] == 1  # mtime too recent to trust the stat
    age_out(path)  # as if the window had passed (the stat changes, so hash once more)
    sf.compute()
    assert sf.last_stats["hashed"] == 1
    sf.compute()
    assert counts(sf) == {"files": 1, "hashed": 0, "stat_only": 1}


def test_file_with_future_mtime_is_never_trusted(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "x")
    future = time.time_ns() + HOUR_NS
    os.utime(path, ns=(future, future))
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    sf.compute()
    assert sf.last_stats["hashed"] == 1


def test_racy_window_is_two_seconds() -> None:
    assert RACY_WINDOW_NS == 2_000_000_000


# ---------------------------------------------------------------- excludes


@pytest.mark.parametrize(
    "rel",
    [
        ".git/index",
        ".git/objects/ab/cdef",
        "__pycache__/a.cpython-311.pyc",
        "src/pkg/__pycache__/m.cpython-311.pyc",
        ".pytest_cache/v/cache/lastfailed",
        ".pytest-loops/runs/1/run.json",
        ".hypothesis/examples/x",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/0.4/x",
        "src/stray.pyc",
        ".coverage",
        ".coverage.host.1234.567",
        "sub/.coverage",
    ],
)
def test_default_excludes_never_count(tmp_path: Path, rel: str) -> None:
    tree(tmp_path, {"src/app.py": "print(1)"})
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    write(tmp_path, rel, "written by a test run", old=False)
    assert sf.compute() == before
    assert sf.files == ["src/app.py"]
    # A glob through the excluded name does not bring it back either.
    assert rel not in matched(tmp_path, ["**/*"])


def test_default_excludes_list() -> None:
    for name in (".git", "__pycache__", ".pytest_cache", ".pytest-loops", ".hypothesis",
                 ".mypy_cache", ".ruff_cache", "*.pyc", ".coverage", ".coverage.*"):
        assert name in DEFAULT_EXCLUDES


def test_names_resembling_default_excludes_still_count(tmp_path: Path) -> None:
    tree(tmp_path, {"coverage.txt": "1", ".coveragerc": "2", "git/x": "3", "a.pyc.txt": "4"})
    assert matched(tmp_path, ["."]) == [".coveragerc", "a.pyc.txt", "coverage.txt", "git/x"]


def test_exclude_bare_name_applies_at_any_depth(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "1", "run.json": "{}", "sub/run.json": "{}", "sub/keep.json": "{}"})
    sf = StateFingerprint(tmp_path, ["."], exclude=["run.json"])
    before = sf.compute()
    assert sf.files == ["a.py", "sub/keep.json"]  # like .gitignore
    write(tmp_path, "run.json", '{"iteration": 2}')
    write(tmp_path, "sub/run.json", '{"iteration": 2}')
    assert sf.compute() == before


def test_exclude_top_level_only_with_dot_slash(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "1", "run.json": "{}", "sub/run.json": "{}"})
    assert matched(tmp_path, ["."], exclude=["./run.json"]) == ["a.py", "sub/run.json"]


def test_exclude_absolute_path(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "1", "memory/lessons.md": "- one"})
    page = tmp_path / "memory" / "lessons.md"
    sf = StateFingerprint(tmp_path, ["."], exclude=[str(page)])
    before = sf.compute()
    write(tmp_path, "memory/lessons.md", "- one\n- two")
    assert sf.compute() == before and sf.files == ["a.py"]


def test_exclude_the_engines_own_files(tmp_path: Path) -> None:
    # The engine passes its artifacts dir, run log, run dir and memory page (+ lock).
    tree(tmp_path, {"src/a.py": "1", "loop-runs/r1/log.jsonl": "{}", "lessons.md": "- a"})
    exclude = [
        str(tmp_path / "loop-runs"),
        str(tmp_path / "loop-runs" / "r1" / "log.jsonl"),
        str(tmp_path / "lessons.md"),
        str(tmp_path / "lessons.md") + ".lock",
    ]
    sf = StateFingerprint(tmp_path, ["."], exclude=exclude)
    before = sf.compute()
    write(tmp_path, "loop-runs/r1/log.jsonl", '{"iteration": 2}')
    write(tmp_path, "loop-runs/r2/prompt.md", "new run dir")
    write(tmp_path, "lessons.md", "- a\n- b")
    write(tmp_path, "lessons.md.lock", "")
    write(tmp_path, "src/lessons.md", "not the memory page")  # absolute = exact path
    assert sf.compute() != before
    assert sf.files == ["src/a.py", "src/lessons.md"]


def test_exclude_pathlike_and_single_string(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "1", "b.log": "2"})
    assert matched(tmp_path, ["."], exclude=tmp_path / "b.log") == ["a.py"]
    assert matched(tmp_path, ".", exclude="b.log") == ["a.py"]


def test_exclude_globs_and_directories(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "a.py": "1",
            "top.log": "2",
            "logs/x.log": "3",
            "logs/keep.txt": "4",
            "deep/er/y.log": "5",
            "out/build/z.o": "6",
        },
    )
    everything = ["a.py", "deep/er/y.log", "logs/keep.txt", "logs/x.log", "out/build/z.o", "top.log"]
    assert matched(tmp_path, ["."], exclude=["*.log"]) == ["a.py", "logs/keep.txt", "out/build/z.o"]
    assert matched(tmp_path, ["."], exclude=["**/*.log"]) == matched(
        tmp_path, ["."], exclude=["*.log"]
    )
    assert matched(tmp_path, ["."], exclude=["./*.log"]) == [
        f for f in everything if f != "top.log"
    ]
    assert matched(tmp_path, ["."], exclude=["logs/*.log", "./out"]) == [
        "a.py", "deep/er/y.log", "logs/keep.txt", "top.log",
    ]
    # A bare directory name, with or without a trailing slash, at any depth.
    for name in ("build", "build/"):
        assert matched(tmp_path, ["."], exclude=[name]) == [
            f for f in everything if f != "out/build/z.o"
        ]
    assert matched(tmp_path, ["."], exclude=["deep/er"]) == [
        f for f in everything if f != "deep/er/y.log"
    ]
    assert matched(tmp_path, ["."], exclude=["."]) == []


def test_exclude_wins_over_an_explicit_pattern(tmp_path: Path) -> None:
    tree(tmp_path, {"gen/x.py": "1", "gen/y.py": "2", "__pycache__/z.py": "3"})
    assert matched(tmp_path, ["gen/x.py", "gen"], exclude=["gen"]) == []
    assert matched(tmp_path, ["__pycache__/z.py"]) == []


def test_blank_excludes_are_ignored(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "1"})
    assert matched(tmp_path, ["."], exclude=["", "  "]) == ["a.py"]


# ---------------------------------------------------------------- patterns


@pytest.fixture
def project(tmp_path: Path) -> Path:
    tree(
        tmp_path,
        {
            "README.txt": "r",
            "notes.txt": "n",
            ".env.txt": "hidden",
            "src/a.py": "a",
            "src/c.txt": "c",
            "src/pkg/b.py": "b",
            "src/pkg/deep/d.py": "d",
            "other/e.py": "e",
            "data.txt/inner.bin": "a directory named like a file",
        },
    )
    return tmp_path


def test_glob_recursive(project: Path) -> None:
    assert matched(project, ["src/**/*.py"]) == ["src/a.py", "src/pkg/b.py", "src/pkg/deep/d.py"]
    assert matched(project, ["**/b.py"]) == ["src/pkg/b.py"]


def test_glob_top_level_only_and_dotfiles_match(project: Path) -> None:
    # A glob matching a directory takes everything beneath it.
    assert matched(project, ["*.txt"]) == [
        ".env.txt", "README.txt", "data.txt/inner.bin", "notes.txt",
    ]


def test_glob_character_classes(project: Path) -> None:
    assert matched(project, ["src/[ab].py", "src/?.txt"]) == ["src/a.py", "src/c.txt"]
    assert matched(project, ["src/[!a].*"]) == ["src/c.txt"]


def test_directory_pattern_takes_everything_beneath(project: Path) -> None:
    assert matched(project, ["src"]) == [
        "src/a.py", "src/c.txt", "src/pkg/b.py", "src/pkg/deep/d.py",
    ]
    assert matched(project, ["src/"]) == matched(project, ["src"])
    assert matched(project, ["src/pkg/**"]) == ["src/pkg/b.py", "src/pkg/deep/d.py"]


def test_file_pattern_and_single_string_pattern(project: Path) -> None:
    assert matched(project, ["src/pkg/b.py"]) == ["src/pkg/b.py"]
    assert matched(project, "src/pkg/b.py") == ["src/pkg/b.py"]  # one pattern, not characters
    assert matched(project, [Path("src/pkg/b.py")]) == ["src/pkg/b.py"]


def test_directory_named_like_a_file(project: Path) -> None:
    sf = StateFingerprint(project, ["data.txt"])
    before = sf.compute()
    assert sf.files == ["data.txt/inner.bin"]
    write(project, "data.txt/inner.bin", "changed")
    assert sf.compute() != before


DIRS = ["a", "pkg.py", "s"]
FILES = ["x.py", "y.txt", "z"]
SEGMENTS = ["**", "*", "*.py", "a", "pkg.py", "x.py", "?.txt", "[xy]*", "s", "nope"]


@settings(max_examples=200, deadline=None)
@given(
    files=st.sets(
        st.tuples(st.lists(st.sampled_from(DIRS), max_size=3).map(tuple), st.sampled_from(FILES)),
        min_size=1,
        max_size=8,
    ),
    pattern=st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map("/".join),
)
@pytest.mark.slow
def test_globs_take_every_file_at_or_beneath_a_match(files, pattern) -> None:
    # The definition: a file counts if its path, or a directory above it, matches
    # the glob. Every walking strategy (literal, `**/name` fast path, general) must
    # agree with it.
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        keys = sorted({"/".join([*dirs, name]) for dirs, name in files})
        for key in keys:
            write(root, key)
        rx = re.compile(matching._path_regex(pattern))
        assert matched(root, [pattern]) == [k for k in keys if rx.match(k)]


def test_absolute_pattern_inside_root_uses_relative_keys(project: Path) -> None:
    absolute = matched(project, [str(project / "src" / "**" / "*.py")])
    assert absolute == matched(project, ["src/**/*.py"])
    assert fp(project, [str(project / "src")]) == fp(project, ["src"])


def test_absolute_pattern_outside_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    tree(root, {"a.py": "1"})
    tree(outside, {"x.cfg": "1", "sub/y.cfg": "2"})
    sf = StateFingerprint(root, [".", str(outside / "**" / "*.cfg")])
    before = sf.compute()
    assert sf.files == sorted(
        ["a.py", (outside / "sub" / "y.cfg").as_posix(), (outside / "x.cfg").as_posix()]
    )
    write(outside, "x.cfg", "2")
    assert sf.compute() != before
    assert matched(root, [str(outside / "x.cfg")]) == [(outside / "x.cfg").as_posix()]


def test_relative_pattern_leaving_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    write(tmp_path, "sibling/s.txt", "1")
    assert matched(root, ["../sibling"]) == [(tmp_path / "sibling" / "s.txt").as_posix()]


def test_nonexistent_patterns_contribute_nothing(project: Path) -> None:
    base = fp(project, ["src"])
    for extra in ("missing.txt", "missing/**/*.py", "nope/*", "*.nothing", "src/a.py/x"):
        assert fp(project, ["src", extra]) == base, extra
    assert matched(project, ["missing/**"]) == []


def test_missing_root_contributes_nothing(tmp_path: Path) -> None:
    assert fp(tmp_path / "absent") == fp(tmp_path, [])


def test_overlapping_patterns_count_each_file_once(project: Path) -> None:
    sf = StateFingerprint(project, ["src", "src/**/*.py", "src/a.py", "**/**/a.py"])
    assert sf.compute() == fp(project, ["src"])
    assert sf.last_stats["files"] == 4


def test_blank_patterns_are_ignored(project: Path) -> None:
    assert matched(project, ["", "   "]) == []


@pytest.mark.parametrize(
    ("patterns", "exclude", "needle"),
    [
        ([3], (), "state pattern 3 is not a path"),
        (["ok", None], (), "state pattern None is not a path"),
        (["a\0b"], (), "contains a NUL byte"),
        (["."], [b"x"], "exclude b'x' is not a path"),
    ],
)
def test_bad_patterns_are_one_line_usage_errors(tmp_path, patterns, exclude, needle) -> None:
    with pytest.raises(LoopUsageError) as info:
        StateFingerprint(tmp_path, patterns, exclude=exclude)
    message = str(info.value)
    assert needle in message and "\n" not in message


# ------------------------------------------------- links, special, unreadable


def test_symlinked_directory_loop_is_not_followed(tmp_path: Path) -> None:
    write(tmp_path, "src/pkg/a.py", "1")
    os.symlink(tmp_path / "src", tmp_path / "src" / "pkg" / "loop")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    assert sf.files == ["src/pkg/a.py", "src/pkg/loop"]
    assert matched(tmp_path, ["**/*.py"]) == ["src/pkg/a.py"]


def test_retargeting_a_directory_link_changes_the_fingerprint(tmp_path: Path) -> None:
    tree(tmp_path, {"v1/x": "1", "v2/x": "1"})
    link = tmp_path / "current"
    os.symlink("v1", link)
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    link.unlink()
    os.symlink("v2", link)
    assert sf.compute() != before


def test_link_named_by_a_pattern_is_followed(tmp_path: Path) -> None:
    write(tmp_path, "real/x.py", "1")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    assert matched(tmp_path, ["alias"]) == ["alias/x.py"]
    assert matched(tmp_path, ["alias/*.py"]) == ["alias/x.py"]


def test_symlinked_file_is_hashed_by_content(tmp_path: Path) -> None:
    target = write(tmp_path, "elsewhere/t.txt", "v1")
    write(tmp_path, "state/keep.txt", "k")
    os.symlink(target, tmp_path / "state" / "link.txt")
    sf = StateFingerprint(tmp_path, ["state"])
    before = sf.compute()
    write(tmp_path, "elsewhere/t.txt", "v2")
    assert sf.compute() != before


def test_dangling_and_looping_links_are_markers_not_errors(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "1")
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    os.symlink("self", tmp_path / "self")
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    assert sf.files == ["a.txt", "dangling", "self"]
    write(tmp_path, "missing", "now it exists")
    assert sf.compute() != before
    assert matched(tmp_path, ["self"]) == ["self"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_a_marker_and_never_opened(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "1")
    os.mkfifo(tmp_path / "pipe")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()  # would block forever if the FIFO were opened for reading
    assert sf.files == ["a.txt", "pipe"]
    assert sf.last_stats["hashed"] == 1


def test_unreadable_file_is_a_marker_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests may run as root, where chmod 000 does not stop reads: refuse the open.
    tree(tmp_path, {"a.txt": "1", "secret.txt": "2"})
    readable = fp(tmp_path)
    real_open = os.open
    secret = str(tmp_path / "secret.txt")

    def refusing_open(path, flags, *args, **kw):
        if os.fspath(path) == secret:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(progress.os, "open", refusing_open)
    sf = StateFingerprint(tmp_path, ["."])
    blocked = sf.compute()
    assert blocked != readable
    assert sf.files == ["a.txt", "secret.txt"]
    sf.compute()
    assert sf.last_stats["hashed"] == 1  # errors are not cached: retried every time
    monkeypatch.setattr(progress.os, "open", real_open)
    assert sf.compute() == readable


@pytest.mark.skipif(IS_ROOT, reason="root reads files regardless of their mode")
def test_unreadable_file_by_mode(tmp_path: Path) -> None:  # pragma: no cover - root in CI
    path = write(tmp_path, "secret.txt", "2")
    readable = fp(tmp_path)
    path.chmod(0)
    try:
        assert fp(tmp_path) != readable
    finally:
        path.chmod(0o644)


@pytest.mark.skipif(IS_ROOT, reason="root lists directories regardless of their mode")
def test_unreadable_directory_by_mode(tmp_path: Path) -> None:  # pragma: no cover - root in CI
    write(tmp_path, "locked/x.txt", "1")
    readable = fp(tmp_path)
    (tmp_path / "locked").chmod(0)
    try:
        sf = StateFingerprint(tmp_path, ["."])
        assert sf.compute() != readable
        assert sf.files == ["locked"]
    finally:
        (tmp_path / "locked").chmod(0o755)


@pytest.mark.parametrize("pattern", [".", "**/*.txt"])
def test_unlistable_directory_is_a_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pattern: str
) -> None:
    # Root lists any directory, so refuse opening and listing it instead.
    tree(tmp_path, {"a.txt": "1", "locked/x.txt": "2"})
    readable = fp(tmp_path, [pattern])
    real_open, real_scandir = os.open, os.scandir
    locked = str(tmp_path / "locked")

    def refusing_open(path, flags, *args, **kw):
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kw)

    def refusing_scandir(path="."):
        if not isinstance(path, int) and os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(progress.os, "open", refusing_open)
    monkeypatch.setattr(progress.os, "scandir", refusing_scandir)
    sf = StateFingerprint(tmp_path, [pattern])
    assert sf.compute() != readable
    assert sf.files == ["a.txt", "locked"]


# ---------------------------------------------------------------- change journal


def modes(sf: StateFingerprint, times: int) -> list[str]:
    """Compute ``times`` times; how each compute was done."""
    out = []
    for _ in range(times):
        sf.compute()
        out.append(sf.last_stats["mode"])
    return out


def walked(root: Path, patterns=(".",), **kw) -> StateFingerprint:
    """A fingerprint that can only walk: the reference a journal must agree with."""
    sf = StateFingerprint(root, patterns, **kw)
    sf.close()
    sf.compute()
    return sf


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class CountingCalls:
    """Counts calls of some ``os`` functions (progress, fswatch and os are one module)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
        self.calls: dict[str, int] = dict.fromkeys(names, 0)
        for name in names:
            real = getattr(os, name)

            def counted(*args, _real=real, _name=name, **kw):
                self.calls[_name] += 1
                return _real(*args, **kw)

            monkeypatch.setattr(os, name, counted)

    def reset(self) -> None:
        self.calls = dict.fromkeys(self.calls, 0)


def test_second_compute_uses_the_journal(tmp_path: Path, journal: None) -> None:
    tree(tmp_path, {"a.txt": "1", "src/b.py": "2"})
    sf = StateFingerprint(tmp_path, ["."])
    first = sf.compute()
    assert sf.last_stats["mode"] == "walk" and sf.last_stats["journal"] == "on"
    assert sf.compute() == first
    assert sf.last_stats["mode"] == "journal"
    assert counts(sf) == {"files": 2, "hashed": 0, "stat_only": 2}
    write(tmp_path, "src/b.py", "changed")
    assert sf.compute() != first and sf.last_stats["mode"] == "journal"
    assert counts(sf) == {"files": 2, "hashed": 1, "stat_only": 1}


def test_journal_compute_stats_nothing_when_nothing_changed(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path, {f"d{i % 5}/f{i}.txt": str(i) for i in range(50)})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    calls = CountingCalls(monkeypatch, "stat", "lstat", "open", "scandir")
    sf.compute()
    assert sf.last_stats["mode"] == "journal"
    assert calls.calls == {"stat": 0, "lstat": 0, "open": 0, "scandir": 0}
    # One edit: that file alone is statted and read; no directory is listed.
    write(tmp_path, "d3/f8.txt", "edited")
    calls.reset()
    sf.compute()
    assert counts(sf) == {"files": 50, "hashed": 1, "stat_only": 49}
    assert calls.calls["stat"] == 1 and calls.calls["open"] == 1 and calls.calls["scandir"] == 0


def test_new_file_relists_only_its_directory(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path, {f"d{i % 5}/f{i}.txt": str(i) for i in range(50)})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    write(tmp_path, "d2/new.txt", "new")
    calls = CountingCalls(monkeypatch, "open", "scandir")
    value = sf.compute()
    assert sf.last_stats["mode"] == "journal"
    # One directory opened and listed, one file opened to be read.
    assert calls.calls == {"open": 2, "scandir": 1}
    assert value == walked(tmp_path).compute() and "d2/new.txt" in sf.files


def test_events_about_excluded_names_relist_nothing(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path, {"src/a.py": "1", "run.json": "{}"})
    sf = StateFingerprint(tmp_path, ["."], exclude=[str(tmp_path / "run.json")])
    before = sf.compute()
    # What a test run and the engine write every iteration.
    write(tmp_path, "src/__pycache__/a.cpython-311.pyc", "bytecode")
    write(tmp_path, ".pytest_cache/v/cache/lastfailed", "{}")
    write(tmp_path, ".coverage.host.1.2", "")
    write(tmp_path, "run.json", '{"iteration": 2}')
    calls = CountingCalls(monkeypatch, "scandir", "open", "stat")
    assert sf.compute() == before and sf.last_stats["mode"] == "journal"
    assert calls.calls == {"scandir": 0, "open": 0, "stat": 0}


def test_same_size_rewrite_with_old_mtime_and_ctime_ignored_is_seen_by_the_journal(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without ctime, a walk trusts an old file whose stat looks the same; the write
    # event marks it dirty whatever its stat says.
    monkeypatch.setattr(
        treehash, "stat_signature", lambda st: (st.st_size, st.st_mtime_ns, st.st_ino, 0, 0)
    )
    path = write(tmp_path, "a.txt", "aaaa")  # old: trusted once hashed
    st0 = path.stat()
    sf = StateFingerprint(tmp_path, ["."])
    before = sf.compute()
    with open(path, "r+b") as f:  # same inode, same size
        f.write(b"bbbb")
    os.utime(path, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    assert sf.compute() != before and sf.last_stats["mode"] == "journal"
    assert sf.compute() == walked(tmp_path).compute()


def test_hard_linked_file_changed_through_another_path(tmp_path: Path, journal: None) -> None:
    # A write through a link outside the watched tree raises no event in it.
    root, outside = tmp_path / "root", tmp_path / "outside"
    write(root, "a.txt", "one")
    outside.mkdir()
    os.link(root / "a.txt", outside / "same.txt")
    sf = StateFingerprint(root, ["."])
    before = sf.compute()
    with open(outside / "same.txt", "ab") as f:
        f.write(b" and more")
    assert sf.compute() != before and sf.last_stats["mode"] == "journal"
    assert sf.compute() == walked(root).compute()


def test_directory_rename_and_delete_and_new_subtree(tmp_path: Path, journal: None) -> None:
    tree(tmp_path, {"a/b/c.txt": "1", "a/d.txt": "2", "e/f.txt": "3"})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    steps = [
        lambda: os.rename(tmp_path / "a" / "b", tmp_path / "e" / "b2"),
        lambda: write(tmp_path, "e/b2/new.txt", "written into the moved directory"),
        lambda: shutil.rmtree(tmp_path / "a"),
        lambda: tree(tmp_path, {"a/x/y/z.txt": "deep", "a/x/w.txt": "w"}),
        lambda: os.rename(tmp_path / "a", tmp_path / "renamed"),
        lambda: write(tmp_path, "renamed/x/y/z.txt", "edited after the move"),
        lambda: os.rename(tmp_path / "renamed", tmp_path / "a"),
        lambda: write(tmp_path, "a/x/y/z.txt", "edited after moving back"),
    ]
    for step in steps:
        step()
        assert sf.compute() == walked(tmp_path).compute()
        assert sf.last_stats["mode"] == "journal"
    assert sf.files == ["a/x/w.txt", "a/x/y/z.txt", "e/b2/c.txt", "e/b2/new.txt", "e/f.txt"]


def test_directory_moved_out_and_back_in(tmp_path: Path, journal: None) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    tree(root, {"keep.txt": "k", "sub/x.txt": "1"})
    outside.mkdir()
    sf = StateFingerprint(root, ["."])
    sf.compute()
    os.rename(root / "sub", outside / "sub")
    assert sf.compute() == walked(root).compute() and sf.files == ["keep.txt"]
    write(outside, "sub/x.txt", "changed while outside")
    write(outside, "sub/y.txt", "new while outside")
    os.rename(outside / "sub", root / "sub")
    assert sf.compute() == walked(root).compute()
    assert sf.files == ["keep.txt", "sub/x.txt", "sub/y.txt"]
    assert sf.last_stats["mode"] == "journal"


def test_literal_patterns_see_paths_appear_and_disappear(tmp_path: Path, journal: None) -> None:
    patterns = ["src/pkg/b.py", "docs", "*.cfg"]
    sf = StateFingerprint(tmp_path, patterns)
    empty = sf.compute()
    for step in (
        lambda: write(tmp_path, "src/pkg/b.py", "b"),  # the parents appear with it
        lambda: write(tmp_path, "docs/index.md", "# docs"),
        lambda: write(tmp_path, "setup.cfg", "[x]"),
        lambda: shutil.rmtree(tmp_path / "src" / "pkg"),
        lambda: os.rename(tmp_path / "docs", tmp_path / "src" / "pkg"),  # not b.py
        lambda: (tmp_path / "docs").write_text("now a file"),
    ):
        step()
        assert sf.compute() == walked(tmp_path, patterns).compute()
        assert sf.last_stats["mode"] == "journal"
    assert sf.files == ["docs", "setup.cfg"]
    assert sf.compute() != empty


def test_every_nth_compute_walks(tmp_path: Path, journal: None) -> None:
    write(tmp_path, "a.txt")
    sf = StateFingerprint(tmp_path, ["."])
    seen = modes(sf, 2 * JOURNAL_REWALK_EVERY + 1)
    walks = [i for i, mode in enumerate(seen) if mode == "walk"]
    assert walks == [0, JOURNAL_REWALK_EVERY, 2 * JOURNAL_REWALK_EVERY]
    assert sf.last_stats["journal"] == "on"


# -- falling back


def test_no_inotify_walks_every_time(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fswatch, "_libc", lambda: "inotify is Linux only (this is testos)")
    tree(tmp_path, {"a.txt": "1"})
    sf = StateFingerprint(tmp_path, ["."])
    assert modes(sf, 3) == ["walk", "walk", "walk"]
    assert sf.last_stats["journal"] == "inotify is Linux only (this is testos)"
    write(tmp_path, "a.txt", "2")
    assert sf.compute() == walked(tmp_path).compute()


class FailingLibc:
    """inotify whose add_watch fails with ``err`` for every directory but the root."""

    def __init__(self, err: int) -> None:
        real = fswatch._libc()
        assert not isinstance(real, str)
        self.real, self.err, self.refused = real, err, 0

    def __call__(self) -> fswatch._Libc:
        def add_watch(fd: int, path: bytes, mask: int) -> int:
            if mask & fswatch.IN_DONT_FOLLOW:
                self.refused += 1
                ctypes.set_errno(self.err)
                return -1
            return self.real.add_watch(fd, path, mask)

        return fswatch._Libc(self.real.init1, add_watch, self.real.rm_watch)


@pytest.mark.parametrize(
    ("err", "needle"),
    [(errno.ENOSPC, "watch limit"), (errno.EACCES, "Permission denied")],
)
def test_a_refused_watch_means_walking_for_good(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch, err: int, needle: str
) -> None:
    tree(tmp_path, {"a.txt": "1", "sub/b.txt": "2"})
    libc = FailingLibc(err)
    monkeypatch.setattr(fswatch, "_libc", libc)
    fds = open_fds()
    sf = StateFingerprint(tmp_path, ["."])
    assert modes(sf, 3) == ["walk", "walk", "walk"]
    assert needle in str(sf.last_stats["journal"])
    assert libc.refused == 1  # tried once, then never again
    assert open_fds() == fds  # the journal's descriptor was released
    write(tmp_path, "sub/b.txt", "changed")
    assert sf.compute() == walked(tmp_path).compute()


def test_a_watch_refused_later_falls_back_then_rearms(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path, {"a.txt": "1"})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    # A new directory the journal cannot watch: this compute walks instead, and
    # (the limit still reached) stays walking.
    monkeypatch.setattr(fswatch, "_libc", FailingLibc(errno.ENOSPC))
    sf._journal._lib = fswatch._libc()  # the live journal hits the limit too
    write(tmp_path, "new/b.txt", "2")
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "walk" and "watch limit" in str(sf.last_stats["journal"])


def test_queue_overflow_walks_once_then_the_journal_resumes(
    tmp_path: Path, journal: None
) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 40_000:  # pragma: no cover - a large queue: too many files to make
        pytest.skip(f"max_queued_events is {limit}")
    write(tmp_path, "a.txt", "1")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    flood = tmp_path / "flood"
    flood.mkdir()
    sf.compute()  # now flood/ is watched too
    for i in range(limit // 2 + 10):  # create + close-write: two events each
        (flood / f"f{i}").touch()
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "walk" and sf.last_stats["journal"] == "on"
    write(tmp_path, "a.txt", "2")
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "journal"


def test_overflow_event_means_the_account_is_lost(tmp_path: Path, journal: None) -> None:
    j = fswatch.DirectoryJournal(str(tmp_path))
    try:
        j._read = lambda *_: struct.pack("iIII", -1, fswatch.IN_Q_OVERFLOW, 0, 0)
        with pytest.raises(fswatch.JournalLost, match="overflowed") as info:
            j.drain()
        assert not info.value.sticky
    finally:
        j.close()


def test_a_watch_dropped_behind_the_journals_back(tmp_path: Path, journal: None) -> None:
    tree(tmp_path, {"sub/a.txt": "1"})
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    j = sf._journal
    assert j is not None
    wd = j._wds[str(tmp_path / "sub")]
    j._lib.rm_watch(j._fd, wd)  # IN_IGNORED, and no delete to explain it
    write(tmp_path, "sub/a.txt", "2")
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "walk" and sf.last_stats["journal"] == "on"
    assert modes(sf, 1) == ["journal"]


def test_root_deleted_and_recreated(tmp_path: Path, journal: None) -> None:
    root = tmp_path / "root"
    write(root, "a.txt", "1")
    sf = StateFingerprint(root, ["."])
    sf.compute()
    shutil.rmtree(root)
    assert sf.compute() == walked(root).compute() and sf.files == []
    assert sf.last_stats["mode"] == "walk"
    assert "not a directory" in str(sf.last_stats["journal"])  # nothing to watch
    write(root, "b.txt", "2")
    assert modes(sf, 2) == ["walk", "journal"]  # re-armed once the root exists
    assert sf.compute() == walked(root).compute() and sf.files == ["b.txt"]


def test_root_moved_away(tmp_path: Path, journal: None) -> None:
    root = tmp_path / "root"
    write(root, "a.txt", "1")
    sf = StateFingerprint(root, ["."])
    sf.compute()
    os.rename(root, tmp_path / "elsewhere")
    write(root, "b.txt", "a new root at the old path")
    assert sf.compute() == walked(root).compute() and sf.files == ["b.txt"]
    assert sf.last_stats["mode"] == "walk"


def test_pattern_through_a_directory_link_walks(tmp_path: Path, journal: None) -> None:
    write(tmp_path, "real/x.py", "1")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    sf = StateFingerprint(tmp_path, ["alias"])
    assert modes(sf, 2) == ["walk", "walk"]
    assert "symbolic link to a directory" in str(sf.last_stats["journal"])
    write(tmp_path, "real/x.py", "2")
    assert sf.compute() == walked(tmp_path, ["alias"]).compute()


def test_literal_link_to_a_file_that_becomes_a_directory(tmp_path: Path, journal: None) -> None:
    write(tmp_path, "target", "a file")
    os.symlink("target", tmp_path / "link")
    sf = StateFingerprint(tmp_path, ["link"])
    sf.compute()
    assert modes(sf, 1) == ["journal"]
    (tmp_path / "target").unlink()
    write(tmp_path, "target/inner.txt", "now a directory")
    assert sf.compute() == walked(tmp_path, ["link"]).compute()
    assert sf.files == ["link/inner.txt"] and sf.last_stats["mode"] == "walk"


def test_pattern_outside_the_root_walks(tmp_path: Path, journal: None) -> None:
    root = tmp_path / "root"
    write(root, "a.txt")
    write(tmp_path, "sibling/s.txt", "1")
    sf = StateFingerprint(root, [".", "../sibling"])
    assert modes(sf, 2) == ["walk", "walk"]
    assert sf.last_stats["journal"] == "a pattern names paths outside the root"


def test_network_file_system_walks(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "a.txt")
    monkeypatch.setattr(fswatch, "_fs_types", lambda: {tmp_path.stat().st_dev: "nfs4"})
    sf = StateFingerprint(tmp_path, ["."])
    assert modes(sf, 2) == ["walk", "walk"]
    assert "nfs4" in str(sf.last_stats["journal"])


def test_fork_walks_rather_than_share_the_queue(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "a.txt", "1")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)  # as seen from a child
    write(tmp_path, "a.txt", "2")
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "walk"
    assert modes(sf, 1) == ["journal"]  # a journal of its own now


def test_interrupted_journal_compute_walks_next_time(
    tmp_path: Path, journal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "a.txt", "1")
    sf = StateFingerprint(tmp_path, ["."])
    sf.compute()
    write(tmp_path, "a.txt", "2")

    def interrupted(path: str, should_stop: object = None) -> treehash.CachedDigest | str:
        raise KeyboardInterrupt

    monkeypatch.setattr(treehash, "hash_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sf.compute()  # the event for a.txt was read, then lost
    monkeypatch.undo()
    assert sf.compute() == walked(tmp_path).compute()
    assert sf.last_stats["mode"] == "walk"


# -- the file descriptor


def test_close_and_context_manager_release_the_descriptor(tmp_path: Path, journal: None) -> None:
    write(tmp_path, "a.txt")
    fds = open_fds()
    with StateFingerprint(tmp_path, ["."]) as sf:
        value = sf.compute()
        assert open_fds() == fds + 1  # the journal holds one descriptor
    assert open_fds() == fds
    assert sf.compute() == value  # still usable: it walks
    assert sf.last_stats["mode"] == "walk" and sf.last_stats["journal"] == "closed"
    assert open_fds() == fds
    sf.close()  # idempotent


def test_dropped_fingerprints_leak_no_descriptors(tmp_path: Path, journal: None) -> None:
    tree(tmp_path, {"a.txt": "1", "sub/b.txt": "2"})
    fds = open_fds()
    gc.disable()  # reference counting alone must release them
    try:
        for _ in range(200):
            sf = StateFingerprint(tmp_path, ["."])
            sf.compute()
            sf.compute()
            assert sf.last_stats["journal"] == "on"  # never ran out of inotify instances
        del sf
    finally:
        gc.enable()
    assert open_fds() == fds


# -- equal to a walk, whatever happens


DIR_NAMES = ["a", "b", "src", "lib"]
FILE_NAMES = ["x.py", "y.txt", "z", "w.log"]
JOURNAL_PATTERNS = [".", "src", "**/*.py", "a/*", "src/x.py", "lib/**/z", "*.txt", "b/**"]


def _random_edit(root: Path, outside: Path, rng: random.Random) -> None:
    """One random change to the tree: what a revise step might do."""
    dirs = [d for d in root.rglob("*") if d.is_dir() and not d.is_symlink()]
    files = [f for f in root.rglob("*") if f.is_file() and not f.is_symlink()]

    def fresh_dir() -> Path:
        parent = rng.choice([root, *dirs])
        return parent / f"{rng.choice(DIR_NAMES)}{rng.randrange(3)}"

    def fresh_file() -> Path:
        parent = rng.choice([root, *dirs])
        return parent / f"{rng.randrange(3)}{rng.choice(FILE_NAMES)}"

    op = rng.choice(
        ["create", "create", "rewrite", "same_size", "same_size", "delete", "rename",
         "mkdir", "rename_dir", "rmtree", "move_out", "move_in", "symlink", "excluded"]
    )
    if op == "create" or (not files and op in ("rewrite", "same_size", "delete", "rename")):
        path = fresh_file()
        if not path.exists():
            path.write_bytes(os.urandom(rng.randrange(0, 40)))
    elif op == "rewrite":
        rng.choice(files).write_bytes(os.urandom(rng.randrange(0, 40)))
    elif op == "same_size":  # same inode, same size, the old mtime put back
        path = rng.choice(files)
        st0 = path.stat()
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.write(bytes((b + 1) % 256 for b in data))
        os.utime(path, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    elif op == "delete":
        rng.choice(files).unlink()
    elif op == "rename":
        target = fresh_file()
        if not target.exists():
            os.rename(rng.choice(files), target)
    elif op == "mkdir":
        new = fresh_dir()
        if not new.exists():
            new.mkdir()
            for name in rng.sample(FILE_NAMES, rng.randrange(1, 3)):
                write(new, name, os.urandom(8))
    elif op == "rename_dir" and dirs:
        source, target = rng.choice(dirs), fresh_dir()
        if not target.exists() and source not in target.parents and source != target:
            os.rename(source, target)
    elif op == "rmtree" and dirs:
        shutil.rmtree(rng.choice(dirs))
    elif op == "move_out" and dirs:
        target = outside / f"out{rng.randrange(10**6)}"
        os.rename(rng.choice(dirs), target)
    elif op == "move_in":
        away = [d for d in outside.iterdir() if d.is_dir()]
        target = fresh_dir()
        if away and not target.exists():
            os.rename(rng.choice(away), target)
    elif op == "symlink" and files:
        link = fresh_file().with_name(f"ln{rng.randrange(10**6)}")
        os.symlink(rng.choice([*files, *dirs, root / "missing"]), link)
    elif op == "excluded":
        write(rng.choice([root, *dirs]), "__pycache__/m.pyc", os.urandom(4), old=False)


def _check_journal_against_walks(seed: int, patterns: list[str], batches: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "root", Path(tmp) / "outside"
        outside.mkdir()
        tree(root, {"src/x.py": "1", "a/y.txt": "2", "lib/deep/z": "3", "b/w.log": "4"})
        with StateFingerprint(root, patterns, exclude=["*.log"]) as sf:
            sf.compute()
            for step in range(batches):
                for _ in range(rng.randrange(1, 4)):
                    _random_edit(root, outside, rng)
                value = sf.compute()
                reference = walked(root, patterns, exclude=["*.log"])
                assert (value, sf.files) == (reference.compute(), reference.files), (
                    f"seed {seed}, step {step}"
                )
                if step + 1 < JOURNAL_REWALK_EVERY:
                    assert sf.last_stats["mode"] == "journal", sf.last_stats


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32),
    patterns=st.lists(st.sampled_from(JOURNAL_PATTERNS), min_size=1, max_size=3, unique=True),
)
def test_journal_equals_a_fresh_walk_after_random_edits(journal: None, seed, patterns) -> None:
    _check_journal_against_walks(seed, patterns, batches=8)


def test_journal_equals_a_fresh_walk_over_a_long_run(journal: None) -> None:
    # Long enough to cross a periodic walk and re-arm.
    _check_journal_against_walks(12345, [".", "src/x.py"], batches=JOURNAL_REWALK_EVERY + 8)


# -- the journal on its own


def test_journal_reports_changes_by_path(tmp_path: Path, journal: None) -> None:
    tree(tmp_path, {"sub/a.txt": "1", "sub/b.txt": "2", "keep/c.txt": "3"})
    j = fswatch.DirectoryJournal(str(tmp_path))
    try:
        root, sub = str(tmp_path), str(tmp_path / "sub")
        assert j.watch(sub) and j.watch(str(tmp_path / "keep")) and j.watch_count == 3
        assert j.drain() == fswatch.Changes(set(), set(), set())
        write(tmp_path, "sub/a.txt", "changed")
        (tmp_path / "sub" / "b.txt").unlink()
        changes = j.drain()
        assert changes.touched == {sub + "/a.txt", sub + "/b.txt"}
        assert changes.relisted == {sub} and changes.gone == set()
        os.rename(tmp_path / "sub", tmp_path / "moved")
        changes = j.drain()
        assert changes.relisted == {root} and sub in changes.gone
        assert not j.is_watched(sub) and j.watch_count == 2
        assert j.watch(str(tmp_path / "moved"))  # a fresh watch, not the stale one
        assert j.drain(ignore=lambda path, name: name == "skip.txt").touched == set()
        write(tmp_path, "keep/skip.txt", "ignored")
        assert j.drain(ignore=lambda path, name: name == "skip.txt").touched == set()
    finally:
        j.close()
    assert j.closed
    j.close()
    with pytest.raises(fswatch.JournalLost, match="closed"):
        j.drain()


def test_journal_watch_refuses_files_links_and_missing_paths(
    tmp_path: Path, journal: None
) -> None:
    write(tmp_path, "real/x", "1")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    j = fswatch.DirectoryJournal(str(tmp_path))
    try:
        assert j.watch(str(tmp_path / "real"))
        assert not j.watch(str(tmp_path / "real" / "x"))
        assert not j.watch(str(tmp_path / "alias"))  # never through a link
        assert not j.watch(str(tmp_path / "missing"))
    finally:
        j.close()


def test_journal_refuses_one_directory_under_two_paths(tmp_path: Path, journal: None) -> None:
    (tmp_path / "a").mkdir()
    j = fswatch.DirectoryJournal(str(tmp_path))
    try:
        assert j.watch(str(tmp_path / "a"))
        os.rename(tmp_path / "a", tmp_path / "b")  # not drained yet
        with pytest.raises(fswatch.JournalLost, match="same directory"):
            j.watch(str(tmp_path / "b"))
    finally:
        j.close()


def test_journal_needs_a_directory_root(tmp_path: Path, journal: None) -> None:
    with pytest.raises(fswatch.JournalLost, match="not a directory") as info:
        fswatch.DirectoryJournal(str(tmp_path / "missing"))
    assert not info.value.sticky


def test_parse_events() -> None:
    name = b"a.txt\0\0\0"
    data = struct.pack("iIII", 3, fswatch.IN_MODIFY, 0, len(name)) + name
    data += struct.pack("iIII", 4, fswatch.IN_DELETE_SELF, 0, 0)
    assert list(fswatch.parse_events(data)) == [
        (3, fswatch.IN_MODIFY, "a.txt"),
        (4, fswatch.IN_DELETE_SELF, ""),
    ]
    with pytest.raises(fswatch.JournalLost, match="truncated"):
        list(fswatch.parse_events(data[:-3]))
    with pytest.raises(fswatch.JournalLost, match="truncated"):
        list(fswatch.parse_events(struct.pack("iIII", 3, 2, 0, 16) + b"short"))


def test_within() -> None:
    assert fswatch.within("/r/a/b", {"/r/a"}) and fswatch.within("/r/a", {"/r/a"})
    assert not fswatch.within("/r/ab", {"/r/a"}) and not fswatch.within("/r", {"/r/a"})


def test_remote_file_systems_are_recognised() -> None:
    for fs_type in ("nfs", "nfs4", "cifs", "9p", "fuse.sshfs", "virtiofs"):
        assert fswatch._is_remote(fs_type)
    for fs_type in ("ext4", "xfs", "btrfs", "tmpfs", "overlay"):
        assert not fswatch._is_remote(fs_type)
    types = fswatch._fs_types()
    if Path("/proc/self/mountinfo").exists():
        assert types.get(os.stat("/").st_dev)  # the root file system is listed


# ------------------------------------------------------ failure signatures

PYTEST_RUN = """\
============================= test session starts ==============================
platform linux -- Python 3.11.7, pytest-9.2.0, pluggy-1.6.0
rootdir: {tmp}
plugins: xdist-3.6.1, hypothesis-6.100.0
collected 3 items

test_calc.py F.F                                                         [100%]

=================================== FAILURES ===================================
___________________________________ test_add ___________________________________

    def test_add():
>       assert add(2, 2) == {expected}
E       assert {got} == {expected}
E        +  where {got} = add(2, 2)

test_calc.py:{line}: AssertionError
_________________________________ test_object __________________________________

    def test_object():
>       assert make() is None
E       assert <calc.Thing object at {addr}> is None
E        +  where <calc.Thing object at {addr}> = make()

test_calc.py:{line2}: AssertionError
=========================== short test summary info ============================
FAILED test_calc.py::test_add - assert {got} == {expected}
FAILED test_calc.py::test_object - assert <calc.Thing object at {addr}> is None
========================= 2 failed, 1 passed in {secs}s =========================
"""

COMMAND_RUN = """\
{stamp} INFO starting worker pid={pid}
Traceback (most recent call last):
  File "{tmp}/job.py", line {line}, in <module>
    main()
  File "{tmp}/job.py", line {line2}, in main
    raise ValueError(f"bad value {{v!r}} in {{path}}")
ValueError: bad value {got} in {tmp}/input.csv
Command exited after {secs} seconds
"""

DEFAULTS = dict(
    tmp="/tmp/pytest-of-root/pytest-1/test_calc0",
    expected=4,
    got=5,
    line=7,
    line2=12,
    addr="0x7f3a2c1b9d50",
    secs="0.12",
    stamp="2024-05-01 10:11:12,345",
    pid=4242,
)

names = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=12)
temp_paths = st.one_of(
    st.builds(
        "{}/pytest-of-{}/pytest-{}/{}{}{}".format,
        st.sampled_from(["/tmp", "/var/tmp", "/private/var/folders/x1/abc_d/T"]),
        st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
        st.integers(0, 9999),
        st.sampled_from(["", "popen-gw0/", "popen-gw13/"]),
        names.map(lambda n: "test_" + n),
        st.integers(0, 99),
    ),
    st.builds(
        "{}/tmp{}".format,
        st.sampled_from(["/tmp", "/var/tmp"]),
        st.text(alphabet=string.ascii_lowercase + string.digits + "_", min_size=8, max_size=8),
    ),
)
noise = st.fixed_dictionaries(
    {
        "tmp": temp_paths,
        "line": st.integers(1, 10**6),
        "line2": st.integers(1, 10**6),
        "addr": st.integers(0x1000, 2**48).map(hex),
        "secs": st.floats(0, 10_000, allow_nan=False).map(lambda f: f"{f:.2f}"),
        "stamp": st.datetimes().map(lambda d: d.isoformat(sep=" ", timespec="milliseconds")),
        "pid": st.integers(1, 4_194_304),
    }
)


def render(template: str, **changes) -> str:
    return template.format(**{**DEFAULTS, **changes})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(noise)
def test_pytest_signature_ignores_run_to_run_noise(variation) -> None:
    baseline = failure_signature(render(PYTEST_RUN), kind="pytest")
    assert failure_signature(render(PYTEST_RUN, **variation), kind="pytest") == baseline


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(noise)
def test_command_signature_ignores_run_to_run_noise(variation) -> None:
    baseline = failure_signature(render(COMMAND_RUN))
    assert failure_signature(render(COMMAND_RUN, **variation)) == baseline
    # Same for pytest-shaped output under the generic rule.
    assert failure_signature(render(PYTEST_RUN, **variation)) == failure_signature(
        render(PYTEST_RUN)
    )


@settings(max_examples=100, deadline=None)
@given(st.integers(-1000, 1000), st.integers(-1000, 1000))
def test_different_assertion_values_give_different_signatures(a: int, b: int) -> None:
    same = failure_signature(render(PYTEST_RUN, got=a), kind="pytest") == failure_signature(
        render(PYTEST_RUN, got=b), kind="pytest"
    )
    assert same == (a == b)
    same_cmd = failure_signature(render(COMMAND_RUN, got=a)) == failure_signature(
        render(COMMAND_RUN, got=b)
    )
    assert same_cmd == (a == b)


def test_signature_format() -> None:
    assert SIG.match(failure_signature(render(PYTEST_RUN), kind="pytest"))
    assert SIG.match(failure_signature(""))


def test_pytest_normalized_text_lists_nodes_and_messages() -> None:
    text = normalize_failure(render(PYTEST_RUN), kind="pytest")
    assert "FAILED test_calc.py::test_add - assert 5 == 4" in text.splitlines()
    assert "test_add: assert 5 == 4 | +  where 5 = add(2, 2)" in text.splitlines()
    assert "0x7f3a2c1b9d50" not in text and "0x?" in text
    assert "passed in" not in text and "/tmp" not in text
    assert text.splitlines() == sorted(text.splitlines())


def test_pytest_signature_ignores_failure_order() -> None:
    run = render(PYTEST_RUN)
    head, rest = run.split("___________________________________ test_add", 1)
    add_section, tail = rest.split("_________________________________ test_object", 1)
    object_section, summary = tail.split("=========================== short test summary", 1)
    summary_lines = summary.splitlines()
    swapped = (
        head
        + "_________________________________ test_object"
        + object_section
        + "___________________________________ test_add"
        + add_section
        + "=========================== short test summary"
        + "\n".join([summary_lines[0], summary_lines[2], summary_lines[1], *summary_lines[3:]])
    )
    assert swapped != run
    assert failure_signature(swapped, kind="pytest") == failure_signature(run, kind="pytest")


def test_pytest_signature_changes_with_the_failing_node() -> None:
    run = render(PYTEST_RUN)
    other = run.replace("test_calc.py::test_add", "test_calc.py::test_sub")
    assert failure_signature(other, kind="pytest") != failure_signature(run, kind="pytest")


def test_pytest_short_summary_alone_is_enough() -> None:
    quiet = "FAILED t.py::test_a - ValueError: x\n1 failed in 0.01s\n"
    assert normalize_failure(quiet, kind="pytest") == "FAILED t.py::test_a - ValueError: x"
    errored = "ERROR t.py::test_b - fixture 'db' not found\n1 error in 3.50s\n"
    assert normalize_failure(errored, kind="pytest") == "ERROR t.py::test_b - fixture 'db' not found"


def test_pytest_kind_falls_back_to_the_tail_when_nothing_failed_by_name() -> None:
    crash = "ERROR: usage: pytest [options]\npytest: error: unrecognized arguments: --nope\n"
    assert normalize_failure(crash, kind="pytest") == normalize_failure(crash)
    assert normalize_failure(crash, kind="pytest") != ""


def test_check_kind_enum_is_accepted() -> None:
    run = render(PYTEST_RUN)
    assert failure_signature(run, kind=CheckKind.PYTEST) == failure_signature(run, kind="pytest")
    assert failure_signature(run, kind=CheckKind.COMMAND) == failure_signature(run)


def test_command_signature_uses_only_the_last_40_lines() -> None:
    lines = [f"line {i} output" for i in range(100)]
    base = failure_signature("\n".join(lines))
    early = list(lines)
    early[10] = "something else entirely"
    assert failure_signature("\n".join(early)) == base
    late = list(lines)
    late[-1] = "something else entirely"
    assert failure_signature("\n".join(late)) != base
    assert len(normalize_failure("\n".join(lines)).splitlines()) == 40


def test_colours_line_endings_and_bytes_do_not_matter() -> None:
    plain = "E   assert 1 == 2\nFAILED t.py::test_a - assert 1 == 2\n"
    coloured = "\x1b[31mE   assert 1 == 2\x1b[0m\r\n\x1b[1;31mFAILED\x1b[0m t.py::test_a - assert 1 == 2\r\n"
    assert failure_signature(coloured) == failure_signature(plain)
    assert failure_signature(plain.encode()) == failure_signature(plain)


@pytest.mark.parametrize(
    ("noisy", "quiet"),
    [
        ("error in app.py:120:7", "error in app.py:9:1"),
        ('File "x.py", line 88, in f', 'File "x.py", line 3, in f'),
        ("<Obj at 0x7ffe12345678>", "<Obj at 0x1>"),
        ("1 failed in 0.12s", "1 failed in 31.50s"),
        ("took 1.23 seconds", "took 10 seconds"),
        ("took 150ms", "took 3 ms"),
        ("at 2024-01-01T12:00:00Z", "at 1999-12-31 23:59:59.999+02:00"),
        ("elapsed 00:01:02", "elapsed 12:34:56"),
        ("worker pid 1234 died", "worker pid 99 died"),
        ("worker pid=1234 died", "worker pid=5 died"),
        ("Using --randomly-seed=123", "Using --randomly-seed=987654"),
        ("[gw0] node down", "[gw12] node down"),
        ("open /tmp/tmpa1b2c3d4/in.txt", "open /tmp/tmpzzzzzzzz/in.txt"),
        (
            "at /tmp/pytest-of-root/pytest-3/test_x0/f.txt",
            "at /tmp/pytest-of-ci/pytest-45/popen-gw1/test_x12/f.txt",
        ),
    ],
)
def test_normalization_cases(noisy: str, quiet: str) -> None:
    assert normalize_failure(noisy) == normalize_failure(quiet)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("assert 1 == 2", "assert 1 == 3"),
        ("open /tmp/tmpa1b2c3d4/in.txt", "open /tmp/tmpa1b2c3d4/out.txt"),
        ("KeyError: 'alpha'", "KeyError: 'beta'"),
        ("error in app.py:12", "error in lib.py:12"),
        ("3 failed", "4 failed"),
        ("/tmpfoo/x", "/tmpbar/x"),
    ],
)
def test_normalization_keeps_what_matters(a: str, b: str) -> None:
    assert failure_signature(a) != failure_signature(b)


@pytest.mark.parametrize(
    "blob",
    ["a/" * 100_000, "x" * 200_000, "1" * 200_000, "a." * 100_000, "aError." * 30_000],
    ids=["slashes", "word", "digits", "dots", "errors"],
)
def test_long_lines_without_spaces_cost_linear_time(blob: str) -> None:
    # A backtracking pattern would take minutes on these; the bound is generous.
    start = time.monotonic()
    normalize_failure(blob)
    normalize_failure(blob, kind="pytest")
    first_meaningful_line(blob)
    assert time.monotonic() - start < 20


# ------------------------------------------------------ first meaningful line


def test_first_meaningful_line_empty() -> None:
    assert first_meaningful_line("") == ""
    assert first_meaningful_line("  \n\n \t\n") == ""


def test_first_meaningful_line_prefers_pytest_e_lines() -> None:
    assert first_meaningful_line(render(PYTEST_RUN)) == "assert 5 == 4"
    out = "ImportError: early noise\n____ test_a ____\nE       ValueError: bad input\n"
    assert first_meaningful_line(out) == "ValueError: bad input"


def test_first_meaningful_line_failed_summary() -> None:
    out = "test_a.py F\n\nFAILED test_a.py::test_a - assert 1 == 2\n1 failed in 0.01s\n"
    assert first_meaningful_line(out) == "FAILED test_a.py::test_a - assert 1 == 2"


def test_first_meaningful_line_python_traceback() -> None:
    out = render(COMMAND_RUN)
    assert first_meaningful_line(out) == "ValueError: bad value 5 in /tmp/pytest-of-root/pytest-1/test_calc0/input.csv"


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("running\nAssertionError\ndone\n", "AssertionError"),
        ("compiling\nerror: pathspec 'x' did not match\n", "error: pathspec 'x' did not match"),
        ("error[E0308]: mismatched types\n", "error[E0308]: mismatched types"),
        ("ok\nsubprocess.CalledProcessError: exit 2\n", "subprocess.CalledProcessError: exit 2"),
        ("building\n\nexit status 3\n\n", "exit status 3"),
        ("\x1b[31m   coloured failure   \x1b[0m\n", "coloured failure"),
    ],
)
def test_first_meaningful_line_cases(out: str, expected: str) -> None:
    assert first_meaningful_line(out) == expected


def test_first_meaningful_line_is_at_most_200_characters() -> None:
    line = first_meaningful_line("ValueError: " + "x" * 500)
    assert len(line) == 200 and line.startswith("ValueError: x") and line.endswith("...")
    assert len(first_meaningful_line("y" * 200)) == 200


# -- one way to hash a file


def test_a_file_has_one_digest_wherever_it_is_hashed(tmp_path: Path) -> None:
    # The state fingerprint, a check's output digest and the impact map's snapshot
    # all hash a file the one way treehash does.
    from pytest_loops.core.checks import digest_file
    from pytest_loops.localization.impact import _snapshot

    path = write(tmp_path, "a.txt", "hello")
    expected = hashlib.sha256(b"hello").hexdigest()
    cached = treehash.hash_file(str(path))
    assert isinstance(cached, treehash.CachedDigest) and cached.digest == expected
    assert treehash.file_digest(path) == expected
    assert digest_file(str(path)) == "sha256:" + expected
    assert digest_file(None, "hello") == "sha256:" + expected
    assert _snapshot(str(tmp_path), ())["a.txt"][0] == expected
    text = f"a.txt\0{expected}\n".encode()
    assert StateFingerprint(tmp_path, ["."]).compute() == (
        "sha256:" + hashlib.sha256(b"pytest-loops.state/1\n" + text).hexdigest()
    )
