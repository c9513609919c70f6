"""Fault localization on seeded bugs: is the bug line among the top 5 suspects?

Writes small projects, each with one seeded bug of a common kind (off-by-one,
wrong operator, wrong constant, missing branch, swapped arguments, wrong
comparison, wrong variable, wrong initial value, missing call, wrong index,
misplaced return, and/or mix-up, wrong attribute in a method), several passing
tests and a few failing ones. For each it runs ONE pytest process under per-test
coverage (``collect_spectra``), ranks lines by Ochiai (``rank_suspects``) and
prints the bug line's rank, the span of lines tied with it, and the top-5 hit
count. Goal: the bug line is in the top 5 for at least 8 of 10 projects.
It also checks what the revise step's prompt makes of it: whether the function
holding the bug is named in the prompt's suspect lines (``file.py:9 in f()``),
and where it ranks among the suspect functions.

The bug line is the line marked ``# BUG`` below (the marker is removed before the
project is written). For a missing branch it is the line that runs instead of
the missing code.

Usage: python benchmarks/bench_localize.py [--keep DIR] [--json FILE]
Always exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_loops.localization import suspects as suspects_module  # noqa: E402
from pytest_loops.localization.scopes import scope_of  # noqa: E402
from pytest_loops.localization.spectra import collect_spectra  # noqa: E402
from pytest_loops.localization.suspects import format_suspects, rank_suspects  # noqa: E402

PROMPT_TOP = 10  # suspect lines in the prompt

MARKER = "# BUG"


@dataclass(frozen=True)
class Seeded:
    name: str
    kind: str
    files: dict[str, str]


def _d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


PROJECTS = [
    Seeded("pages", "off-by-one", {
        "pages.py": _d('''
            def page_count(total, per_page):
                if per_page <= 0:
                    raise ValueError("per_page must be positive")
                full, rest = divmod(total, per_page)
                return full + (1 if rest else 0)


            def page(items, number, per_page):
                if number < 1:
                    raise ValueError("pages start at 1")
                start = (number - 1) * per_page
                end = start + per_page - 1  # BUG
                return items[start:end]


            def page_label(number, pages):
                return f"page {number} of {pages}"
            '''),
        "tests/test_pages.py": _d('''
            import pytest
            from pages import page, page_count, page_label

            ITEMS = list(range(1, 8))

            def test_count_exact():
                assert page_count(6, 3) == 2

            def test_count_rest():
                assert page_count(7, 3) == 3

            def test_count_rejects_zero():
                with pytest.raises(ValueError):
                    page_count(7, 0)

            def test_last_partial_page():
                assert page(ITEMS, 3, 3) == [7]

            def test_page_before_first():
                with pytest.raises(ValueError):
                    page(ITEMS, 0, 3)

            def test_label():
                assert page_label(2, 3) == "page 2 of 3"

            def test_first_page():
                assert page(ITEMS, 1, 3) == [1, 2, 3]

            def test_middle_page():
                assert page(ITEMS, 2, 3) == [4, 5, 6]
            '''),
    }),
    Seeded("pricing", "wrong operator", {
        "pricing.py": _d('''
            TAX = 0.2


            def subtotal(lines):
                return sum(qty * price for qty, price in lines)


            def apply_discount(amount, percent):
                if percent <= 0:
                    return amount
                if percent >= 100:
                    return 0.0
                return amount * (1 + percent / 100)  # BUG


            def total(lines, percent=0):
                net = apply_discount(subtotal(lines), percent)
                return round(net * (1 + TAX), 2)
            '''),
        "tests/test_pricing.py": _d('''
            from pricing import apply_discount, subtotal, total

            LINES = [(2, 5.0), (1, 10.0)]

            def test_subtotal():
                assert subtotal(LINES) == 20.0

            def test_subtotal_empty():
                assert subtotal([]) == 0

            def test_no_discount():
                assert apply_discount(20.0, 0) == 20.0

            def test_full_discount():
                assert apply_discount(20.0, 100) == 0.0

            def test_total_plain():
                assert total(LINES) == 24.0

            def test_ten_percent():
                assert apply_discount(20.0, 10) == 18.0

            def test_total_with_discount():
                assert total(LINES, 50) == 12.0
            '''),
    }),
    Seeded("temperature", "wrong constant", {
        "temperature.py": _d('''
            def c_to_f(celsius):
                return celsius * 9 / 5 + 23  # BUG


            def f_to_c(fahrenheit):
                return (fahrenheit - 32) * 5 / 9


            def is_hot(celsius):
                return c_to_f(celsius) > 86


            def describe(celsius):
                if celsius < 0:
                    return "freezing"
                if is_hot(celsius):
                    return "hot"
                return "mild"
            '''),
        "tests/test_temperature.py": _d('''
            from temperature import c_to_f, describe, f_to_c, is_hot

            def test_f_to_c_boiling():
                assert f_to_c(212) == 100

            def test_f_to_c_freezing():
                assert f_to_c(32) == 0

            def test_describe_freezing():
                assert describe(-5) == "freezing"

            def test_describe_hot():
                assert describe(40) == "hot"

            def test_describe_mild():
                assert describe(15) == "mild"

            def test_is_hot():
                assert is_hot(45)

            def test_c_to_f_freezing():
                assert c_to_f(0) == 32

            def test_c_to_f_boiling():
                assert c_to_f(100) == 212
            '''),
    }),
    Seeded("calendar_utils", "missing branch", {
        "calendar_utils.py": _d('''
            DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


            def is_leap(year):
                if year % 100 == 0:
                    return False  # BUG
                return year % 4 == 0


            def days_in_month(year, month):
                if not 1 <= month <= 12:
                    raise ValueError(month)
                if month == 2 and is_leap(year):
                    return 29
                return DAYS[month - 1]


            def days_in_year(year):
                return 366 if is_leap(year) else 365
            '''),
        "tests/test_calendar_utils.py": _d('''
            import pytest
            from calendar_utils import days_in_month, days_in_year, is_leap

            def test_common_year():
                assert not is_leap(2023)

            def test_leap_year():
                assert is_leap(2024)

            def test_century():
                assert not is_leap(1900)

            def test_january():
                assert days_in_month(2023, 1) == 31

            def test_bad_month():
                with pytest.raises(ValueError):
                    days_in_month(2023, 13)

            def test_year_1900():
                assert days_in_year(1900) == 365

            def test_year_2000():
                assert is_leap(2000)

            def test_february_2000():
                assert days_in_month(2000, 2) == 29
            '''),
    }),
    Seeded("progress", "swapped arguments", {
        "progress.py": _d('''
            def clamp(value, low, high):
                return max(low, min(value, high))


            def percent(part, whole):
                if whole == 0:
                    return 0.0
                return 100.0 * part / whole


            def progress(done, total):
                value = percent(total, done)  # BUG
                return f"{clamp(value, 0, 100):.0f}%"


            def bar(done, total, width=10):
                filled = round(width * clamp(done / total if total else 0, 0, 1))
                return "#" * filled + "." * (width - filled)
            '''),
        "tests/test_progress.py": _d('''
            from progress import bar, clamp, percent, progress

            def test_clamp():
                assert clamp(5, 0, 3) == 3

            def test_percent():
                assert percent(1, 4) == 25.0

            def test_percent_of_nothing():
                assert percent(3, 0) == 0.0

            def test_progress_done():
                assert progress(5, 5) == "100%"

            def test_bar():
                assert bar(5, 10) == "#####....."

            def test_progress_quarter():
                assert progress(1, 4) == "25%"

            def test_progress_most():
                assert progress(3, 4) == "75%"
            '''),
    }),
    Seeded("grades", "wrong comparison", {
        "grades.py": _d('''
            def grade(score):
                if not 0 <= score <= 100:
                    raise ValueError(score)
                if score >= 90:
                    return "A"
                if score >= 80:
                    return "B"
                if score > 70:  # BUG
                    return "C"
                return "F"


            def report(scores):
                return {name: grade(score) for name, score in sorted(scores.items())}
            '''),
        "tests/test_grades.py": _d('''
            import pytest
            from grades import grade, report

            def test_a():
                assert grade(95) == "A"

            def test_b():
                assert grade(85) == "B"

            def test_c():
                assert grade(75) == "C"

            def test_f():
                assert grade(50) == "F"

            def test_out_of_range():
                with pytest.raises(ValueError):
                    grade(101)

            def test_report():
                assert report({"ann": 91, "bob": 60}) == {"ann": "A", "bob": "F"}

            def test_c_boundary():
                assert grade(70) == "C"

            def test_report_boundary():
                assert report({"cy": 70}) == {"cy": "C"}
            '''),
    }),
    Seeded("bounds", "wrong variable", {
        "bounds.py": _d('''
            def bounds(values):
                if not values:
                    raise ValueError("no values")
                lo = hi = values[0]
                for v in values[1:]:
                    if v < lo:
                        lo = v
                    if v > hi:
                        lo = v  # BUG
                return lo, hi


            def spread(values):
                lo, hi = bounds(values)
                return hi - lo


            def mean(values):
                return sum(values) / len(values)
            '''),
        "tests/test_bounds.py": _d('''
            import pytest
            from bounds import bounds, mean, spread

            def test_single():
                assert bounds([4]) == (4, 4)

            def test_descending():
                assert bounds([3, 2, 1]) == (1, 3)

            def test_empty():
                with pytest.raises(ValueError):
                    bounds([])

            def test_mean():
                assert mean([1, 2, 3]) == 2

            def test_ascending():
                assert bounds([1, 5]) == (1, 5)

            def test_spread():
                assert spread([2, 9, 4]) == 7
            '''),
    }),
    Seeded("weather", "wrong initial value", {
        "weather.py": _d('''
            def longest_word(text):
                best = ""
                for word in text.split():
                    if len(word) > len(best):
                        best = word
                return best


            def max_reading(readings):
                if not readings:
                    return None
                best = 0  # BUG
                for r in readings:
                    if r > best:
                        best = r
                return best


            def summary(readings):
                top = max_reading(readings)
                return "no data" if top is None else f"max {top}"
            '''),
        "tests/test_weather.py": _d('''
            from weather import longest_word, max_reading, summary

            def test_longest_word():
                assert longest_word("a bb ccc dd") == "ccc"

            def test_max_positive():
                assert max_reading([3, 7, 5]) == 7

            def test_max_empty():
                assert max_reading([]) is None

            def test_summary_empty():
                assert summary([]) == "no data"

            def test_summary():
                assert summary([1, 4]) == "max 4"

            def test_max_negative():
                assert max_reading([-5, -2, -9]) == -2

            def test_summary_cold():
                assert summary([-3, -8]) == "max -3"
            '''),
    }),
    Seeded("slugs", "missing call", {
        "slugs.py": _d('''
            import re

            WORD = re.compile(r"[A-Za-z0-9]+")


            def slugify(title, limit=40):
                words = WORD.findall(title)
                slug = "-".join(words)  # BUG
                return slug[:limit].rstrip("-")


            def unique_slug(title, taken):
                base = slugify(title)
                slug, n = base, 2
                while slug in taken:
                    slug = f"{base}-{n}"
                    n += 1
                return slug
            '''),
        "tests/test_slugs.py": _d('''
            from slugs import slugify, unique_slug

            def test_plain():
                assert slugify("hello world") == "hello-world"

            def test_punctuation():
                assert slugify("a, b; c") == "a-b-c"

            def test_limit():
                assert slugify("abc def", limit=4) == "abc"

            def test_unique():
                assert unique_slug("post", {"post"}) == "post-2"

            def test_capitals():
                assert slugify("Hello World") == "hello-world"

            def test_unique_capitals():
                assert unique_slug("My Post", {"my-post"}) == "my-post-2"
            '''),
    }),
    Seeded("median", "wrong index", {
        "median.py": _d('''
            def median(values):
                if not values:
                    raise ValueError("median of nothing")
                ordered = sorted(values)
                n = len(ordered)
                mid = n // 2
                if n % 2:
                    return ordered[mid]
                return (ordered[mid] + ordered[mid + 1]) / 2  # BUG


            def quartiles(values):
                ordered = sorted(values)
                half = len(ordered) // 2
                return median(ordered[:half]), median(ordered), median(ordered[-half:])
            '''),
        "tests/test_median.py": _d('''
            import pytest
            from median import median, quartiles

            def test_odd():
                assert median([3, 1, 2]) == 2

            def test_single():
                assert median([5]) == 5

            def test_empty():
                with pytest.raises(ValueError):
                    median([])

            def test_quartiles_odd():
                assert quartiles([1, 2, 3, 4, 5, 6, 7]) == (2, 4, 6)

            def test_even():
                assert median([4, 1, 3, 2]) == 2.5

            def test_pair():
                assert median([1, 3]) == 2
            '''),
    }),
    Seeded("search", "misplaced return", {
        "search.py": _d('''
            def find_all(items, predicate):
                found = []
                for item in items:
                    if predicate(item):
                        found.append(item)
                        return found  # BUG
                return found


            def first(items, predicate, default=None):
                for item in items:
                    if predicate(item):
                        return item
                return default


            def count(items, predicate):
                return len(find_all(items, predicate))
            '''),
        "tests/test_search.py": _d('''
            from search import count, find_all, first

            def even(n):
                return n % 2 == 0

            def test_first():
                assert first([1, 3, 4, 6], even) == 4

            def test_first_default():
                assert first([1, 3], even, "none") == "none"

            def test_find_none():
                assert find_all([1, 3, 5], even) == []

            def test_find_one():
                assert find_all([1, 2, 3], even) == [2]

            def test_find_many():
                assert find_all([2, 3, 4, 6], even) == [2, 4, 6]

            def test_count():
                assert count(range(10), even) == 5
            '''),
    }),
    Seeded("accounts", "and/or mix-up", {
        "accounts.py": _d('''
            RESERVED = {"admin", "root"}


            def valid_username(name):
                if name.lower() in RESERVED:
                    return False
                return 3 <= len(name) <= 16 or name.isalnum()  # BUG


            def normalize(name):
                return name.strip().lower()


            def register(users, name):
                name = normalize(name)
                if not valid_username(name) or name in users:
                    return False
                users.add(name)
                return True
            '''),
        "tests/test_accounts.py": _d('''
            from accounts import normalize, register, valid_username

            def test_normal():
                assert valid_username("alice")

            def test_reserved():
                assert not valid_username("Admin")

            def test_normalize():
                assert normalize("  Bob ") == "bob"

            def test_register():
                users = set()
                assert register(users, "carol") and users == {"carol"}

            def test_register_twice():
                assert not register({"dave"}, "Dave")

            def test_too_short():
                assert not valid_username("ab")

            def test_symbols():
                assert not valid_username("bad name!")
            '''),
    }),
    Seeded("inventory", "wrong attribute in a method", {
        "inventory.py": _d('''
            class Inventory:
                def __init__(self):
                    self.stock = {}
                    self.reserved = {}

                def add(self, sku, qty):
                    self.stock[sku] = self.stock.get(sku, 0) + qty

                def reserve(self, sku, qty):
                    if self.available(sku) < qty:
                        raise ValueError(f"not enough {sku}")
                    self.reserved[sku] = self.reserved.get(sku, 0) + qty

                def available(self, sku):
                    return self.stock.get(sku, 0) - self.reserved.get(sku, 0)

                def release(self, sku, qty):
                    held = self.reserved.get(sku, 0)
                    self.stock[sku] = max(0, held - qty)  # BUG
            '''),
        "tests/test_inventory.py": _d('''
            import pytest
            from inventory import Inventory

            @pytest.fixture
            def inv():
                inv = Inventory()
                inv.add("apple", 10)
                return inv

            def test_add(inv):
                assert inv.available("apple") == 10

            def test_reserve(inv):
                inv.reserve("apple", 4)
                assert inv.available("apple") == 6

            def test_reserve_too_much(inv):
                with pytest.raises(ValueError):
                    inv.reserve("apple", 11)

            def test_unknown(inv):
                assert inv.available("pear") == 0

            def test_release(inv):
                inv.reserve("apple", 4)
                inv.release("apple", 4)
                assert inv.available("apple") == 10

            def test_release_part(inv):
                inv.reserve("apple", 4)
                inv.release("apple", 1)
                assert inv.available("apple") == 7
            '''),
    }),
]


def write_project(root: Path, seeded: Seeded) -> tuple[str, int]:
    """Write the project; return the bug's (file, line)."""
    bug: tuple[str, int] | None = None
    for rel, text in seeded.files.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.rstrip().endswith(MARKER):
                assert bug is None, f"{seeded.name}: two bug markers"
                bug = (rel, i + 1)
                lines[i] = line[: line.rindex(MARKER)].rstrip()
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert bug is not None, f"{seeded.name}: no bug marker"
    (root / "pytest.ini").write_text("[pytest]\npythonpath = .\n", encoding="utf-8")
    return bug


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_LOOPS_", "LOOP_")) and k != "PYTEST_ADDOPTS"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write the projects here and keep them")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-localize-"))
    base = args.keep or tmp
    rows = []
    print(f"{'project':15} {'bug kind':28} {'bug line':22} {'rank':>5} {'tied':>7} "
          f"{'score':>6} {'fail/pass':>9} {'secs':>5}  {'bug function':22} {'named':>5} {'fn rank':>7}")
    for seeded in PROJECTS:
        root = base / seeded.name
        if root.exists():
            shutil.rmtree(root)
        bug_file, bug_line = write_project(root, seeded)
        t0 = time.perf_counter()
        spectra = collect_spectra(root, [], pytest_args=["-q", "-p", "no:cacheprovider"],
                                  env=clean_env())
        suspects = rank_suspects(spectra)
        took = time.perf_counter() - t0
        rank = next((i + 1 for i, s in enumerate(suspects)
                     if (s.file, s.line) == (bug_file, bug_line)), None)
        score = suspects[rank - 1].score if rank else 0.0
        tied = [i + 1 for i, s in enumerate(suspects) if rank and abs(s.score - score) < 1e-12]
        tie = f"{tied[0]}-{tied[-1]}" if len(tied) > 1 else "-"
        scope = scope_of(root, bug_file, bug_line)
        prompt_lines = format_suspects(suspects, limit=PROMPT_TOP)
        named = bool(scope) and any(f"{bug_file}:" in line and f" in {scope} (" in line for line in prompt_lines)
        group = getattr(suspects_module, "group_suspects", None)
        fn_rank = None
        if group is not None:
            fn_rank = next((i + 1 for i, g in enumerate(group(suspects[:PROMPT_TOP]))
                            if (g.file, g.scope) == (bug_file, scope)), None)
        rows.append({"project": seeded.name, "kind": seeded.kind, "file": bug_file, "line": bug_line,
                     "rank": rank, "tied": tie, "score": round(score, 4),
                     "failed": len(spectra.failed), "passed": len(spectra.passed),
                     "function": scope, "function_named": named, "function_rank": fn_rank,
                     "top5": [s.to_dict() for s in suspects[:5]]})
        print(f"{seeded.name:15} {seeded.kind:28} {f'{bug_file}:{bug_line}':22} "
              f"{rank if rank else 'miss':>5} {tie:>7} {score:6.3f} "
              f"{len(spectra.failed):>4}/{len(spectra.passed):<4} {took:5.1f}  {scope or '-':22} "
              f"{'yes' if named else 'no':>5} {fn_rank if fn_rank else '-':>7}")
    hits = sum(1 for r in rows if r["rank"] and r["rank"] <= 5)
    firsts = sum(1 for r in rows if r["rank"] == 1)
    print(f"\nbug line in the top 5: {hits} of {len(rows)} (goal: at least 80%: "
          f"{'met' if hits >= 0.8 * len(rows) else 'NOT met'}); ranked first: {firsts} of {len(rows)}")
    in_fn = [r for r in rows if r["function"]]
    named_count = sum(1 for r in in_fn if r["function_named"])
    fn_first = sum(1 for r in in_fn if r["function_rank"] == 1)
    print(f"bug function named in the prompt's suspect lines: {named_count} of {len(in_fn)}; "
          f"first among the suspect functions: {fn_first} of {len(in_fn)}")
    if args.json:
        args.json.write_text(json.dumps({"hits_top5": hits, "function_named": named_count,
                                         "function_first": fn_first, "projects": rows}, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
