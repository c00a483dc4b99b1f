"""Hostile inputs to the converter: class names labels.txt cannot hold, CSVs from
spreadsheets, classes without a usable image, and files that are not regular files.

The converter must never write a data set that training then rejects, never add a
class without images, never block or read without bound, and never touch a finished
data set when it fails.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest

from slimserve.estimator import dataset
from slimserve.estimator import image_files
from slimserve.estimator import schema
from slimserve.estimator import splits
from slimserve.serving import server_process
from tests.helpers import ROOT


def _digits(digits_dir, digit, count):
    folder = os.path.join(digits_dir, str(digit))
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))[:count]]


def _class_tree(root, digits_dir, classes, count=3):
    for index, name in enumerate(classes):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        for source in _digits(digits_dir, index, count):
            shutil.copy(source, folder)


def _records(data_dir, split):
    out = []
    for example in splits.read_examples(data_dir, split):
        feature = example.features.feature
        out.append((feature[schema.LABEL].int64_list.value[0],
                    feature[schema.TEXT].bytes_list.value[0].decode(),
                    feature[schema.FILENAME].bytes_list.value[0].decode()))
    return out


def _snapshot(folder):
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder))}


# --- class names -------------------------------------------------------------------------

@pytest.mark.parametrize("bad_name", ["cat\ndog", "tab\there", "bell\x07", "nel\x85",
                                      "line\u2028sep", "   "])
def test_folder_names_labels_txt_cannot_hold_are_refused_by_name(tmp_path, digits_dir,
                                                                 bad_name):
    source = str(tmp_path / "in")
    _class_tree(source, digits_dir, ["good", bad_name])
    with pytest.raises(dataset.DatasetError) as raised:
        dataset.build_dataset(source, str(tmp_path / "out"), show_progress=False)
    message = str(raised.value)
    assert repr(bad_name) in message and "folder" in message
    assert not os.path.exists(tmp_path / "out")


def test_csv_label_with_a_newline_is_refused_naming_the_line(tmp_path, digits_dir):
    first, second = _digits(digits_dir, 0, 2)
    csv_path = tmp_path / "list.csv"
    csv_path.write_text('path,label\n%s,cat\n%s,"two\nlines"\n' % (first, second))
    with pytest.raises(dataset.DatasetError,
                       match=r"'two\\nlines' from .*list\.csv:3 contains control"):
        dataset.build_dataset(str(csv_path), str(tmp_path / "out"), show_progress=False)


def test_refused_name_leaves_the_finished_data_set_untouched(tmp_path, digits_dir):
    source, out = str(tmp_path / "in"), str(tmp_path / "out")
    _class_tree(source, digits_dir, ["a", "b"])
    dataset.build_dataset(source, out, 0.34, train_shards=1, validation_shards=1,
                          show_progress=False)
    before = _snapshot(out)
    os.makedirs(os.path.join(source, "c\rd"))
    shutil.copy(_digits(digits_dir, 2, 1)[0], os.path.join(source, "c\rd"))
    with pytest.raises(dataset.DatasetError, match=r"'c\\rd'"):
        dataset.build_dataset(source, out, 0.34, overwrite=True, show_progress=False)
    assert _snapshot(out) == before


def test_names_that_are_not_utf8_are_refused_and_file_names_are_escaped(tmp_path, digits_dir):
    source = str(tmp_path / "in")
    _class_tree(source, digits_dir, ["a", "b"])
    image = open(_digits(digits_dir, 5, 1)[0], "rb").read()
    with open(os.path.join(os.fsencode(source), b"a", b"caf\xe9.jpg"), "wb") as handle:
        handle.write(image)  # a Latin-1 file name: stored escaped, not a crash mid-way
    out = str(tmp_path / "out")
    info = dataset.build_dataset(source, out, 0.0, train_shards=1, show_progress=False)
    assert info["splits"]["train"]["count"] == 7
    assert "caf\\xe9.jpg" in {name for _, _, name in _records(out, "train")}
    os.makedirs(os.path.join(os.fsencode(source), b"caf\xe9"))
    with pytest.raises(dataset.DatasetError, match="not valid UTF-8"):
        dataset.build_dataset(source, str(tmp_path / "out2"), show_progress=False)


# --- CSVs and classes without images ---------------------------------------------------

def test_csv_with_byte_order_mark_has_no_class_named_label(tmp_path, digits_dir):
    rows = ["path,label"] + ["%s,%s" % (path, "cat") for path in _digits(digits_dir, 0, 3)] + [
        "%s,%s" % (path, "dog") for path in _digits(digits_dir, 1, 3)]
    csv_path = tmp_path / "excel.csv"
    csv_path.write_bytes(("\n".join(rows) + "\n").encode("utf-8-sig"))  # as Excel saves it
    info = dataset.build_dataset(str(csv_path), str(tmp_path / "out"), 0.34,
                                 show_progress=False)
    assert info["labels"] == ["cat", "dog"]
    assert info["dropped_classes"] == {} and info["skipped"] == []
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(("%s,caf\xe9\n" % _digits(digits_dir, 0, 1)[0]).encode("latin-1"))
    with pytest.raises(dataset.DatasetError, match=r"latin1\.csv is not UTF-8 text"):
        dataset.build_dataset(str(latin1), str(tmp_path / "out2"), show_progress=False)


def test_classes_without_a_usable_image_are_left_out_and_reported(tmp_path, digits_dir):
    """A missing CSV file, a folder of bad files and an empty folder add no class."""
    source = tmp_path / "in"
    _class_tree(str(source), digits_dir, ["a", "broken", "c"])
    for name in os.listdir(source / "broken"):
        (source / "broken" / name).write_bytes(b"\xff\xd8 not really a jpeg")
    os.makedirs(source / "empty")
    out = str(tmp_path / "out")
    info = dataset.build_dataset(str(source), out, 0.34, train_shards=2,
                                 validation_shards=1, show_progress=False)
    assert info["labels"] == ["a", "c"] and info["num_classes"] == 2
    assert schema.read_labels(os.path.join(out, schema.LABELS_FILE)) == ["a", "c"]
    assert set(info["dropped_classes"]) == {"broken", "empty"}
    assert "no usable training image" in info["dropped_classes"]["broken"]
    assert "holds no image files" in info["dropped_classes"]["empty"]
    assert json.load(open(os.path.join(out, schema.INFO_FILE)))["dropped_classes"] == info[
        "dropped_classes"]
    for split in schema.SPLITS:  # ids renumbered 0..N-1 and consistent with labels.txt
        for label, text, _ in _records(out, split):
            assert info["labels"][label] == text
    assert info["splits"]["train"]["per_class"] == {"a": 2, "c": 2}
    summary = "\n".join(dataset.format_summary(info, out))
    assert "class 'broken' left out" in summary and "class 'empty' left out" in summary

    csv_path = tmp_path / "list.csv"
    rows = ["%s,cat" % path for path in _digits(digits_dir, 0, 3)]
    rows.append("%s,ghost" % (tmp_path / "no_such.jpg"))
    csv_path.write_text("\n".join(rows) + "\n")
    info = dataset.build_dataset(str(csv_path), str(tmp_path / "csv_out"), 0.0,
                                 show_progress=False)
    assert info["labels"] == ["cat"] and list(info["dropped_classes"]) == ["ghost"]
    assert [e["reason"] for e in info["skipped"]] == ["unreadable: No such file or directory"]


def test_validation_images_of_a_dropped_class_are_skipped_not_mislabelled(tmp_path,
                                                                           digits_dir):
    train, validation = tmp_path / "train", tmp_path / "validation"
    _class_tree(str(train), digits_dir, ["a", "b", "c"])
    _class_tree(str(validation), digits_dir, ["a", "b", "c"], count=1)
    for name in os.listdir(train / "b"):
        (train / "b" / name).write_bytes(b"")
    out = str(tmp_path / "out")
    info = dataset.build_dataset(str(train), out, validation_input=str(validation),
                                 train_shards=1, validation_shards=1, show_progress=False)
    assert info["labels"] == ["a", "c"]
    assert sorted(text for _, text, _ in _records(out, "validation")) == ["a", "c"]
    assert [label for label, text, _ in _records(out, "validation") if text == "c"] == [1]
    dropped_validation = [e for e in info["skipped"] if e["split"] == "validation"]
    assert len(dropped_validation) == 1
    assert "'b' has no usable training image" in dropped_validation[0]["reason"]


def test_no_usable_image_at_all_fails_and_publishes_nothing(tmp_path):
    source = tmp_path / "in"
    os.makedirs(source / "a")
    (source / "a" / "x.jpg").write_bytes(b"")
    with pytest.raises(dataset.DatasetError, match=r"no usable training image.*x\.jpg"):
        dataset.build_dataset(str(source), str(tmp_path / "out"), 0.0, show_progress=False)
    assert os.listdir(tmp_path / "out") == [dataset.PARTIAL_DIR]  # staging only


# --- files that are not regular files ------------------------------------------------

_BUILD_SCRIPT = textwrap.dedent("""
    import json, sys
    from slimserve.estimator import dataset
    from slimserve.estimator import splits
    infos = [dataset.build_dataset(source, out, 0.0, train_shards=1, num_workers=1,
                                   max_file_bytes=int(sys.argv[3]), show_progress=False)
             for source, out in (sys.argv[1].split("|"), sys.argv[2].split("|"))]
    try:  # a FIFO given as the input CSV
        dataset.build_dataset(sys.argv[4], sys.argv[4] + ".out", show_progress=False)
    except dataset.DatasetError as error:
        infos.append({"skipped": str(error)})
    print(json.dumps([info["skipped"] for info in infos]))
""")


MEMORY_CAP = 4 * 1024 ** 3  # TF's import maps ~1.5 GB; /dev/zero read whole would pass it


def test_fifo_devices_dangling_links_and_huge_files_are_skipped_not_read(tmp_path,
                                                                       digits_dir):
    """Runs the converter in a subprocess under a deadline and a memory cap, so a
    regression (blocking on the FIFO, reading /dev/zero) fails instead of hanging."""
    source = tmp_path / "in"
    _class_tree(str(source), digits_dir, ["a"])
    os.mkfifo(source / "a" / "pipe.jpg")
    os.symlink("/dev/zero", source / "a" / "zero.jpg")
    os.symlink(str(tmp_path / "gone.jpg"), source / "a" / "dangling.jpg")
    os.symlink(str(source / "a"), source / "a" / "loop")  # a folder link is not followed
    padded = open(_digits(digits_dir, 0, 1)[0], "rb").read() + b"\0" * (2 << 20)
    (source / "a" / "huge.jpg").write_bytes(padded)  # decodes fine, but 2 MiB > the cap
    os.makedirs(tmp_path / "folder.jpg")
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("%s,a\n%s,a\n%s,a\n" % (_digits(digits_dir, 0, 1)[0],
                                                tmp_path / "folder.jpg", "/dev/zero"))
    # Capped by the servers' launcher, not a preexec_fn (it runs in a fork of this
    # multi-threaded process, which is unsafe before exec).
    process = subprocess.Popen(
        server_process.launcher_argv(
            [sys.executable, "-c", _BUILD_SCRIPT, "%s|%s" % (source, tmp_path / "out1"),
             "%s|%s" % (csv_path, tmp_path / "out2"), str(1 << 20),
             str(source / "a" / "pipe.jpg")], MEMORY_CAP),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        start_new_session=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the converter and its pool workers
        process.communicate()
        pytest.fail("converter still running after 180 s: blocked on a FIFO or device?")
    assert process.returncode == 0, stderr[-3000:]
    folder_skips, csv_skips, fifo_input = json.loads(stdout.strip().splitlines()[-1])
    assert fifo_input == "input is neither a folder nor a regular file: %s" % (
        source / "a" / "pipe.jpg")
    reasons = {os.path.basename(e["path"]): e["reason"] for e in folder_skips}
    assert reasons == {
        "pipe.jpg": "not a regular file: a FIFO (named pipe)",
        "zero.jpg": "not a regular file: a character device",
        "dangling.jpg": "dangling symlink (target %r does not exist)" % str(
            tmp_path / "gone.jpg"),
        "loop": "symlink to a folder (not followed)",
        "huge.jpg": "file too large: %d bytes > max_file_bytes=%d" % (len(padded), 1 << 20),
    }
    assert {os.path.basename(e["path"]): e["reason"] for e in csv_skips} == {
        "folder.jpg": "not a regular file: a directory",
        "zero": "not a regular file: a character device"}
    assert [n for n in os.listdir(tmp_path / "out1") if n.startswith("train")]


def test_decompression_bomb_is_skipped_before_decoding(tmp_path):
    """A 22 KB PNG declaring 180 million pixels: refused from its header, not decoded."""
    width, height = 20000, 9000

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    rows = zlib.compress((b"\0" * (1 + width // 8)) * height, 9)
    path = tmp_path / "bomb.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(
        ">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + chunk(b"IDAT", rows) + chunk(b"IEND", b""))
    assert path.stat().st_size < 64 * 1024
    reason = image_files.convert_file(str(path)).skip_reason
    assert reason.startswith("too many pixels to decode safely")
