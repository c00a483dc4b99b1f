"""The documentation holds together: every relative link in README.md, CHANGELOG.md and
docs/*.md names a file that exists and, with `#anchor`, a heading that GitHub renders with
that anchor; README.md stays a front door (at most 200 lines) whose table lists every
page in docs/; docs/development.md's layout tree has one line per file, no more, no less."""
import glob
import os
import re
import sys
import unicodedata

import pytest

from tests.helpers import ROOT

README_MAX_LINES = 200
DOCUMENTS = sorted(["README.md", "CHANGELOG.md"] + [
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md"))])

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def _prose_lines(text):
    """The lines outside fenced code blocks, as (line number, line). Indented lines are
    kept (list continuations carry links); _HEADING skips them by its indent."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def _rendered(markdown):
    """The text GitHub renders from a heading's markdown: code spans keep their content,
    links keep their text, emphasis markers and inline HTML go."""
    parts = []
    for index, part in enumerate(_CODE_SPAN.split(markdown)):
        if index % 3 == 2:        # a code span's content: rendered as it is
            parts.append(part.strip())
        elif index % 3 == 0:      # prose
            part = _LINK.sub(lambda m: m.group(2), part)
            part = re.sub(r"<[^>]+>", "", part)
            parts.append(re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", part))
    return "".join(parts)


def slug(heading_text):
    """GitHub's anchor for a heading (github-slugger): the rendered text in lower case,
    every character that is not a letter, digit, mark, `_`, `-` or space dropped, spaces
    turned into hyphens."""
    kept = []
    for char in _rendered(heading_text).strip().lower():
        category = unicodedata.category(char)
        if char in "-_" or char == " " or category[0] in "LNM":
            kept.append("-" if char == " " else char)
    return "".join(kept)


def anchors(path):
    """Every anchor a rendered page has: heading slugs (repeats get -1, -2, ... as on
    GitHub) and explicit <a name/id> anchors."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found, seen = set(), {}
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
        found.update(_HTML_ANCHOR.findall(line))
    return found


def relative_links(document):
    """(line number, target) of every link in `document` that is not to the web."""
    with open(os.path.join(ROOT, document), encoding="utf-8") as f:
        text = f.read()
    for number, line in _prose_lines(text):
        for match in _LINK.finditer(_CODE_SPAN.sub("code", line)):
            target = match.group(3)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                yield number, target


def broken_links(document):
    """Messages for every relative link in `document` that does not resolve."""
    broken = []
    for number, target in relative_links(document):
        path, _, anchor = target.partition("#")
        where = "%s:%d: [..](%s)" % (document, number, target)
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), path)) \
            if path else os.path.join(ROOT, document)
        if not os.path.exists(resolved):
            broken.append("%s: no file %s" % (where, os.path.relpath(resolved, ROOT)))
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append("%s: %s has no heading with anchor #%s" % (
                where, os.path.relpath(resolved, ROOT), anchor))
        elif anchor and not resolved.endswith(".md"):
            broken.append("%s: an anchor into a file that is not markdown" % where)
    return broken


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_resolves(document):
    assert os.path.exists(os.path.join(ROOT, document)), document
    broken = broken_links(document)
    assert not broken, "\n".join(broken)


def test_readme_is_a_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        "README.md has %d lines; at most %d: move details to docs/" % (
            len(lines), README_MAX_LINES))
    listed = {target.partition("#")[0] for _, target in relative_links("README.md")}
    unlisted = [d for d in DOCUMENTS if d.startswith("docs/") and d not in listed]
    assert not unlisted, "README.md links no page %s" % unlisted


@pytest.mark.parametrize("heading, expected", [
    ("Images to TFRecords: `slimserve-convert`", "images-to-tfrecords-slimserve-convert"),
    ("The client: `slimserve-client`", "the-client-slimserve-client"),
    ("Evaluation and serving geometry follows slim's, per net",
     "evaluation-and-serving-geometry-follows-slims-per-net"),
    ("Measured (`make bench-bulk`, 2 shared cores, 400 digit images at 64x64)",
     "measured-make-bench-bulk-2-shared-cores-400-digit-images-at-64x64"),
    ("Oversized images (\"decompression bombs\") are refused before decoding",
     "oversized-images-decompression-bombs-are-refused-before-decoding"),
    ("gRPC, command line, config files", "grpc-command-line-config-files"),
    ("Unreleased — one import name", "unreleased--one-import-name"),
    ("The `tensor_codec.py` *floor* [link](x.md)", "the-tensor_codecpy-floor-link"),
    ("`__init__.py` and _emphasis_", "__init__py-and-emphasis"),
])
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


def test_a_broken_link_is_reported(tmp_path, monkeypatch):
    """The checker itself can fail: a missing file and a missing anchor are both named."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## Same\n\n## Same\n\n[ok](#same-1) [bad](#nowhere) [gone](b.md)\n"
        "[web](https://example.com/x.md) `[code](c.md)`\n\n```\n[fenced](d.md)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    broken = broken_links("docs/a.md")
    assert len(broken) == 2, broken
    assert "#nowhere" in broken[0] and "no file docs/b.md" in broken[1]


LAYOUT_FOLDERS = ("slimserve", "estimator", "export", "serving", "flywheel", "scripts",
                  "benchmarks", "tests", "configs")


def layout_tree_paths():
    """The file paths the tree under "## Layout" in docs/development.md names: two spaces
    of indent per folder level; a line indented past the names continues a description."""
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as f:
        text = f.read()
    tree = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths, folders = set(), []
    for line in tree.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 12:
            continue
        name = line.split()[0]
        folders = folders[:indent // 2]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            paths.add("/".join(folders + [name]))
    return paths


def repository_files(folders):
    """The files under `folders` that git tracks (every file there without git)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    try:
        listed = subprocess.run(["git", "ls-files", "--"] + list(folders), cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
        return set(listed.split())
    except (OSError, subprocess.CalledProcessError):
        found = set()
        for folder in folders:
            for parent, dirs, files in os.walk(os.path.join(ROOT, folder)):
                dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
                found.update(os.path.relpath(os.path.join(parent, f), ROOT)
                             for f in files if not f.endswith(".pyc"))
        return found


def test_development_layout_lists_every_file():
    """docs/development.md's tree has one line per file of the code folders, and names no
    file that is gone: add a line when you add a file."""
    listed = layout_tree_paths()
    actual = repository_files(LAYOUT_FOLDERS)
    assert not actual - listed, "missing from docs/development.md's layout: %s" % sorted(
        actual - listed)
    gone = sorted(p for p in listed if not os.path.isfile(os.path.join(ROOT, p)) or (
        p.split("/")[0] in LAYOUT_FOLDERS and p not in actual))
    assert not gone, "docs/development.md's layout names files that do not exist: %s" % gone


def test_compatibility_page_names_every_slimserve_only_flag():
    """A flag TF Serving lacks is named where a TF Serving user looks for the differences."""
    import dataclasses  # pylint: disable=import-outside-toplevel
    from slimserve.serving import options  # pylint: disable=import-outside-toplevel
    own = [f.name for f in dataclasses.fields(options.ServerOptions)
           if f.metadata.get("slimserve_only")]
    assert own, "no field is marked slimserve only"
    with open(os.path.join(ROOT, "docs", "tfserving-compatibility.md")) as handle:
        page = handle.read()
    assert not [name for name in own if "`--%s`" % name not in page]


# An absolute path of a machine: a home or a checkout (/root, /home, /Users, /work) or a
# scratch tree under /tmp. Allowed: the container's working folder of the Dockerfile and
# the Kubernetes manifests (/work, with data, run and pretrained in it) and a few
# documented examples of a /tmp path (TF Serving's suite binds /tmp/tf-serving.sock
# itself); a new example goes in the list below on purpose, a machine's path never does.
_MACHINE_PATH = re.compile(
    r"(?<![\w./<-])/(?:root|home|Users|work|tmp)(?![\w.-])(?:/[^\s`'\"()<>|,;]*)?")
_ALLOWED_PATHS = re.compile(
    r"^/work/?$|^/work/(?:data|run|pretrained)(?:/|$)|^/tmp/(?:tf-serving\.sock|"
    r"slimserve\.sock|tiny|prof|x|sss\.\.\.s:?|hotpath-base|at-COMMIT|base)$")


def test_no_path_of_a_developers_machine():
    """Docs, code and tests name placeholders (`<tensorflow/serving clone>`), relative
    paths or a test's tmp_path, never where a file happened to be on someone's machine
    (`/work/.mirror/...` and `/tmp/nt/...` were)."""
    found = []
    for path in sorted(repository_files(["."])):
        if path == "tests/unit/test_docs.py" or not os.path.isfile(os.path.join(ROOT, path)):
            continue
        try:
            with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
                text = handle.read()
        except UnicodeDecodeError:
            continue  # a binary file
        for number, line in enumerate(text.splitlines(), 1):
            for match in _MACHINE_PATH.finditer(line):
                if not _ALLOWED_PATHS.match(match.group(0).rstrip(".:")):
                    found.append("%s:%d: %s" % (path, number, match.group(0)))
    assert not found, "paths of a machine in the repository:\n" + "\n".join(found)
