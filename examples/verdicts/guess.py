"""A revise step that changes FILE every time and never gets it right.

It counts down from the number in FILE: the state changes each iteration (so
the no-progress guard sees progress), yet the check never passes.
"""

import sys
from pathlib import Path

path = Path(sys.argv[1])
guess = int(path.read_text(encoding="utf-8").strip()) - 1
path.write_text(f"{guess}\n", encoding="utf-8")
print(f"guessed {guess}")
