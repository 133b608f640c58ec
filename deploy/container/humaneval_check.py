"""In the container: the code_tests verifier runs a HumanEval item's own tests in the sandbox.

HumanEval/0 (has_close_elements): its prompt, a right completion and a wrong one, and the item's
`check` function sent as the caller's tests. Exit 0 when the right answer scores 1, the wrong one
scores below 1, and the verifier reports the sandbox's isolation layers; anything else exits 1.
Run by `make stack-test` inside the selftest image, as the image's unprivileged user.
"""

from __future__ import annotations

import asyncio
import sys

from router.generation import Generation, GenerationRequest, Message
from verifiers.code_tests import CodeTestsVerifier
from verifiers.sandbox import available, isolation_layers

PROMPT = '''from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)
    True
    """
'''
RIGHT = """```python
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if abs(a - b) < threshold:
                return True
    return False
```"""
WRONG = RIGHT.replace("abs(a - b) < threshold", "a - b < threshold")
CHECK = """
def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False

check(has_close_elements)
"""


def generation(text: str) -> Generation:
    return Generation(
        text=text, finish_reason="stop", prompt_tokens=0, completion_tokens=0, token_logprobs=None, latency_s=0.0
    )


async def main() -> int:
    reason = available()
    if reason is not None:
        print(f"FAIL: no sandbox in this container: {reason}")
        return 1
    request = GenerationRequest(
        messages=(Message("user", "Complete this function.\n\n" + PROMPT),), metadata={"tests": CHECK}
    )
    verifier = CodeTestsVerifier()
    right = await verifier.score(request, generation(RIGHT))
    wrong = await verifier.score(request, generation(WRONG))
    print(f"isolation: {', '.join(isolation_layers())}")
    print(f"right answer: score {right.value} ({right.reason})")
    print(f"wrong answer: score {wrong.value} ({wrong.reason})")
    ok = right.value == 1.0 and wrong.value is not None and wrong.value < 1.0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
