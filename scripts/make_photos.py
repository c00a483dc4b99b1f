"""Writes ImageNet-like photos for the input-pipeline benchmark: random ~500x375 crops
of the real photographs bundled with scikit-learn and scikit-image, JPEG quality 90,
as a two-class folder tree. No network."""
import argparse
import os

import numpy as np
from PIL import Image


def source_photos():
    from skimage import data  # pylint: disable=import-outside-toplevel
    from sklearn.datasets import load_sample_images  # pylint: disable=import-outside-toplevel
    photos = list(load_sample_images().images)
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                 "hubble_deep_field", "retina"):
        photos.append(getattr(data, name)())
    return [np.asarray(p, np.uint8) for p in photos]


def write_photos(output_dir, count=400, seed=0, width=500, height=375):
    rng = np.random.RandomState(seed)
    photos = source_photos()
    for index in range(count):
        photo = Image.fromarray(photos[index % len(photos)])
        scale = rng.uniform(1.0, 1.6) * max(width / photo.width, height / photo.height)
        resized = photo.resize((int(photo.width * scale) + 1, int(photo.height * scale) + 1),
                               Image.BILINEAR)
        left = rng.randint(0, resized.width - width + 1)
        top = rng.randint(0, resized.height - height + 1)
        crop = resized.crop((left, top, left + width, top + height))
        if rng.rand() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        folder = os.path.join(output_dir, "class_%d" % (index % 2))
        os.makedirs(folder, exist_ok=True)
        crop.save(os.path.join(folder, "photo_%05d.jpg" % index), quality=90)
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="Folder to create.")
    parser.add_argument("--count", type=int, default=400, help="Number of photos.")
    parser.add_argument("--seed", type=int, default=0, help="Crop seed.")
    args = parser.parse_args()
    print("wrote %d photos to %s" % (write_photos(args.output_dir, args.count, args.seed),
                                    args.output_dir))


if __name__ == "__main__":
    main()
