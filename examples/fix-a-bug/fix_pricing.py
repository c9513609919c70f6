"""A deterministic revise step: what an agent would do, without a model.

The loop runs it after a failed iteration with the environment contract set
(LOOP_PROMPT_FILE, LOOP_FAILURE_FILE, LOOP_ITERATION, ...). It reads the prompt,
and if the prompt shows the basket-total failure, it repairs `shop/pricing.py`.
A real loop would run an agent CLI here instead (see ../agents/).
"""

import os
from pathlib import Path

prompt = Path(os.environ["LOOP_PROMPT_FILE"]).read_text(encoding="utf-8")
print(f"iteration {os.environ['LOOP_ITERATION']} of {os.environ['LOOP_MAX_ITER']}: "
      f"read {len(prompt)} characters of prompt")

if "test_total_of_a_basket" not in prompt:
    print("the prompt does not show the basket-total failure; nothing to change")
    raise SystemExit(0)

source = Path("shop/pricing.py")
buggy = "for i in range(1, len(prices_cents)):"
fixed = "for i in range(len(prices_cents)):"
text = source.read_text(encoding="utf-8")
if buggy in text:
    source.write_text(text.replace(buggy, fixed), encoding="utf-8")
    print("fixed shop/pricing.py: total() now counts the first item of a basket")
else:
    print("shop/pricing.py has no off-by-one loop left; nothing to change")
