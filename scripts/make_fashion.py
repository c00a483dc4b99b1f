"""Writes Fashion-MNIST images (Debian's `dataset-fashion-mnist` package) as an image
folder tree `<output_dir>/<class name>/fashion_NNNNN.png`: a second real data set, harder
than the digits, for measuring training recipes offline.

    apt-get install dataset-fashion-mnist
    python scripts/make_fashion.py --output_dir=fashion --per_class=200

The first `--per_class` images of each class from the package's training split (or
`--split=test`), 28x28 greyscale PNG, as a user's own photos would arrive.
"""
import argparse
import gzip
import os
import struct
import sys

import numpy as np
from PIL import Image

DEFAULT_SOURCE = "/usr/share/datasets/fashion-mnist"
# The data set's own class names (its README), in label order; folder-safe spelling.
CLASS_NAMES = ("tshirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
               "sneaker", "bag", "ankle_boot")
_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(source, split):
    """(images uint8 [N, 28, 28], labels uint8 [N]) from the package's IDX files."""
    image_file, label_file = (os.path.join(source, name) for name in _FILES[split])
    with gzip.open(label_file, "rb") as handle:
        magic, count = struct.unpack(">II", handle.read(8))
        if magic != 2049:
            raise ValueError("%s is not an IDX label file" % label_file)
        labels = np.frombuffer(handle.read(count), np.uint8)
    with gzip.open(image_file, "rb") as handle:
        magic, count, rows, cols = struct.unpack(">IIII", handle.read(16))
        if magic != 2051:
            raise ValueError("%s is not an IDX image file" % image_file)
        images = np.frombuffer(handle.read(count * rows * cols), np.uint8)
    return images.reshape(count, rows, cols), labels


def write_fashion(output_dir, per_class=200, split="train", source=DEFAULT_SOURCE):
    images, labels = read_idx(source, split)
    written = [0] * len(CLASS_NAMES)
    for index, (pixels, label) in enumerate(zip(images, labels)):
        if written[label] >= per_class:
            continue
        folder = os.path.join(output_dir, CLASS_NAMES[label])
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(pixels, mode="L").save(
            os.path.join(folder, "fashion_%05d.png" % index))
        written[label] += 1
        if min(written) >= per_class:
            break
    return sum(written)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="Folder to create.")
    parser.add_argument("--per_class", type=int, default=200,
                        help="Images per class (10 classes).")
    parser.add_argument("--split", choices=sorted(_FILES), default="train",
                        help="The package's split to read.")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help="Folder of the IDX files (apt-get install dataset-fashion-mnist).")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.source):
        sys.exit("make_fashion: %s does not exist; apt-get install dataset-fashion-mnist"
                 % args.source)
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir):
        sys.exit("make_fashion: %s is not empty; remove it or pick another folder"
                 % args.output_dir)
    count = write_fashion(args.output_dir, args.per_class, args.split, args.source)
    print("wrote %d Fashion-MNIST images to %s" % (count, args.output_dir))


if __name__ == "__main__":
    main()
