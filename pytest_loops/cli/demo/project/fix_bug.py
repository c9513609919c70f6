"""A deterministic revise step: reads the loop's prompt and repairs calc.add.

A real loop would run an agent CLI here, e.g.
    claude -p "$(cat "$LOOP_PROMPT_FILE")"
"""

import os
import pathlib

prompt = pathlib.Path(os.environ["LOOP_PROMPT_FILE"]).read_text()
print(f"iteration {os.environ['LOOP_ITERATION']}: read {len(prompt)} characters of prompt")
if "add" in prompt:
    calc = pathlib.Path("calc.py")
    calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
    print("fixed calc.add")
