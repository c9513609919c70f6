"""A revise step that repairs FILE: it writes the answer."""

import sys
from pathlib import Path

Path(sys.argv[1]).write_text("42\n", encoding="utf-8")
print(f"wrote 42 to {sys.argv[1]}")
