"""Dataset builder on real digits images, with planted bad files."""
import io
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from slimserve.estimator import dataset
from slimserve.estimator import schema
from slimserve.estimator import splits


def _records(data_dir, split):
    return splits.read_examples(data_dir, split)


def test_digits_round_trip_counts_and_labels(digits_dir, digits_data):
    info = json.load(open(os.path.join(digits_data, schema.INFO_FILE)))
    names = schema.read_labels(os.path.join(digits_data, schema.LABELS_FILE))
    assert names == [str(i) for i in range(10)]
    source = {name: len(os.listdir(os.path.join(digits_dir, name))) for name in names}
    assert sum(source.values()) == 1797
    seen = {}
    for split in schema.SPLITS:
        examples = _records(digits_data, split)
        assert len(examples) == info["splits"][split]["count"]
        for example in examples:
            feature = example.features.feature
            label = feature[schema.LABEL].int64_list.value[0]
            text = feature[schema.TEXT].bytes_list.value[0].decode()
            assert names[label] == text
            filename = feature[schema.FILENAME].bytes_list.value[0].decode()
            seen[(text, filename)] = split
            assert feature[schema.FORMAT].bytes_list.value[0] == b"jpeg"
    # Every image lands in exactly one split, with its folder's label.
    assert len(seen) == 1797
    assert {t for t, _ in seen} == set(names)
    # Stratified: each class holds out round(20%).
    for name in names:
        held_out = sum(1 for (t, _), s in seen.items() if t == name and s == "validation")
        assert held_out == int(round(source[name] * 0.2))


def test_valid_jpeg_is_stored_byte_for_byte_and_png_becomes_jpeg(digits_dir, digits_data):
    """Chooses a JPEG and a PNG record on purpose (the digits tree mixes both)."""
    by_kind = {}
    for example in _records(digits_data, "train"):
        feature = example.features.feature
        filename = feature[schema.FILENAME].bytes_list.value[0].decode()
        by_kind.setdefault(os.path.splitext(filename)[1], feature)
    assert {".jpg", ".png"} <= set(by_kind)
    for kind, feature in by_kind.items():
        filename = feature[schema.FILENAME].bytes_list.value[0].decode()
        label = feature[schema.TEXT].bytes_list.value[0].decode()
        stored = feature[schema.ENCODED].bytes_list.value[0]
        original = open(os.path.join(digits_dir, label, filename), "rb").read()
        if kind == ".jpg":
            assert stored == original
        else:
            assert stored != original and stored[:2] == b"\xff\xd8"  # PNG re-encoded


def _planted_tree(root, digits_dir):
    for name in ("a", "b"):
        os.makedirs(os.path.join(root, name))
        for source in sorted(os.listdir(os.path.join(digits_dir, str(len(name)))))[:6]:
            shutil.copy(os.path.join(digits_dir, str(len(name)), source),
                        os.path.join(root, name, source))
    rgb = np.random.RandomState(0).randint(0, 255, (20, 30, 3), np.uint8)
    Image.fromarray(rgb).convert("CMYK").save(os.path.join(root, "a", "cmyk.jpg"))
    Image.fromarray(rgb[..., 0]).save(os.path.join(root, "a", "grey.jpg"))
    Image.fromarray(rgb).save(os.path.join(root, "b", "photo.png"))
    Image.fromarray(rgb).save(os.path.join(root, "b", "photo.bmp"))
    Image.fromarray(rgb).convert("P").save(os.path.join(root, "b", "anim.gif"))
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG")
    open(os.path.join(root, "a", "truncated.jpg"), "wb").write(buffer.getvalue()[:200])
    open(os.path.join(root, "a", "empty.jpg"), "wb").close()
    open(os.path.join(root, "b", "notes.txt"), "w").write("not an image")
    open(os.path.join(root, "stray.jpg"), "wb").write(buffer.getvalue())
    open(os.path.join(root, "b", ".DS_Store"), "wb").write(b"\0\0")


def test_planted_files_convert_or_skip_with_reasons(tmp_path, digits_dir):
    _planted_tree(str(tmp_path / "in"), digits_dir)
    info = dataset.build_dataset(str(tmp_path / "in"), str(tmp_path / "out"),
                                 validation_fraction=0.25, train_shards=2,
                                 validation_shards=1, show_progress=False)
    skipped = {os.path.relpath(e["path"], str(tmp_path / "in")): e["reason"]
               for e in info["skipped"]}
    assert set(skipped) == {"a/truncated.jpg", "a/empty.jpg", "b/notes.txt", "stray.jpg",
                            "b/.DS_Store"}
    assert skipped["a/empty.jpg"] == "empty file"
    assert skipped["a/truncated.jpg"].startswith("corrupt or truncated")
    assert skipped["b/notes.txt"].startswith("not an image")
    assert skipped["stray.jpg"] == "not inside a class folder"
    total = sum(info["splits"][s]["count"] for s in schema.SPLITS)
    assert total == 12 + 5  # six digits per class + cmyk, grey, png, bmp, gif
    examples = _records(str(tmp_path / "out"), "train") + _records(str(tmp_path / "out"),
                                                                    "validation")
    for example in examples:
        feature = example.features.feature
        encoded = feature[schema.ENCODED].bytes_list.value[0]
        image = tf.io.decode_jpeg(encoded, channels=3)  # as training and serving decode
        assert image.shape[-1] == feature[schema.CHANNELS].int64_list.value[0] == 3
        name = feature[schema.FILENAME].bytes_list.value[0].decode()
        if name in ("grey.jpg", "cmyk.jpg"):  # JPEGs TF decodes are kept byte-for-byte
            assert encoded == open(tmp_path / "in" / "a" / name, "rb").read()
    assert json.load(open(tmp_path / "out" / schema.INFO_FILE))["skipped"] == info["skipped"]


def test_csv_input_and_reproducible_split(tmp_path, digits_dir):
    rows = ["path,label"]
    for label in ("3", "7"):
        for name in sorted(os.listdir(os.path.join(digits_dir, label)))[:10]:
            rows.append("%s,%s" % (os.path.join(digits_dir, label, name), "digit" + label))
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("\n".join(rows) + "\n")
    first = dataset.build_dataset(str(csv_path), str(tmp_path / "one"), 0.3, seed=5,
                                  train_shards=2, validation_shards=1, show_progress=False)
    second = dataset.build_dataset(str(csv_path), str(tmp_path / "two"), 0.3, seed=5,
                                   train_shards=2, validation_shards=1, show_progress=False)
    assert first["labels"] == second["labels"] == ["digit3", "digit7"]
    for split in schema.SPLITS:
        a = [e.SerializeToString() for e in _records(str(tmp_path / "one"), split)]
        b = [e.SerializeToString() for e in _records(str(tmp_path / "two"), split)]
        assert a == b
    assert first["splits"]["validation"]["per_class"] == {"digit3": 3, "digit7": 3}


def test_bad_csv_names_the_line(tmp_path):
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("a.jpg,cat\nb.jpg\n")
    with pytest.raises(dataset.DatasetError, match=r"bad\.csv:2: expected 2 columns"):
        dataset.build_dataset(str(csv_path), str(tmp_path / "out"), show_progress=False)


def test_refuses_existing_output_and_overwrite_replaces_it(tmp_path, digits_dir):
    source = tmp_path / "in"
    _planted_tree(str(source), digits_dir)
    out = str(tmp_path / "out")
    dataset.build_dataset(str(source), out, 0.25, train_shards=3, validation_shards=1,
                          show_progress=False)
    before = sorted(os.listdir(out))
    with pytest.raises(dataset.DatasetError, match="--overwrite"):
        dataset.build_dataset(str(source), out, 0.25, show_progress=False)
    assert sorted(os.listdir(out)) == before
    dataset.build_dataset(str(source), out, 0.25, train_shards=1, validation_shards=1,
                          overwrite=True, show_progress=False)
    assert sorted(n for n in os.listdir(out) if n.startswith("train")) == [
        "train-00000-of-00001"]


def test_failure_midway_leaves_no_finished_looking_shard(tmp_path, digits_dir, monkeypatch):
    source = tmp_path / "in"
    _planted_tree(str(source), digits_dir)
    out = tmp_path / "out"
    real = dataset._write_split  # pylint: disable=protected-access
    calls = []

    def fail_on_validation(split, *args, **kwargs):
        calls.append(split)
        if split == "validation":
            raise KeyboardInterrupt("simulated interruption")
        return real(split, *args, **kwargs)

    monkeypatch.setattr(dataset, "_write_split", fail_on_validation)
    with pytest.raises(KeyboardInterrupt):
        dataset.build_dataset(str(source), str(out), 0.25, train_shards=2,
                              validation_shards=1, show_progress=False)
    assert calls == ["train", "validation"]
    assert [n for n in os.listdir(out) if not n.startswith(".")] == []
    monkeypatch.setattr(dataset, "_write_split", real)
    info = dataset.build_dataset(str(source), str(out), 0.25, train_shards=2,
                                 validation_shards=1, show_progress=False)
    assert info["splits"]["train"]["count"] > 0
    assert dataset.PARTIAL_DIR not in os.listdir(out)


def test_max_shorter_side_shrinks_large_images_only(tmp_path, digits_dir):
    import make_photos  # pylint: disable=import-outside-toplevel
    source = tmp_path / "in"
    make_photos.write_photos(str(source / "photos"), 6)  # 500x375 JPEGs
    small = sorted(f for f in os.listdir(os.path.join(digits_dir, "3")) if f.endswith(".jpg"))
    os.makedirs(source / "digits")
    for name in small[:4]:  # 32x32, below the limit: kept byte-for-byte
        shutil.copy(os.path.join(digits_dir, "3", name), source / "digits" / name)
    out = str(tmp_path / "out")
    with pytest.raises(dataset.DatasetError, match="--max_shorter_side"):
        dataset.build_dataset(str(source), out, 0.0, max_shorter_side=-1, show_progress=False)
    info = dataset.build_dataset(str(source), out, 0.0, train_shards=2, max_shorter_side=48,
                                 show_progress=False)
    assert info["max_shorter_side"] == 48
    sizes = {}
    for example in _records(out, "train"):
        feature = example.features.feature
        label = feature[schema.TEXT].bytes_list.value[0].decode()
        stored = feature[schema.ENCODED].bytes_list.value[0]
        height, width = feature[schema.HEIGHT].int64_list.value[0], feature[
            schema.WIDTH].int64_list.value[0]
        assert tf.io.decode_jpeg(stored).shape.as_list() == [height, width, 3]
        sizes.setdefault(label, set()).add((height, width))
        if label == "digits":
            name = feature[schema.FILENAME].bytes_list.value[0].decode()
            assert stored == open(source / "digits" / name, "rb").read()
    assert sizes == {"photos": {(48, 64)}, "digits": {(32, 32)}}


def _grouped_tree(root, digits_dir, groups_per_class=6, per_group=5):
    """<class>/<source_NN>/<image>: three digit classes whose images come in sources;
    the sources' names are shared across classes (a source holds several classes, as a
    patient has healthy and sick tissue), so the split must keep a source whole across
    classes too."""
    for label in ("1", "4", "7"):
        names = sorted(os.listdir(os.path.join(digits_dir, label)))
        for index in range(groups_per_class * per_group):
            group = "source_%02d" % (index // per_group + (3 if label == "7" else 0))
            folder = os.path.join(root, label, group)
            os.makedirs(folder, exist_ok=True)
            shutil.copy(os.path.join(digits_dir, label, names[index]), folder)
    return str(root)


def _groups_of(data_dir, split, root):
    """{source folder: count} of a converted split, from the records' own file names."""
    by_name = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            by_name[name] = os.path.basename(dirpath)
    found = {}
    for example in _records(data_dir, split):
        name = example.features.feature[schema.FILENAME].bytes_list.value[0].decode()
        found[by_name[name]] = found.get(by_name[name], 0) + 1
    return found


def _paths_of(data_dir, root):
    """The validation records' images as paths relative to `root`."""
    relative = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            relative[name] = os.path.relpath(os.path.join(dirpath, name), root)
    return {relative[e.features.feature[schema.FILENAME].bytes_list.value[0].decode()]
            for e in _records(data_dir, schema.VALIDATION)}


def test_group_regex_keeps_each_group_in_one_split_stratified_and_seeded(tmp_path, digits_dir):
    root = _grouped_tree(tmp_path / "images", digits_dir)
    regex = "^[^/]+/([^/]+)/"
    info = dataset.build_dataset(root, str(tmp_path / "grouped"), 0.34, seed=3,
                                 train_shards=2, validation_shards=1, show_progress=False,
                                 group_regex=regex)
    train = _groups_of(str(tmp_path / "grouped"), schema.TRAIN, root)
    validation = _groups_of(str(tmp_path / "grouped"), schema.VALIDATION, root)
    assert train and validation and not set(train) & set(validation)
    # dataset_info.json says how the split was made.
    on_disk = json.load(open(tmp_path / "grouped" / schema.INFO_FILE))
    assert on_disk["groups"] == {"group_regex": regex, "train": len(train),
                                 "validation": len(validation)} == info["groups"]
    # Every class is in both splits, near the fraction (whole groups of 5 images each).
    for label in ("1", "4", "7"):
        held_out = info["splits"]["validation"]["per_class"][label]
        assert 5 <= held_out <= 15, (label, held_out)
    # The same seed gives the same split; another seed another one.
    again = dataset.plan(root, 0.34, seed=3, group_regex=regex)
    assert again == dataset.plan(root, 0.34, seed=3, group_regex=regex)
    assert {i.path for i in again.items[schema.VALIDATION]} == {
        os.path.join(root, name) for name in _paths_of(str(tmp_path / "grouped"), root)}
    other = dataset.plan(root, 0.34, seed=4, group_regex=regex)
    assert {i.path for i in again.items[schema.VALIDATION]} != {
        i.path for i in other.items[schema.VALIDATION]}
    # Per image, the same sources land on both sides (what the option prevents).
    leaky = dataset.plan(root, 0.34, seed=3)
    leaky_sources = [{os.path.basename(os.path.dirname(i.path)) for i in leaky.items[split]}
                     for split in schema.SPLITS]
    assert leaky_sources[0] & leaky_sources[1]


def test_group_regex_refuses_ungrouped_images_bad_patterns_and_shared_groups(tmp_path,
                                                                           digits_dir):
    root = _grouped_tree(tmp_path / "images", digits_dir, groups_per_class=2)
    loose = os.path.join(root, "4", "loose.png")
    shutil.copy(os.path.join(digits_dir, "4", sorted(os.listdir(
        os.path.join(digits_dir, "4")))[50]), loose)
    with pytest.raises(dataset.DatasetError, match=r"finds no group in 1 of 31 paths "
                       r"\(first: 4/loose\.png\)"):
        dataset.plan(root, 0.3, group_regex="^[^/]+/([^/]+)/")
    with pytest.raises(dataset.DatasetError, match="is not a regular expression"):
        dataset.plan(root, 0.3, group_regex="([")
    os.remove(loose)
    # A separate validation input that shares a group with --input leaks: refused.
    validation = _grouped_tree(tmp_path / "validation", digits_dir, groups_per_class=1)
    with pytest.raises(dataset.DatasetError, match="in both --input and --validation_input "
                       r"\(first: source_00"):
        dataset.plan(root, validation_input=validation, group_regex="^[^/]+/([^/]+)/")
    # A CSV's paths are matched as the CSV writes them.
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("path,label\n" + "".join(
        "images/%s/%s/%s,%s\n" % (label, group, name, label)
        for label in ("1", "4") for group in sorted(os.listdir(os.path.join(root, label)))
        for name in sorted(os.listdir(os.path.join(root, label, group)))))
    planned = dataset.plan(str(csv_path), 0.5, group_regex=r"(source_\d+)")
    assert planned.groups["train"] + planned.groups["validation"] == 2
