"""The documentation site stays complete without building it (``mkdocs build --strict`` runs in ``.ci/run``).

* Every class that a config in ``configs/`` names (by ``class_path`` or as a bare dotted name) is rendered in the API
  reference: its module has a ``::: module`` directive in ``docs/api/*.md`` that does not leave it out, it is
  public there (in the module's ``__all__`` when it has one, mkdocstrings' ``filters: public``) and it has a
  docstring (mkdocstrings skips objects without one).
* Every public module of the package has its directive, and a package directive that lists ``members`` lists every
  public function or class the package's ``__init__`` defines itself.
* The CLI reference hook (``docs/hooks/cli_reference.py``) lists every subcommand of ``python -m kglightning``.
* The README keeps the two Quick start commands that ``.ci/run`` and newcomers run, and stays short.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kglightning"
API_PAGES = sorted((ROOT / "docs" / "api").rglob("*.md"))
DIRECTIVE = re.compile(r"^::: *([\w.]+)[ \t]*\n((?:[ \t]+.*\n?)*)", flags=re.M)
DOTTED = re.compile(r"^kglightning(\.[A-Za-z_]\w*)+$")


def _directives() -> dict[str, dict[str, Any]]:
    """``{identifier: options}`` of every ``::: identifier`` in the API pages."""
    found: dict[str, dict[str, Any]] = {}
    for page in API_PAGES:
        for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            block = yaml.safe_load(m.group(2)) if m.group(2).strip() else None
            found[m.group(1)] = (block or {}).get("options", {}) or {}
    return found


def _config_names() -> dict[str, list[str]]:
    """Every ``kglightning.*`` object a config names, with the configs that name it."""
    names: dict[str, list[str]] = {}

    def walk(node: Any, config: str) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value, config)
        elif isinstance(node, list):
            for value in node:
                walk(value, config)
        elif isinstance(node, str) and DOTTED.match(node) and node.rsplit(".", 1)[1][:1].isupper():
            names.setdefault(node, []).append(config)

    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        walk(yaml.safe_load(path.read_text(encoding="utf-8")), str(path.relative_to(ROOT)))
    return names


def _public_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts):
            modules.append(".".join(parts))
    return modules


def _rendered(name: str, module: str, directives: dict[str, dict[str, Any]]) -> bool:
    """Whether mkdocstrings renders ``module.name`` on some API page (see the module docstring)."""
    if f"{module}.{name}" in directives:
        return True
    if module not in directives:
        return False
    members = directives[module].get("members", True)
    if members is False or (isinstance(members, list) and name not in members):
        return False
    exported = getattr(importlib.import_module(module), "__all__", None)
    return name in exported if exported is not None else not name.startswith("_")


def test_api_pages_exist():
    assert API_PAGES, "docs/api/*.md is missing"
    assert _directives()


def test_each_module_has_its_own_api_page_and_the_navigation_lists_them():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "tools" / "docs_api_pages.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs" / "api").glob("*/*.md")}
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = {page for page in pages if re.search(rf"- kglightning[\w.]*: {re.escape(page)}\n", nav)}
    internal = {page for page in pages if "\nsearch:\n  boost: 0.5\n" in (ROOT / "docs" / page).read_text("utf-8")}
    # public modules in the navigation under their qualified names, the others (internals) out of it, ranked lower
    assert listed and internal and listed | internal == pages and not listed & internal
    assert "kglightning.modules.detector: api/modules/detector.md" in nav  # what a config names is public
    assert "api/data/store.temporaries.md" in internal and "api/data/store.temporaries.md" not in nav
    for page in pages:  # one module a page, titled by the module's path
        assert len(DIRECTIVE.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))) == 1, page


def test_nav_labels_are_the_page_titles():
    """A label in the nav is its page's title, or the title's part before a colon ("UAG" for "UAG: conformal KG
    traversal ..."); the home page and the API's module pages (titled by the module's path) aside."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    Loader.add_multi_constructor("!", lambda *_: None)

    def entries(nav: list[Any]) -> list[tuple[str, str]]:
        out = []
        for item in nav:
            for label, value in item.items() if isinstance(item, dict) else ():
                out += [(label, value)] if isinstance(value, str) else entries(value)
        return out

    nav = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)["nav"]
    wrong = []
    for label, page in entries(nav):
        if page == "index.md" or page.count("/") > 1:
            continue
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        for included in re.findall(r'^--8<-- "([^"]+)"', text, flags=re.M):  # a page that includes a root file
            text += "\n" + (ROOT / included).read_text(encoding="utf-8")
        title = re.search(r"^# (.+)$", text, flags=re.M)
        if title is None or (title.group(1) != label and not title.group(1).startswith(label + ":")):
            wrong.append(f"{page}: nav {label!r}, title {title.group(1) if title else None!r}")
    assert not wrong, "\n".join(wrong)


def test_every_config_class_is_in_the_api_reference():
    names = _config_names()
    assert "kglightning.modules.HallucinationDetector" in names  # the walk found the main job's model
    directives = _directives()
    missing = []
    for dotted, configs in sorted(names.items()):
        module_name, attr = dotted.rsplit(".", 1)
        obj = getattr(importlib.import_module(module_name), attr)
        home, name = obj.__module__, obj.__qualname__
        if not _rendered(name, home, directives) or not (obj.__doc__ or "").strip():
            missing.append(f"{dotted} (defined in {home}; named in {', '.join(sorted(set(configs)))})")
    assert not missing, "not rendered in docs/api/*.md:\n" + "\n".join(missing)


def test_every_module_has_an_api_directive():
    directives = _directives()
    missing = [m for m in _public_modules() if m not in directives]
    assert not missing, f"add a `::: module` directive to a docs/api page for: {missing}"
    unknown = [d for d in directives if d.split(".")[0] == "kglightning" and d not in _public_modules()]
    assert not unknown, f"docs/api names modules that do not exist: {unknown}"


def test_package_directives_list_what_the_package_defines():
    """A package page renders only the package docstring plus its ``members`` (the rest are re-exports documented
    in their modules), so a class or function defined in an ``__init__.py`` must be listed there."""
    for identifier, options in _directives().items():
        init = PACKAGE.parent / identifier.replace(".", "/") / "__init__.py"
        if not init.is_file() or "members" not in options:
            continue
        tree = ast.parse(init.read_text(encoding="utf-8"))
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_")
        }
        members = options["members"] if isinstance(options["members"], list) else []
        assert defined <= set(members), f"{identifier}: list {sorted(defined - set(members))} in its members"


@pytest.fixture(scope="module")
def cli_hook():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_lists_every_subcommand_each_on_a_page_of_its_own(cli_hook):
    from kglightning.cli import EXTRA_SUBCOMMANDS

    listed = cli_hook.subcommands(cli_hook.help_text([]))
    assert listed == ["fit", "validate", "test", "predict", *EXTRA_SUBCOMMANDS]
    index = cli_hook.render()
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for name in listed:
        assert f"| [`{name}`](cli/{name}.md) | " in index
        page = cli_hook.COMMAND_PAGE.format(name)
        assert f"- kglightning {name}: {page}\n" in nav
        assert f"<!-- cli-reference: {name} -->" in (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert sorted(p.stem for p in (ROOT / "docs" / "reference" / "cli").glob("*.md")) == sorted(listed)
    assert cli_hook.MARKER in (ROOT / "docs" / cli_hook.PAGE).read_text(encoding="utf-8")
    fit = cli_hook.render_command("fit")
    assert re.search(r"^usage: .*kglightning .*\bfit\b", fit, flags=re.M)
    headings = re.findall(r"^## (.+)$", fit, flags=re.M)
    assert headings[:3] == ["Options", "Trainer: `--trainer`", "Model: `--model`"]
    assert headings[-1] == "Arguments of `Trainer.fit`"
    # the Trainer's options folded, the others open
    assert re.search(r'^\?\?\? note "\d+ options of Lightning\'s Trainer', fit, flags=re.M)
    assert "    --trainer.max_epochs MAX_EPOCHS" in fit and "\n  --model CONFIG" in fit
    # a docstring's bullet list stays a list (argparse ran --ckpt_path's special values into one paragraph)
    items = re.findall(r"^ {20,}- (best|last|registry):", fit, flags=re.M)
    assert items == ["best", "last", "registry"], fit[fit.index("--ckpt_path CKPT_PATH") :][:1500]
    assert re.search(r"^ {22,}- 'registry:model-name':", fit, flags=re.M)  # nested one level deeper


def test_cli_reference_fits_the_column_is_plain_text_and_keeps_every_word(cli_hook):
    """No line of the CLI reference is wider than the site's code column (argparse's help ran to 154 columns) or holds
    a control character (jsonargparse's backspace before ``[=flags]``) or reST markup copied from Lightning's help,
    and wrapping loses no word."""
    top = cli_hook.help_text([])
    pages = [cli_hook.render(), cli_hook.render_command("fit"), cli_hook.render_command("select")]
    for page in pages:
        code = [line.removeprefix("    ") for line in page.splitlines() if not line.startswith("|")]
        assert max(map(len, code)) <= cli_hook.WIDTH
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", page)
        assert not re.search(r"(?<!`)``(?!`)|:[a-z]+:`|`_\b", page), "reST markup left"
    for raw in (top, cli_hook.help_text(["fit"])):
        tidy = cli_hook.tidy(raw)
        assert re.sub(r"\s+|[\x00-\x1f]", "", tidy) == re.sub(r"\s+|[\x00-\x1f]", "", raw)
    assert cli_hook.tidy("    {a,bb,ccc,dddd}", width=12).splitlines() == ["    {a,bb,", "      ccc,", "      dddd}"]
    assert "``" in cli_hook.help_text(["fit"]), "Lightning's help no longer has reST: the test above checks nothing"


def test_the_docs_extra_formats_long_api_signatures():
    """mkdocstrings-python prints a long signature on one line unless Black or Ruff is installed; the docs extra
    installs ruff, so the API pages' signatures wrap at the configured line length."""
    docs_extra = re.search(r'"docs": \[(.*?)\]', (ROOT / "setup.py").read_text(encoding="utf-8"), flags=re.S)
    assert docs_extra and '"ruff' in docs_extra.group(1)
    from mkdocstrings_handlers.python._internal.rendering import do_format_code

    code = "def f(" + ", ".join(f"argument_{i}: int = {i}" for i in range(8)) + ") -> None: ..."
    formatted = do_format_code(code, 88)
    assert formatted.count("\n") > 3 and max(map(len, formatted.splitlines())) <= 88


def test_a_returns_section_parses_as_one_value_with_the_sites_options():
    """The API pages parse docstrings with the options in mkdocs.yml: a Returns section whose text wraps, or starts
    with a literal holding a colon, is one value, not rows of fake names (griffe's default reads each line at the
    section's indentation as an item, and ``x: y`` as a name and its description)."""
    import griffe

    config = re.search(r"docstring_options:\n((?:\s{14}.*\n)+)", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config, "mkdocs.yml sets docstring_options for the python handler"
    options = yaml.safe_load(config.group(1).replace(" " * 14, ""))
    text = (
        "Split the pool.\n\nReturns:\n"
        '    ``{"train": ids, "test": ids}``, each in the pooled order (the pool\'s splits in\n'
        "    turn, each in its own order).\n"
    )
    sections = griffe.Docstring(text, parser="google", parser_options=options).parse()
    returns = [s for s in sections if s.kind is griffe.DocstringSectionKind.returns]
    assert len(returns) == 1 and len(returns[0].value) == 1
    assert returns[0].value[0].description.endswith("each in its own order).")
    assert "``{" in returns[0].value[0].description


def test_cli_reference_hook_fills_only_its_pages(cli_hook):
    class Page:
        class file:
            src_uri = "index.md"

    assert cli_hook.on_page_markdown(cli_hook.MARKER, Page) == cli_hook.MARKER
    assert cli_hook.on_page_markdown("<!-- cli-reference: select -->", Page) == "<!-- cli-reference: select -->"
    Page.file.src_uri = "reference/cli/select.md"
    assert "usage: kglightning select" in cli_hook.on_page_markdown("<!-- cli-reference: select -->", Page)


def test_readme_keeps_the_quick_start_and_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash tools/install.sh && python -m kglightning fit --config configs/detector.yaml\n" in readme
    assert "\npython -m pytest -q\n" in readme
    assert "\npython -m pytest -q\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 220, "the README is an introduction; move details into docs/"


def test_a_summary_is_the_first_sentence_whole_on_the_first_line():
    """mkdocstrings shows a docstring's first line in the member tables: the docs hook puts the first sentence there,
    not stopping at an abbreviation, inside code or inside brackets, and leaves one-liners, lists and code alone."""
    spec = importlib.util.spec_from_file_location("griffe_docstrings", ROOT / "docs" / "hooks" / "griffe_docstrings.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = "Scores (e.g. the\ndetector's, i.e. logits.) of ``x. y``\nanswers. Then more\nwords.\n\nArgs:\n    a: b."
    assert hook.summary_line(text).split("\n") == [
        "Scores (e.g. the detector's, i.e. logits.) of ``x. y`` answers.", "Then more words.", "", "Args:", "    a: b."
    ]  # fmt: skip
    for same in ("One line.\n\nMore\nlines.", "A list:\n- one\n- two", ">>> f()\n1", "# Title\nText. More\ntext.",
                 "!!! note\n    Body. More\n    body.", "Steps:\n1. load it.\n2. run it.", "Hard break  \nhere. Then."):  # fmt: skip
        assert hook.summary_line(same) == same
    for abbreviated in (
        "Eq. 5 scores\npaths. More.",
        "He et al. 2024 show\nthis. More.",
        "The G. Retriever cut\nit. More.",
    ):
        assert hook.summary_line(abbreviated).split("\n")[1] == "More."
    assert hook.summary_line("Ends without a stop\nhere") == "Ends without a stop here"


def _api_links():
    spec = importlib.util.spec_from_file_location("api_links", ROOT / "docs" / "hooks" / "api_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kglightning_names_in_prose_become_links_to_where_the_reference_renders_them():
    links = _api_links()
    page = "See `kglightning.data.KGIndex`, `kglightning.nn`, [`kglightning.data`](x) and `kglightning.nope.X`.\n"
    page += "```python\n`kglightning.data.KGIndex`\n```\n"
    assert links.link_names(page) == (
        "See [`kglightning.data.KGIndex`][kglightning.data.kg.KGIndex], [`kglightning.nn`][kglightning.nn], "
        "[`kglightning.data`](x) and `kglightning.nope.X`.\n```python\n`kglightning.data.KGIndex`\n```\n"
    )  # a re-exported class links to its defining module's page; links and fenced code are left alone
    assert links.unresolved() == ["kglightning.nope.X"]
    untouched = ("See [the `kglightning.data.KGIndex` class](x.md) and `` `kglightning.nn` ``.\n"
                 "````\n```\n`kglightning.nn`\n````\n`kglightning.nn`()")  # fmt: skip
    assert links.link_names(untouched) == untouched  # link text, a double-backtick span, a longer fence, a call


def test_the_inventory_urls_are_absolute_and_change_with_the_files(tmp_path):
    spec = importlib.util.spec_from_file_location("inventories_hook", ROOT / "docs" / "hooks" / "inventories.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "torch.inv").write_bytes(b"one")
    first = hook.fresh_url("file:inv/torch.inv", tmp_path)
    assert first.startswith((tmp_path / "inv" / "torch.inv").as_uri() + "#sha256=")
    (tmp_path / "inv" / "torch.inv").write_bytes(b"two")
    assert hook.fresh_url("file:inv/torch.inv", tmp_path) != first  # MkDocs' day-long URL cache sees a new URL
    assert hook.fresh_url("https://example.org/objects.inv", tmp_path) == "https://example.org/objects.inv"


def test_navigation_names_break_at_their_dots_only():
    spec = importlib.util.spec_from_file_location("nav_breaks", ROOT / "docs" / "hooks" / "nav_breaks.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    label = '<span class="md-ellipsis">\n    kglightning.data.sources.embedded.builder\n  </span>'
    out = hook.break_names(label + "<p>kglightning.data.kg</p>")
    assert "kglightning.<wbr>data.<wbr>sources.<wbr>embedded.<wbr>builder\n" in out
    assert out.endswith("<p>kglightning.data.kg</p>")  # only navigation labels: prose and code keep their text
    other = '<span class="md-ellipsis">Getting started</span>'
    assert hook.break_names(other) == other


def test_every_kglightning_name_the_prose_pages_give_imports():
    links = _api_links()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if not page.relative_to(ROOT / "docs").as_posix().startswith(links.SKIP):
            links.link_names(page.read_text(encoding="utf-8"))
    assert links.unresolved() == []  # a renamed or removed object named on a page: the page must follow


#: the longest line a code block of the guides may have: about what the text column holds at 1280 px (the site's
#: monospace at 13.6 px, 984 px of column), with some room; tools/check_layout.py measures the built site itself
CODE_LINE_LIMIT = 110


def _fenced_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, line)`` of the lines inside fenced code blocks of a Markdown file, without the fence's indent."""
    lines, fence, indent = [], None, 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fence, indent = (None, 0) if fence else (stripped, len(line) - len(stripped))
        elif fence:
            lines.append((number, line[indent:]))
    return lines


def test_code_blocks_of_the_guides_fit_the_column_without_scrolling_sideways():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), *(ROOT / name for name in ("README.md", "BENCHMARKS.md"))]
    long = [f"{page.relative_to(ROOT)}:{number}: {len(line)} characters"
            for page in pages for number, line in _fenced_lines(page) if len(line) > CODE_LINE_LIMIT]  # fmt: skip
    assert not long, f"code lines over {CODE_LINE_LIMIT} characters (wrap commands with \\):\n" + "\n".join(long)
    assert _fenced_lines(ROOT / "README.md"), "the README's code blocks were not found"
    # a comment does not continue a command: a comment line that ends in "\\" makes its next line a command
    broken = [f"{page.relative_to(ROOT)}:{number}" for page in pages for number, line in _fenced_lines(page)
              if line.lstrip().startswith("#") and line.rstrip().endswith("\\")]  # fmt: skip
    assert not broken, "comment lines ending in a continuation:\n" + "\n".join(broken)


def test_the_folders_the_docs_commands_write_into_a_checkout_are_ignored_by_git():
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["data/my_llm/train.jsonl", "outputs/detector/x.ckpt", "kglightning/data/new_module.py",
             "configs/data/new.yaml"]  # fmt: skip
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == paths[:2]  # the project's own data package and configs are not ignored


#: a Google-style section header of a docstring (its lines are indented under it)
_SECTION = re.compile(r"^(Args|Returns|Raises|Yields|Examples?|Notes?|Attributes|Warnings?|See Also|Warns):\s*$")


def docstring_markup_problems(doc: str) -> list[str]:
    """What the API reference would show as raw markup: a line that is one RST literal (an indented formula in double
    backticks is rendered as code, backticks and all), RST literals in a doctest's comment, an indented doctest
    after a paragraph outside an Example section (rendered as a code block holding a literal ```` ```pycon ```` fence),
    and a first line that ends inside a literal or role (the summary tables show the first line alone).

    >>> docstring_markup_problems("Sum.\\n\\n    ``a + b``\\n\\nMore.\\n\\n    >>> f()  # see ``g``\\n    1\\n")
    ['an RST literal line: ``a + b``', 'RST in a doctest comment: >>> f()  # see ``g``', 'a doctest after a paragraph: >>> f()  # see ``g``']
    """
    out, section = [], None
    lines = inspect.cleandoc(doc).splitlines()
    first = lines[0] if lines else ""
    if first.count("``") % 2 or re.sub(r"``.*?``", "", first).count("`") % 2:  # the summary tables show line one
        out.append(f"a first line that ends inside a literal or role: {first}")
    for line in lines:
        text = line.strip()
        if _SECTION.match(line):
            section = line
            continue
        if text and not line.startswith(" "):
            section = None  # a paragraph of prose ends the section above it
        if re.fullmatch(r"``[^`]+``", text):
            out.append(f"an RST literal line: {text}")
        if text.startswith(">>>") and "``" in text.partition("#")[2]:
            out.append(f"RST in a doctest comment: {text}")
        if text.startswith(">>>") and line.startswith(" ") and section is None:
            out.append(f"a doctest after a paragraph: {text}")
    return out


def test_docstrings_hold_no_markup_the_reference_would_show_raw():
    found = []
    for path in sorted((ROOT / "kglightning").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                name = f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}"
                found += [f"{name}: {problem}" for problem in docstring_markup_problems(doc or "")]
    assert found == []
