"""Code extraction on answers the committed HumanEval run lost to the token cap.

Both answers below are the small tier's, copied verbatim from evals/results/humaneval: each
wrote a complete function, then ran into the 512-token cap inside a trailing ``print(...)``
example, so the code block never closes and the whole does not parse.
"""

from __future__ import annotations

import pytest

from evals.grading import grade_code_tests
from verifiers.extract import compiles, defined_names, definitions, extract_code, foreign_language

pytestmark = pytest.mark.timeout(60)

HUMANEVAL_94 = '```python\nfrom typing import List\n\ndef skjkasdkd(lst: List[int]) -> int:\n    """You are given a list of integers.\n    You need to find the largest prime value and return the sum of its digits.\n\n    Examples:\n    For lst = [0,3,2,1,3,5,7,4,5,5,5,2,181,32,4,32,3,2,32,324,4,3] the output should be 10\n    For lst = [1,0,1,8,2,4597,2,1,3,40,1,2,1,2,4,2,5,1] the output should be 25\n    For lst = [1,3,1,32,5107,34,83278,109,163,23,2323,32,30,1,9,3] the output should be 13\n    For lst = [0,724,32,71,99,32,6,0,5,91,83,0,5,6] the output should be 11\n    For lst = [0,81,12,3,1,21] the output should be 3\n    For lst = [0,8,1,2,1,7] the output should be 7\n    """\n    def is_prime(n: int) -> bool:\n        if n <= 1:\n            return False\n        if n <= 3:\n            return True\n        if n % 2 == 0 or n % 3 == 0:\n            return False\n        i = 5\n        while i * i <= n:\n            if n % i == 0 or n % (i + 2) == 0:\n                return False\n            i += 6\n        return True\n\n    largest_prime = 0\n    for num in lst:\n        if num > largest_prime and is_prime(num):\n            largest_prime = num\n\n    return sum(int(digit) for digit in str(largest_prime))\n\n# Test cases\nprint(skjkasdkd([0, 3, 2, 1, 3, 5,'
HUMANEVAL_81 = "```python\nfrom typing import List\n\ndef numerical_letter_grade(grades):\n    \"\"\"It is the last week of the semester and the teacher has to give the grades\n    to students and you have to write \n    a function that can output a list of letter grades using the following table:\n             GPA       |    Letter grade\n              4.0                A+\n            > 3.7                A \n            > 3.3                A- \n            > 3.0                B+\n            > 2.7                B \n            > 2.3                B-\n            > 2.0                C+\n            > 1.7                C\n            > 1.3                C-\n            > 1.0                D+ \n            > 0.7                D \n            > 0.0                D-\n              0.0                E\n    \n\n    Example:\n    grade_equation([4.0, 3, 1.7, 2, 3.5]) ==> ['A+', 'B', 'C-', 'C', 'A-']\n    \"\"\"\n    letter_grades = []\n    for gpa in grades:\n        if gpa == 4.0:\n            letter_grades.append('A+')\n        elif gpa > 3.7:\n            letter_grades.append('A')\n        elif gpa > 3.3:\n            letter_grades.append('A-')\n        elif gpa > 3.0:\n            letter_grades.append('B+')\n        elif gpa > 2.7:\n            letter_grades.append('B')\n        elif gpa > 2.3:\n            letter_grades.append('B-')\n        elif gpa > 2.0:\n            letter_grades.append('C+')\n        elif gpa > 1.7:\n            letter_grades.append('C')\n        elif gpa > 1.3:\n            letter_grades.append('C-')\n        elif gpa > 1.0:\n            letter_grades.append('D+')\n        elif gpa > 0.7:\n            letter_grades.append('D')\n        elif gpa > 0.0:\n            letter_grades.append('D-')\n        else:\n            letter_grades.append('E')\n    return letter_grades\n\n# Example usage:\nprint(grade_equation([4.0, 3, 1.7, 2, 3"


@pytest.mark.parametrize(
    ("text", "name", "last_line"),
    [
        (HUMANEVAL_94, "skjkasdkd", "    return sum(int(digit) for digit in str(largest_prime))"),
        (HUMANEVAL_81, "numerical_letter_grade", "    return letter_grades"),
    ],
)
def test_a_cut_off_trailing_example_is_dropped(text: str, name: str, last_line: str) -> None:
    assert not compiles(text.split("\n", 1)[1])  # the block as the model left it
    code = extract_code(text)
    assert compiles(code)
    assert defined_names(code) == {name}
    lines = code.rstrip().splitlines()
    assert lines[-1] in ("# Test cases", "# Example usage:")  # the cut is just before the print
    assert last_line in lines
    assert "print(" not in code


@pytest.mark.slow
async def test_the_kept_function_passes_its_docstring_examples() -> None:
    checks = "def check(f):\n    assert f([0,81,12,3,1,21]) == 3\n    assert f([0,8,1,2,1,7]) == 7\n"
    assert (await grade_code_tests(HUMANEVAL_94, checks, entry_point="skjkasdkd")).correct
    checks = "def check(f):\n    assert f([4.0, 3, 1.7, 2, 3.5]) == ['A+', 'B', 'C-', 'C', 'A-']\n"
    assert (await grade_code_tests(HUMANEVAL_81, checks, entry_point="numerical_letter_grade")).correct


def test_a_definition_cut_off_inside_its_body_is_not_shortened() -> None:
    # cutting inside a body would change what the function does: only top-level lines are cuts
    text = "```python\ndef f(n):\n    if n == 1:\n        return 1\n    if n == "
    assert extract_code(text) == text.removeprefix("```python\n")


def test_no_prefix_without_a_definition_is_kept() -> None:
    text = "```python\nx = 1\nprint(f(x,\n"
    assert extract_code(text) == "x = 1\nprint(f(x,\n"


def test_the_longest_parsing_prefix_wins() -> None:
    text = "```python\nimport math\n\ndef f(x):\n    return math.sqrt(x)\n\n\ndef g(x):\n    return f(x) + 1\n\nprint(g(4), f(\n"
    code = extract_code(text)
    assert defined_names(code) == {"f", "g"}
    assert code.startswith("import math")
    assert "print" not in code


def test_a_clause_of_a_compound_statement_is_not_a_cut() -> None:
    text = "def f():\n    return 1\n\ntry:\n    import numpy\nexcept ImportError:\n    pass\nprint(f(\n"
    code = extract_code(text)
    assert compiles(code)
    assert "except ImportError" in code and "print" not in code


def test_code_without_fences_keeps_its_parsing_prefix() -> None:
    text = "Here it is:\ndef f():\n    return 1\n\nprint(f(\n"
    assert extract_code(text) == "def f():\n    return 1\n\n"


@pytest.mark.parametrize(
    ("prompt", "text", "language"),
    [
        # fences labelled with another language, whatever the prompt says
        ("Write a query for the ten newest orders.", "```sql\nSELECT * FROM orders LIMIT 10;\n```", "sql"),
        ("Debounce a function.", "Here:\n```javascript\nfunction debounce(f, ms) { let t; }\n```", "javascript"),
        # unlabelled code that is not Python, in the language the prompt names
        ("Write a bash one-liner that counts lines.", "```\nfind . -name '*.py' | xargs wc -l\n```", "bash"),
        ("Write a JavaScript function that debounces.", "function debounce(f) { return f; }", "javascript"),
        # Python, or possibly Python: None
        ("Write a Python function.", "```python\ndef f():\n    return 1\n```", None),
        ("Write a function.", "```\ndef f():\n    return 1\n```", None),
        ("Write a SQL query in Python with sqlite3.", "```\nSELECT broken(\n```", None),  # the prompt names Python
        ("Reverse a string.", "```python\ndef f(s)\n    return s\n```", None),  # broken Python is Python
        ("Reverse a string.", "```bash\npip install x\n```\n```python\ndef f(s):\n    return s\n```", None),
        ("Print the result as JSON.", '```json\n{"a": 1}\n```', None),  # a data block is not a language
        # a language name that is also an English word counts only as written
        ("Go and write a function that adds.", "def add(a, b) return a + b", "go"),
        ("let us go write a function that adds.", "def add(a, b) return a + b", None),
    ],
)
def test_foreign_language(prompt: str, text: str, language: str | None) -> None:
    assert foreign_language(prompt, text) == language


# text the parser cannot hold: a few kilobytes of nesting raise RecursionError or MemoryError from
# `ast.parse`, and 400 nested operators one from `ast.unparse`, where a tree parsed
DEEP = ["-" * 3000 + "1", "a" + ".a" * 3000, "not " * 10000 + "x", "lambda:" * 3000 + "1"]


@pytest.mark.parametrize("text", DEEP, ids=["minus", "attribute", "not", "lambda"])
def test_text_nested_past_the_parser_is_not_python_and_raises_nothing(text: str) -> None:
    assert not compiles(text)
    assert defined_names(text) == set()
    assert definitions(text) == []
    assert extract_code(text) == text
    assert extract_code(f"```python\ndef f():\n    pass\n```\n```python\n{text}\n```") == "def f():\n    pass\n"


def test_a_definition_too_deep_to_unparse_is_left_out_and_the_others_kept() -> None:
    code = "import math\n\ndef deep():\n    return " + "-" * 400 + "1\n\ndef shallow():\n    return 1\n"
    assert compiles(code)
    assert definitions(code) == [(None, "import math"), ("shallow", "def shallow():\n    return 1")]
