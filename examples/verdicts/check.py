"""The check of every verdict example: exit 0 when FILE holds the answer 42."""

import sys
from pathlib import Path

path = Path(sys.argv[1])
answer = path.read_text(encoding="utf-8").strip()
if answer == "42":
    print(f"{path}: 42, correct")
    raise SystemExit(0)
print(f"{path}: expected 42, found {answer!r}")
raise SystemExit(1)
