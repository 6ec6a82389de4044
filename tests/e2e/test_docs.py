"""The docs say what the code does: the op table of docs/ops.md is generated and current,
every link and file name the documents cite exists, and nothing points to a document
that is not in the repository."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from remote_autograd.service.ops.coverage import BEGIN, END, coverage_markdown, replace_block

ROOT = Path(__file__).resolve().parents[2]
OPS_DOC = ROOT / "docs" / "ops.md"
DOCUMENTS = ["README.md", "ARCHITECTURE.md", "docs/ops.md", "docs/known-differences.md", "bench/README.md", "proto/SPEC.md",
             "proto/SPEC-examples.md", "docker/local/README.md"]


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in out.splitlines() if (ROOT / name).is_file()]


def test_op_coverage_table_is_current():
    text = OPS_DOC.read_text()
    assert BEGIN in text and END in text
    assert replace_block(text, coverage_markdown()) == text, (
        "docs/ops.md is stale: run `python -m remote_autograd.service.ops.coverage --write docs/ops.md`"
    )


def test_readme_no_longer_carries_the_op_table():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN not in readme and "docs/ops.md" in readme
    assert len(readme) < 16_000, "the README is the user's entry: long material goes to its own document"


def test_readme_quick_start_is_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    block = readme[start:readme.index("```", readme.index("```sh", start) + 5)]
    assert "make serve" in block and "make test" in block


@pytest.mark.parametrize("name", DOCUMENTS)
def test_relative_links_resolve(name: str):
    doc = ROOT / name
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", doc.read_text()) if "://" not in link]
    missing = [link for link in links if not (doc.parent / link).exists()]
    assert not missing, f"{name} links to files that do not exist: {missing}"


def test_architecture_is_a_map_a_newcomer_reads_in_ten_minutes():
    """The map stays a map: the packages, the walk of one op, the speed paths, the import rules. What
    each module holds is its package's to tell (``test_every_package_docstring_names_its_modules``)."""
    size = len((ROOT / "ARCHITECTURE.md").read_bytes())
    assert size <= 12_000, f"ARCHITECTURE.md is {size} bytes: move the details into the packages' docstrings"


def test_architecture_cites_only_paths_that_exist():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    cited = set(re.findall(r"`((?:client|service|proto|tests|bench|docs|remote_autograd)/[\w/.]*)`", text))
    assert len(cited) > 10  # the map names the packages; a regex that found nothing would pass anything
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, missing


def test_architecture_walk_names_each_stage():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    walk = text[text.index("## The walk of one op"):]
    stages = ["__torch_function__", "client/_core.py", "client/transport", "proto/",
              "service/http", "service/backends", "service/engine", "service/ops", "service/sessions"]
    positions = [walk.index(stage) for stage in stages]
    assert positions == sorted(positions), "the walk goes from the user's call to the op table in order"


def test_no_pointer_to_a_document_outside_the_repository():
    """A comment or document naming ``something.md`` names a file that is here; no notes of a
    session, no shared folder of the team."""
    files = _tracked_files()
    present = {f.name for f in files}
    bad = []
    for f in files:
        if f.suffix not in (".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt", "") or f.name == "test_docs.py":
            continue
        text = f.read_text(errors="replace")
        for name in re.findall(r"[\w-]+\.md\b", text):
            if name not in present:
                bad.append(f"{f.relative_to(ROOT)}: {name}")
        for phrase in ("perf-notes", "shared/", "the seed's", "DESIGN:"):
            if phrase in text:
                bad.append(f"{f.relative_to(ROOT)}: {phrase!r}")
    assert not bad, bad


def _imports(path: Path, package: str) -> set[str]:
    """The modules of ours that ``path`` (a module of ``package``) imports, anywhere in it, as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module and node.module.startswith("remote_autograd"):
                found.add(node.module.removeprefix("remote_autograd."))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("remote_autograd.") for a in node.names if a.name.startswith("remote_autograd")}
    return found


def _package_imports(folder: str) -> dict[str, set[str]]:
    """Each module under ``folder`` (its subpackages too), by path, with what it imports."""
    found = {}
    for p in sorted((ROOT / folder).rglob("*.py")):
        package = ".".join(p.parent.relative_to(ROOT).parts)
        found[str(p.relative_to(ROOT))] = _imports(p, package)
    return found


def test_architecture_import_rules_hold():
    """ARCHITECTURE.md's "who imports whom": proto imports nothing of ours; client and service never
    each other (but the embedded server); service/ops nothing of service outside ops."""
    for path, names in _package_imports("proto").items():
        assert not [n for n in names if n.split(".")[0] in ("client", "service")], (path, names)
    client = _package_imports("client")
    for path, names in client.items():
        if path != "client/transport/_embedded.py":
            assert not [n for n in names if n.startswith("service")], (path, names)
    for path, names in _package_imports("service").items():
        assert not [n for n in names if n.startswith("client")], (path, names)
    ops = _package_imports("service/ops")
    assert ops
    for path, names in ops.items():
        assert not [n for n in names if n.startswith("service.") and not n.startswith("service.ops")], (path, names)
    assert "service.http.app" in client["client/transport/_embedded.py"]


def test_every_package_docstring_names_its_modules():
    """Each package's ``__init__.py`` docstring names each of its modules and subpackages (``name``,
    ``name.py`` or ``name/``, in double backquotes): the details ARCHITECTURE.md leaves to the packages."""
    missing = []
    for folder in ("client", "service", "proto", "remote_autograd"):
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            package = init.parent
            names = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
            names += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
            missing += [f"{package.relative_to(ROOT)}/{name}" for name in names
                        if not re.search(rf"``(?:[\w/]*/)?{re.escape(name)}(?:\.py|/)?(?:\.\w+)*``", doc)]
    assert not missing, f"a package's docstring does not name: {missing}"


def _spec_sections() -> dict[int, tuple[str, str]]:
    """SPEC.md's numbered sections: number -> (title, the section's text)."""
    text = (ROOT / "proto" / "SPEC.md").read_text()
    heads = list(re.finditer(r"^## (\d+)\. (.+)$", text, re.M))
    return {int(h.group(1)): (h.group(2).strip(), text[h.start():heads[i + 1].start() if i + 1 < len(heads) else None])
            for i, h in enumerate(heads)}


def test_every_spec_section_cited_exists_and_is_the_one_named():
    """A "§N" anywhere in the code and the documents names a section of SPEC.md; where the citation
    names the section too ("§3, Programs", "§3 (Programs)", "programs §3") or a paragraph of it
    (§3 "Where an error points"), that is what section N holds. ("Run Program" once cited §5,
    Argument values, for programs.)"""
    sections = _spec_sections()
    assert [n for n in sections] == list(range(1, len(sections) + 1)) and len(sections) >= 12
    titles = {title.lower(): n for n, (title, _) in sections.items()}
    wrong, cited = [], 0
    for path in _tracked_files():
        if path.suffix not in (".py", ".md", ".sh", ".json", ".example", ".yml") or ".venv" in path.parts:
            continue
        text = path.read_text(errors="replace")
        for m in re.finditer(r"§(\d+)", text):
            cited += 1
            n, where = int(m.group(1)), f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if n not in sections:
                wrong.append(f"{where}: §{n} is no section of SPEC.md")
                continue
            after, before = text[m.end():m.end() + 60], text[max(0, m.start() - 40):m.start()]
            named = re.match(r"(?:,| \()\s*([A-Z][a-z][\w ]*)", after)
            if named and not sections[n][0].lower().startswith(named.group(1).strip().lower()):
                wrong.append(f"{where}: §{n} is {sections[n][0]!r}, cited as {named.group(1).strip()!r}")
            words = re.search(r"([a-z][a-z ]*[a-z]) $", before)
            if words:
                title = next((t for t in titles if words.group(1).endswith(t)), None)
                if title is not None and titles[title] != n:
                    wrong.append(f"{where}: {title} is §{titles[title]}, cited as §{n}")
            quoted = re.match(r' "([^"]+)"', after)
            if quoted and f"**{quoted.group(1)}" not in sections[n][1] and f"# {quoted.group(1)}" not in sections[n][1]:
                wrong.append(f"{where}: §{n} has no paragraph {quoted.group(1)!r}")
    assert cited > 50  # the scan found the citations (a wrong pattern would pass anything)
    assert not wrong, "\n".join(wrong)
