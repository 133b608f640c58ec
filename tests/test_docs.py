"""The docs agree with the tree they describe.

The layout page is what `scripts/gen_layout.py` writes from today's tree, so a module moved, added
or re-described without rerunning the script fails here. The site under `docs/` has its links and
anchors checked by `mkdocs build --strict` in `make test`; README.md and CONTRIBUTING.md sit
outside it, so their links are checked here, and since both GitHub and the site render them, an
anchor must be a heading's id under both ways of making one. What they tell a reader to run (a
make target, a script, a bench config) must exist.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import markdown
import pytest

from scripts.gen_layout import render

ROOT = Path(__file__).resolve().parents[1]
FRONT_DOORS = ["README.md", "CONTRIBUTING.md"]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _site_ids(text: str) -> set[str]:
    """Heading ids as the docs site makes them: Python-Markdown's toc extension, as MkDocs runs it."""
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(text)
    ids: set[str] = set()
    stack = list(md.toc_tokens)
    while stack:
        token = stack.pop()
        ids.add(token["id"])
        stack.extend(token["children"])
    return ids


def _github_ids(text: str) -> set[str]:
    """Heading ids as GitHub makes them: lower case, punctuation dropped, each space a hyphen."""
    ids: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"#{1,6} (.*)", line)
        if fenced or not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m[1]).strip().lower()
        title = unicodedata.normalize("NFC", title)
        ids.add("".join(c for c in title if c.isalnum() or c in " -_").replace(" ", "-"))
    return ids


def _links(name: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # a link-shaped string in a code block is not a link
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.slow
def test_the_layout_page_is_what_the_script_writes_from_the_tree() -> None:
    committed = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert committed == render(), "docs/layout.md is stale: run .venv/bin/python scripts/gen_layout.py"


def test_a_new_module_appears_on_the_layout_page_with_its_first_sentence(tmp_path: Path) -> None:
    pkg = tmp_path / "router" / "rooms"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hall.py").write_text('"""Where requests wait. They never | wait long.\n\nMore.\n"""\n')
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "run.toml").write_text("#!/not/a/shebang\n# Ten requests a second.\n#   tierroute bench\n")
    page = render(tmp_path)
    assert "| `router/rooms/hall.py` | Where requests wait. |" in page
    assert "| `router/rooms/__init__.py` |  |" in page
    assert "| `bench/run.toml` | Ten requests a second. |" in page
    assert "## `verifiers/`" not in page  # a folder the tree lacks is left out, not invented


@pytest.mark.slow
@pytest.mark.parametrize("name", FRONT_DOORS)
def test_every_link_reaches_a_file_and_a_heading_that_exist(name: str) -> None:
    source = ROOT / name
    for target in _links(name):
        path_part, _, anchor = target.partition("#")
        path = (source.parent / path_part).resolve() if path_part else source
        assert path.exists(), f"{name} links to {target}: no such file"
        if anchor:
            text = path.read_text(encoding="utf-8")
            assert anchor in _site_ids(text), f"{name} links to {target}: the site has no such heading"
            assert anchor in _github_ids(text), f"{name} links to {target}: GitHub has no such heading"


def test_the_readme_fits_on_a_few_screens() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize("name", FRONT_DOORS)
def test_every_make_target_named_exists(name: str) -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    named = set(re.findall(r"`make ([\w-]+)", (ROOT / name).read_text(encoding="utf-8")))
    named |= set(re.findall(r"^make ([\w-]+)", (ROOT / name).read_text(encoding="utf-8"), flags=re.M))
    assert named, f"{name} names no make target"
    assert named <= targets, f"{name} names make targets the Makefile lacks: {named - targets}"


def test_every_script_and_bench_config_the_docs_name_exists() -> None:
    named = re.compile(r"(?<![\w/.])((?:scripts|bench)/[a-z_][\w.-]*\.(?:py|toml|sh|json))")
    pages = [ROOT / n for n in FRONT_DOORS] + sorted((ROOT / "docs").glob("*.md"))
    for page in pages:
        for rel in set(named.findall(page.read_text(encoding="utf-8"))):
            assert (ROOT / rel).exists(), f"{page.relative_to(ROOT)} names {rel}, which does not exist"
