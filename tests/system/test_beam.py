"""The Beam conversion (DirectRunner, two worker processes) against the local converter on
real digits: same split membership, same shard names, same record bytes, same
labels.txt and dataset_info.json, including files skipped for a reason."""
import glob
import json
import os
import shutil

import pytest
import tensorflow as tf
from PIL import Image
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

from slimserve import errors as user_errors
from slimserve.estimator import beam_dataset
from slimserve.estimator import dataset
from slimserve.estimator import schema
from slimserve.cli import beam as beam_cli
from tests.helpers import run_cli


MAX_FILE_BYTES = 64 * 1024
FRACTION, SEED = 0.25, 7


@pytest.fixture(scope="module")
def images_with_bad_files(digits_dir, tmp_path_factory):
    """A trimmed copy of digits (5 classes) with a truncated PNG, a non-image, a TIFF
    (a serving note), a FIFO, a file over MAX_FILE_BYTES, a hidden file, an empty class
    folder and a class "4" whose training files are all broken (dropped; its
    validation files are skipped)."""
    root = tmp_path_factory.mktemp("beam_input") / "images"
    for label in ("0", "1", "2", "3", "4"):
        shutil.copytree(os.path.join(digits_dir, label), root / label)
    first = sorted(os.listdir(root / "2"))[0]
    data = (root / "2" / first).read_bytes()
    (root / "2" / first).write_bytes(data[: len(data) // 2])
    Image.open(root / "3" / sorted(os.listdir(root / "3"))[0]).save(root / "3" / "scan.tif")
    (root / "3" / "notes.png").write_text("not an image")
    os.mkfifo(root / "1" / "pipe.jpg")
    (root / "1" / "huge.png").write_bytes(data + b"\0" * MAX_FILE_BYTES)
    (root / "1" / ".hidden.png").write_bytes(data)
    os.makedirs(root / "empty")
    the_plan = dataset.plan(str(root), FRACTION, seed=SEED)
    for item in the_plan.items[schema.TRAIN]:
        if item.label == "4":
            with open(item.path, "wb") as handle:
                handle.write(b"\xff\xd8 not really a jpeg")
    return str(root)


class ObjectStoreOnDisk(LocalFileSystem):
    """A Beam filesystem for `slimtest://<local path>` URLs: a remote scheme the
    converter can only reach through Beam's FileSystems (as gs:// without a bucket).
    Registered by being imported; runs in-process (DirectRunner, one worker)."""
    PREFIX = "slimtest://"

    @classmethod
    def scheme(cls):
        return "slimtest"

    def _local(self, path):  # LocalFileSystem's own methods call these with local paths
        return path[len(self.PREFIX):] if path.startswith(self.PREFIX) else path

    def exists(self, path):
        return super().exists(self._local(path))

    def size(self, path):
        return super().size(self._local(path))

    def metadata(self, path):
        found = super().metadata(self._local(path))
        return FileMetadata(path, found.size_in_bytes, found.last_updated_in_seconds)

    def _list(self, dir_or_prefix):
        for found in super()._list(self._local(dir_or_prefix)):
            yield FileMetadata(self.PREFIX + found.path, found.size_in_bytes,
                               found.last_updated_in_seconds)

    def _path_open(self, path, mode, *args, **kwargs):  # pylint: disable=arguments-differ
        return super()._path_open(self._local(path), mode, *args, **kwargs)


def records_by_shard(data_dir):
    return {os.path.basename(path): [bytes(r.numpy()) for r in tf.data.TFRecordDataset(path)]
            for path in sorted(glob.glob(os.path.join(data_dir, "*-of-*")))}


@pytest.mark.cost(8)
def test_beam_conversion_equals_local_converter(images_with_bad_files, tmp_path):
    local, beam = str(tmp_path / "local"), str(tmp_path / "beam")
    local_info = dataset.build_dataset(images_with_bad_files, local, validation_fraction=FRACTION,
                                       train_shards=3, validation_shards=2, seed=SEED,
                                       max_file_bytes=MAX_FILE_BYTES, show_progress=False)
    run_cli("slimserve.cli.convert", "--input", images_with_bad_files, "--output_dir", beam,
            "--validation_fraction", FRACTION, "--train_shards", 3, "--validation_shards", 2,
            "--seed", SEED, "--max_file_bytes", MAX_FILE_BYTES, "--runner", "DirectRunner",
            "--beam_options", "--direct_num_workers=2 --direct_running_mode=multi_processing",
            timeout=300)
    with open(os.path.join(beam, schema.INFO_FILE)) as handle:
        beam_info = json.load(handle)
    with open(os.path.join(local, schema.INFO_FILE)) as handle:
        assert beam_info == json.load(handle)
    # The cases the equality covers really occurred (an info without them would match too).
    assert beam_info["labels"] == ["0", "1", "2", "3"]
    assert sorted(beam_info["dropped_classes"]) == ["4", "empty"]
    assert beam_info["max_file_bytes"] == MAX_FILE_BYTES
    assert [os.path.basename(e["path"]) for e in beam_info["serving_notes"]] == ["scan.tif"]
    reasons = {(os.path.basename(e["path"]), e["class"]): e["reason"]
               for e in beam_info["skipped"] if "class" in e}
    first = sorted(os.listdir(os.path.join(images_with_bad_files, "2")))[0]
    assert reasons[("pipe.jpg", "1")] == "not a regular file: a FIFO (named pipe)"
    assert reasons[("huge.png", "1")].startswith("file too large:")
    assert reasons[(first, "2")].startswith("corrupt or truncated")
    assert reasons[("notes.png", "3")] == "not an image (unrecognised format)"
    dropped_validation = [e for e in beam_info["skipped"]
                          if e.get("split") == schema.VALIDATION and e["class"] == "4"]
    assert dropped_validation and all(e["reason"] == "class '4' has no usable training image"
                                      for e in dropped_validation)
    assert beam_info["splits"]["train"]["per_class"] == local_info["splits"]["train"][
        "per_class"]
    local_records, beam_records = records_by_shard(local), records_by_shard(beam)
    assert sorted(beam_records) == ["train-00000-of-00003", "train-00001-of-00003",
                                    "train-00002-of-00003", "validation-00000-of-00002",
                                    "validation-00001-of-00002"]
    assert beam_records == local_records  # membership, order, bytes, renumbered ids
    for name in (schema.LABELS_FILE,):
        with open(os.path.join(local, name), "rb") as a, open(os.path.join(beam, name), "rb") as b:
            assert a.read() == b.read()
    assert not os.path.exists(os.path.join(beam, dataset.PARTIAL_DIR))


def test_beam_plan_follows_seed_and_fraction(images_with_bad_files):
    """Another seed moves files between splits in both converters alike (a plan that
    ignored the seed would pass the equality test above only by luck)."""
    splits = {}
    for seed in (7, 8):
        planned = beam_dataset.planned_files(
            dataset.plan(images_with_bad_files, 0.25, None, 3, 2, seed))
        splits[seed] = {p.path for p in planned if p.split == schema.VALIDATION}
        train, validation = dataset.stratified_split(
            dataset.read_input(images_with_bad_files)[0], 0.25, seed)
        assert splits[seed] == {item.path for item in validation}
    assert splits[7] != splits[8]


def test_unknown_runner_and_missing_beam_are_named(images_with_bad_files, tmp_path):
    with pytest.raises(user_errors.UserError, match="--runner must be one of"):
        beam_cli.pipeline_options("LocalRunner")
    # Without apache_beam importable the error names the extra to install.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "nobeam"), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "nobeam" / "apache_beam").mkdir(parents=True)
    (tmp_path / "nobeam" / "apache_beam" / "__init__.py").write_text(
        "raise ImportError('hidden for this test')\n")
    process = run_cli("slimserve.cli.convert", "--input", images_with_bad_files,
                      "--output_dir", tmp_path / "out", "--runner", "DirectRunner",
                      check=False, env=env, timeout=120)
    assert process.returncode != 0
    assert "pip install 'slimserve[beam]'" in process.stderr
    assert not os.path.exists(tmp_path / "out" / schema.INFO_FILE)


def test_remote_folder_and_csv_are_read_through_beam_filesystems(digits_dir, tmp_path):
    """A remote folder and a remote CSV (relative rows) give the local converter's
    records and info, paths aside; the size cap is applied before reading."""
    source = tmp_path / "images"
    for label in ("0", "1", "2"):
        os.makedirs(source / label)
        for name in sorted(os.listdir(os.path.join(digits_dir, label)))[:12]:
            shutil.copy(os.path.join(digits_dir, label, name), source / label)
    data = (source / "0" / sorted(os.listdir(source / "0"))[0]).read_bytes()
    (source / "1" / "huge.png").write_bytes(data + b"\0" * MAX_FILE_BYTES)
    (source / "2" / "broken.png").write_bytes(b"not an image")
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("path,label\n" + "".join(
        "images/%s/%s,%s\n" % (label, name, label) for label in ("0", "1", "2")
        for name in sorted(os.listdir(source / label))))
    settings = dict(validation_fraction=FRACTION, train_shards=2, validation_shards=1,
                    seed=SEED, max_file_bytes=MAX_FILE_BYTES)
    for input_path in (str(source), str(csv_path)):
        local, remote = str(tmp_path / "local"), str(tmp_path / "remote")
        local_info = dataset.build_dataset(input_path, local, show_progress=False,
                                           overwrite=True, **settings)
        remote_info = beam_dataset.build_dataset(
            ObjectStoreOnDisk.PREFIX + input_path, remote,
            beam_cli.pipeline_options("DirectRunner"), overwrite=True, **settings)
        assert {os.path.basename(e["path"]): e["reason"] for e in remote_info["skipped"]} == {
            "huge.png": "file too large: %d bytes > max_file_bytes=%d"
                        % (len(data) + MAX_FILE_BYTES, MAX_FILE_BYTES),
            "broken.png": "not an image (unrecognised format)"}
        assert all(e["path"].startswith(ObjectStoreOnDisk.PREFIX)
                   for e in remote_info["skipped"])
        assert json.loads(json.dumps(remote_info).replace(ObjectStoreOnDisk.PREFIX, "")) == \
            json.loads(json.dumps(local_info))
        assert records_by_shard(remote) == records_by_shard(local)


def test_remote_class_names_are_checked_as_local_ones(digits_dir, tmp_path):
    folder = tmp_path / "images" / "bell\x07"
    os.makedirs(folder)
    shutil.copy(os.path.join(digits_dir, "0", sorted(os.listdir(
        os.path.join(digits_dir, "0")))[0]), folder)
    for path in (str(tmp_path / "images"), ObjectStoreOnDisk.PREFIX + str(tmp_path / "images")):
        with pytest.raises(dataset.DatasetError, match=r"class name 'bell\\x07' from folder "
                                                       r".*contains control character"):
            beam_dataset.read_input(path)


def test_grouped_split_is_the_same_on_beam(digits_dir, tmp_path):
    """--group_regex is part of the shared plan: Beam keeps the same groups whole, with
    the same records and the same dataset_info.json (groups included)."""
    root = tmp_path / "images"
    for label in ("0", "5"):
        names = sorted(os.listdir(os.path.join(digits_dir, label)))[:24]
        for index, name in enumerate(names):
            folder = root / label / ("camera_%d" % (index // 4))
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(os.path.join(digits_dir, label, name), folder)
    settings = dict(validation_fraction=0.34, train_shards=2, validation_shards=1, seed=SEED,
                    group_regex="^[^/]+/([^/]+)/")
    local, beam = str(tmp_path / "local"), str(tmp_path / "beam")
    local_info = dataset.build_dataset(str(root), local, show_progress=False, **settings)
    beam_info = beam_dataset.build_dataset(str(root), beam,
                                           beam_cli.pipeline_options("DirectRunner"),
                                           **settings)
    assert beam_info == local_info
    assert beam_info["groups"] == {"group_regex": "^[^/]+/([^/]+)/", "train": 4,
                                   "validation": 2}
    assert records_by_shard(beam) == records_by_shard(local)
