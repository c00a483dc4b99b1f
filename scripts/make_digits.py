"""Writes scikit-learn's bundled handwritten digits (1,797 real 8x8 scans, 10 classes)
as an image folder tree `<output_dir>/<digit>/digit_NNNN.{jpg,png}`.

The project's demo and test data set: no network, real images, a JPEG/PNG mix so
the converter's re-encoding path runs too.
"""
import argparse
import os
import sys

import numpy as np
from PIL import Image


def write_digits(output_dir, size=64, png_every=5, limit=None, colour=True, classes=None):
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    digits = load_digits()
    images, targets = digits.images, digits.target
    if limit:
        images, targets = images[:limit], targets[:limit]
    rng = np.random.RandomState(0)
    written = 0
    for index, (pixels, target) in enumerate(zip(images, targets)):
        if classes is not None and int(target) not in classes:
            continue
        grey = (pixels / 16.0 * 255.0).astype(np.uint8)
        image = Image.fromarray(255 - grey, mode="L").resize((size, size), Image.BICUBIC)
        if colour:  # a faint random tint: real RGB input, not three equal channels
            tint = rng.uniform(0.8, 1.0, size=3)
            array = np.asarray(image, np.float32)[..., None] * tint
            image = Image.fromarray(array.astype(np.uint8), mode="RGB")
        folder = os.path.join(output_dir, str(target))
        os.makedirs(folder, exist_ok=True)
        if png_every and index % png_every == 0:
            image.save(os.path.join(folder, "digit_%04d.png" % index))
        else:
            image.save(os.path.join(folder, "digit_%04d.jpg" % index), quality=92)
        written += 1
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="Folder to create.")
    parser.add_argument("--size", type=int, default=64, help="Side of the upscaled images.")
    parser.add_argument("--png_every", type=int, default=5,
                        help="Every n-th image is written as PNG (0: none).")
    parser.add_argument("--limit", type=int, default=None, help="Write only the first N.")
    parser.add_argument("--classes", default=None,
                        help="Comma-separated digits to keep (default: all ten).")
    args = parser.parse_args(argv)
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir):
        sys.exit("make_digits: %s is not empty; remove it or pick another folder"
                 % args.output_dir)
    classes = {int(c) for c in args.classes.split(",")} if args.classes else None
    count = write_digits(args.output_dir, args.size, args.png_every, args.limit,
                         classes=classes)
    print("wrote %d digit images to %s" % (count, args.output_dir))


if __name__ == "__main__":
    main()
