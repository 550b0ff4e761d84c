"""Build the docs: render README.md and docs/*.md to HTML and check them.

    python scripts/build_docs.py                 # writes build/docs/ (gitignored); exit 1 on any problem
    python scripts/build_docs.py --out /tmp/site

Needs the ``docs`` extra (``pip install -e ".[docs]"``: python-markdown). Pages are rendered with the ``tables``,
``fenced_code`` and ``toc`` extensions; heading anchors use GitHub's rule, so an anchor that works here works on
GitHub too. The output mirrors the repository (``README.html``, ``docs/<page>.html``) with links between pages
rewritten from ``.md`` to ``.html``.

The build fails, listing each problem with its file, on:

- a relative link to a file or folder that does not exist;
- a ``#anchor`` that the target page does not have;
- a page in docs/ that neither README.md nor another page links to (an orphan);
- a stale config reference (``scripts/generate_config_reference.py --check``).
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "build" / "docs"
EXTENSIONS = ("tables", "fenced_code", "toc")

_LINK = re.compile(r'(?P<attr>href|src)="(?P<url>[^"]*)"')
_ID = re.compile(r'\sid="([^"]+)"')
_TITLE = re.compile(r"<h1[^>]*>(.*?)</h1>", re.S)


def slugify(value: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lower case, markup and punctuation other than ``-`` / ``_`` dropped, each space a
    ``-`` (python-markdown's ``toc`` passes the heading's text with inline markup already stripped)."""
    value = re.sub(r"<[^>]+>", "", html.unescape(value)).strip().lower()
    return re.sub(r"[^\w\- ]", "", value).replace(" ", separator)


@dataclass
class Page:
    """One rendered markdown file."""

    source: Path
    html: str
    anchors: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)


def pages_to_build(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(path: Path) -> Page:
    """Render one markdown file; collect its heading anchors and its links."""
    import markdown

    md = markdown.Markdown(extensions=list(EXTENSIONS), extension_configs={"toc": {"slugify": slugify}})
    body = md.convert(path.read_text(encoding="utf-8"))
    return Page(
        source=path,
        html=body,
        anchors=set(_ID.findall(body)),
        links=[html.unescape(m["url"]) for m in _LINK.finditer(body)],
    )


def _is_external(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


def check_links(pages: dict[Path, Page], root: Path = ROOT) -> tuple[list[str], set[Path]]:
    """Problems with relative links and anchors, and the set of pages some other page links to."""
    problems: list[str] = []
    linked: set[Path] = set()
    for source, page in pages.items():
        where = source.relative_to(root).as_posix()
        for url in page.links:
            if _is_external(url):
                continue
            parts = urlsplit(url)
            target = source if not parts.path else (source.parent / unquote(parts.path)).resolve()
            if parts.path:
                try:
                    target.relative_to(root)
                except ValueError:
                    problems.append(f"{where}: link {url!r} points outside the repository")
                    continue
                if not target.exists():
                    problems.append(f"{where}: link {url!r}: {target.relative_to(root).as_posix()} does not exist")
                    continue
                if target != source:
                    linked.add(target)
            anchor = unquote(parts.fragment)
            if anchor and target.suffix == ".md":
                target_page = pages.get(target) or render(target)
                if anchor not in target_page.anchors:
                    name = target.relative_to(root).as_posix()
                    problems.append(f"{where}: link {url!r}: no heading with anchor #{anchor} in {name}")
    return problems, linked


def _load_reference_generator(root: Path):
    path = root / "scripts" / "generate_config_reference.py"
    spec = importlib.util.spec_from_file_location("generate_config_reference", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def check_config_reference(root: Path = ROOT) -> list[str]:
    """A problem when docs/config_reference.md is not what the generator writes (or the generator fails)."""
    try:
        generator = _load_reference_generator(root)
        current = generator.is_current()
    except SystemExit as e:  # the generator refuses: a key without a description, a stale table entry
        return [f"docs/config_reference.md: the generator fails: {e}"]
    if not current:
        return ["docs/config_reference.md: out of date; run python scripts/generate_config_reference.py"]
    return []


def _html_page(page: Page, body: str) -> str:
    match = _TITLE.search(page.html)
    title = re.sub(r"<[^>]+>", "", match.group(1)) if match else page.source.stem
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n"
        "<style>body{max-width:60rem;margin:2rem auto;padding:0 1rem;font-family:sans-serif;line-height:1.5}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .4rem;vertical-align:top}"
        "pre{background:#f6f8fa;padding:.6rem;overflow:auto}code{font-size:90%}</style>\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _to_html_links(body: str, source: Path, built: set[Path]) -> str:
    """Relative links to pages that are built → their ``.html`` (anchors kept); other links are left alone."""

    def fix(match: re.Match) -> str:
        url = html.unescape(match["url"])
        parts = urlsplit(url)
        if _is_external(url) or not parts.path.endswith(".md"):
            return match.group(0)
        if (source.parent / unquote(parts.path)).resolve() not in built:
            return match.group(0)
        new = parts.path[:-3] + ".html" + (f"#{parts.fragment}" if parts.fragment else "")
        return f'{match["attr"]}="{html.escape(new)}"'

    return _LINK.sub(fix, body)


def build(out: Path = DEFAULT_OUT, root: Path = ROOT, check_reference: bool = True) -> list[str]:
    """Render every page of ``root`` into ``out`` and return the problems found (empty: the docs build).

    ``check_reference=False`` skips the config-reference check (for a tree without the generator)."""
    root = root.resolve()
    sources = pages_to_build(root)
    pages = {path.resolve(): render(path) for path in sources}
    problems, linked = check_links(pages, root)
    for path in sources[1:]:
        if path.resolve() not in linked:
            where = path.relative_to(root).as_posix()
            problems.append(f"{where}: orphan: neither README.md nor another page links to it")
    if check_reference:
        problems += check_config_reference(root)
    for source, page in pages.items():
        target = out / source.relative_to(root).with_suffix(".html")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_html_page(page, _to_html_links(page.html, source, set(pages))), encoding="utf-8")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: build/docs)")
    args = parser.parse_args(argv)
    try:
        import markdown  # noqa: F401
    except ImportError:
        print('build_docs needs python-markdown: pip install -e ".[docs]"', file=sys.stderr)
        return 1
    problems = build(args.out)
    if problems:
        print(f"the docs do not build: {len(problems)} problem(s)", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"built {len(pages_to_build())} pages into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
