"""One lister, one set of rules (slimserve/image_listing.py): the same hostile folder and
CSV listed and read by every tool that takes images (the converter, bulk inference, the
load test, the client) skips the same files for the same reasons, in the same words, and
a hostile CSV or tree is refused before it fills memory."""
import io
import logging
import os

import pytest
from PIL import Image

from slimserve import image_listing
from slimserve.estimator import dataset
from slimserve.estimator import image_files
from slimserve.serving.bulk import inputs as bulk_inputs
from slimserve.serving.clients import client as client_lib
from slimserve.serving.clients import loadtest

LIMIT = 4096  # bytes: the hostile folder's oversized file is above it, the images below


def _png(colour):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def hostile(tmp_path):
    """root/ holds class folders a/ and b/ with good images among everything a folder
    should not make a tool do: hidden files and folders, a FIFO, a file over LIMIT, a
    symlink loop, a dangling link, a link to a folder, a file of another kind."""
    root = tmp_path / "images"
    (root / "a" / ".thumbnails").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "good.png").write_bytes(_png("red"))
    (root / "b" / "good.png").write_bytes(_png("blue"))
    (root / "top.png").write_bytes(_png("green"))
    (root / "a" / ".hidden.png").write_bytes(_png("red"))
    (root / "a" / ".thumbnails" / "thumb.png").write_bytes(_png("red"))
    os.mkfifo(root / "a" / "pipe.png")
    (root / "a" / "huge.png").write_bytes(_png("red") + b"\0" * (2 * LIMIT))
    os.symlink("loop.png", root / "a" / "loop.png")
    os.symlink(str(tmp_path / "gone.png"), root / "a" / "dangling.png")
    os.symlink(str(root / "b"), root / "a" / "linked")
    (root / "a" / "notes.txt").write_text("not an image")
    return root


# What every tool says of the files it cannot read (slimserve/regular_files.py's words).
UNREADABLE = {
    "pipe.png": "not a regular file: a FIFO (named pipe)",
    "huge.png": "file too large: %d bytes > max_file_bytes=%d" % (len(_png("red")) + 2 * LIMIT,
                                                                  LIMIT),
    "loop.png": "symlink loop",
}


def test_the_lister_rules(hostile):
    listing = image_listing.list_folder(str(hostile), labels="optional")
    assert [(os.path.relpath(e.path, str(hostile)), e.label) for e in listing.entries] == [
        ("top.png", None), ("a/dangling.png", "a"), ("a/good.png", "a"), ("a/huge.png", "a"),
        ("a/loop.png", "a"), ("a/notes.txt", "a"), ("a/pipe.png", "a"), ("b/good.png", "b")]
    assert {os.path.relpath(s["path"], str(hostile)): s["reason"]
            for s in listing.skipped} == {
        "a/.hidden.png": "hidden file", "a/.thumbnails": "hidden folder",
        "a/linked": "symlink to a folder (not followed)"}
    assert listing.classes == {"a": str(hostile / "a"), "b": str(hostile / "b")}
    only_images = image_listing.list_folder(str(hostile), suffixes=(".png",))
    assert str(hostile / "a" / "notes.txt") not in [e.path for e in only_images.entries]
    assert {"path": str(hostile / "a" / "notes.txt"), "reason": "not a png file"} in \
        only_images.skipped
    for name, reason in UNREADABLE.items():
        with pytest.raises(image_listing.NotReadable, match="^%s$" % reason.replace(
                "(", r"\(").replace(")", r"\)")):
            image_listing.read(str(hostile / "a" / name), LIMIT)
    with pytest.raises(image_listing.NotReadable, match="^dangling symlink"):
        image_listing.read(str(hostile / "a" / "dangling.png"), LIMIT)
    with pytest.raises(image_listing.ListingError, match="more than 3 files"):
        image_listing.list_folder(str(hostile), max_entries=3)


def test_the_converter_lists_and_reads_by_the_same_rules(hostile):
    items, skipped, empty = dataset.scan_folder(str(hostile))
    assert not empty
    reasons = {os.path.relpath(s["path"], str(hostile)): s["reason"] for s in skipped}
    assert reasons == {"top.png": "not inside a class folder", "a/.hidden.png": "hidden file",
                       "a/.thumbnails": "hidden folder",
                       "a/linked": "symlink to a folder (not followed)"}
    for name, reason in UNREADABLE.items():
        assert image_files.convert_file(str(hostile / "a" / name), max_file_bytes=LIMIT
                                        ).skip_reason == reason
    assert {i.label for i in items} == {"a", "b"}


def test_bulk_inference_lists_and_reads_by_the_same_rules(hostile):
    refs = bulk_inputs.list_inputs(str(hostile))
    rows = {os.path.relpath(item.key, str(hostile)): item
            for ref in refs for item in bulk_inputs.read(ref, LIMIT)}
    assert ".hidden.png" not in str(sorted(rows)) and ".thumbnails" not in str(sorted(rows))
    assert rows["a/linked"].error == "symlink to a folder (not followed)"
    for name, reason in UNREADABLE.items():
        assert rows["a/" + name].error == reason
    assert rows["a/good.png"].error is None and rows["a/good.png"].label == "a"
    assert rows["top.png"].label is None


def test_the_load_test_lists_and_reads_by_the_same_rules(hostile, caplog):
    with caplog.at_level(logging.WARNING):
        images = loadtest.load_images(str(hostile), max_bytes=LIMIT)
    assert images == [_png("green"), _png("red"), _png("blue")]  # top, a/good, b/good
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for name, reason in UNREADABLE.items():
        assert "%s: %s" % (hostile / "a" / name, reason) in logged
    assert "hidden" not in logged and "notes.txt" not in logged


def test_the_client_reads_by_the_same_rules(hostile):
    for name, reason in UNREADABLE.items():
        assert client_lib.read_image(str(hostile / "a" / name), LIMIT) == (
            None, reason.replace("max_file_bytes", "--max_message_bytes"))
    assert client_lib.read_image(str(hostile / "a" / "notes.txt"), LIMIT)[1].startswith(
        "not a JPEG, PNG, GIF or BMP image")
    assert client_lib.read_image(str(hostile / "a" / "good.png"), LIMIT) == (_png("red"), None)


def test_a_csv_with_a_huge_line_is_refused_by_every_reader(tmp_path):
    """One line of 8 MiB without a line break: refused at the bound, never held whole."""
    huge = tmp_path / "list.csv"
    with open(huge, "w") as handle:
        handle.write("path,label\n")
        handle.write("x" * (8 << 20))
    message = r"list\.csv:2: a line longer than %d characters" % image_listing.MAX_LINE_CHARS
    with pytest.raises(image_listing.ListingError, match=message):
        image_listing.read_csv(str(huge))
    with pytest.raises(dataset.DatasetError, match=message):
        dataset.read_input(str(huge))
    with pytest.raises(image_listing.ListingError, match=message):
        bulk_inputs.list_inputs(str(huge))
    with pytest.raises(image_listing.ListingError, match=message):
        loadtest.load_images(str(huge))


def test_csv_rows_resolve_relative_paths_and_keep_their_order(tmp_path):
    (tmp_path / "sub").mkdir()
    listing = tmp_path / "sub" / "list.tsv"
    listing.write_text("path\tlabel\nb.png\tcat\n\n/abs/a.png\tdog\nc.png\n",
                       encoding="utf-8-sig")
    entries = image_listing.read_csv(str(listing)).entries
    assert entries == [image_listing.Entry(str(tmp_path / "sub" / "b.png"), "cat"),
                       image_listing.Entry("/abs/a.png", "dog"),
                       image_listing.Entry(str(tmp_path / "sub" / "c.png"), None)]
    with pytest.raises(image_listing.ListingError, match=r"list\.tsv:5: expected 2 columns"):
        image_listing.read_csv(str(listing), labels="required")
    os.mkfifo(tmp_path / "fifo.csv")  # a FIFO named as the CSV is never opened
    with pytest.raises(image_listing.ListingError, match="a FIFO"):
        image_listing.read_csv(str(tmp_path / "fifo.csv"))
