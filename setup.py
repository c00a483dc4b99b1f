"""slimserve: from a folder of labelled images to a fine-tuned TF-Slim ResNet served by
TensorFlow Serving."""
import sys

if not ((3, 9) <= sys.version_info[:2] <= (3, 11)):
    sys.exit("slimserve needs Python 3.9, 3.10 or 3.11 (TensorFlow 2.15, the last release "
             "with tf.estimator, has no wheels for Python %d.%d)." % sys.version_info[:2])

from setuptools import find_packages, setup  # noqa: E402  pylint: disable=g-import-not-at-top

# The repository keeps the four libraries as top-level folders (the project's agreed
# layout); installed, they live under the one import name `slimserve`, so a pip install
# adds exactly one top-level name to site-packages, in editable and normal installs alike.
LIBRARIES = ("estimator", "export", "serving", "flywheel")
PACKAGE_DIR = {"slimserve": "slimserve"}
PACKAGES = ["slimserve"] + ["slimserve." + p for p in find_packages("slimserve")]
for _library in LIBRARIES:
    PACKAGE_DIR["slimserve." + _library] = _library
    PACKAGES += ["slimserve." + _library] + ["slimserve.%s.%s" % (_library, p)
                                             for p in find_packages(_library)]

setup(
    name="slimserve",
    version="0.1.0",
    description=" ".join(__doc__.split()),
    python_requires=">=3.9,<3.12",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"slimserve.serving": ["tfserving/*", "kubernetes/*"],
                  # the recipes slimserve-train --recipe=NAME reads (configs/ has copies)
                  "slimserve.estimator.recipes": ["*.flags"]},
    install_requires=[
        "tensorflow>=2.15,<2.16",
        "tensorflow-estimator>=2.15,<2.16",
        "tf-keras>=2.15,<2.16",
        "tf-slim>=1.1,<1.2",
        "tensorflow-serving-api>=2.15,<2.16",
        "grpcio>=1.48",
        # grpc.health.v1 for --enable_grpc_healthcheck_service; 1.63+ needs protobuf 5,
        # which TensorFlow 2.15 does not allow.
        "grpcio-health-checking>=1.62,<1.63",
        "numpy>=1.23,<2",
        "absl-py>=1.0",
        "Pillow>=9.0",
        "tqdm>=4.60",
        "waitress>=3.0.2,<3.1",  # the REST API's HTTP server (serving/api/rest_api.py subclasses it)
        # FlexBuffers: the SignatureDefs TF Serving keeps in a model.tflite's metadata
        # (serving/core/tflite_model.py); TensorFlow 2.15 itself requires >= 23.5.26.
        "flatbuffers>=23.5.26",
        # The /monitoring/prometheus/metrics exposition (registry, format) and the parser
        # the tuner and bench-serve read it back with (serving/observability/metrics.py).
        "prometheus_client>=0.17,<1",
        # TF Text's op libraries: TF Serving links them into tensorflow_model_server, so
        # models using them load there (serving/core/custom_ops.py registers them here).
        "tensorflow-text>=2.15,<2.16",
        # The second runtime (--prefer_openvino_model, slimserve-export --openvino;
        # serving/core/openvino_servable.py) and its int8 post-training quantization
        # (--openvino_int8). Their current wheels need Python >= 3.10; on 3.9 they are left
        # out and the server runs every version on TensorFlow, saying so in one line.
        # openvino 2026.4 and nncf 3.4 install beside tensorflow 2.15.1, protobuf 4.25 and
        # numpy 1.26 (`pip check` clean).
        "openvino>=2025,<2027; python_version>='3.10'",
        "nncf>=2.14; python_version>='3.10'",
    ],
    extras_require={
        # pytest-xdist: `make test` runs the suite on two workers (tests/scheduling.py);
        # pytest-cov measures line coverage across them (docs/development.md).
        "test": ["pytest>=7", "pytest-xdist>=3.5", "pytest-cov>=4", "scikit-learn>=1.1",
                 "scikit-image>=0.19", "matplotlib>=3.5", "cryptography>=41",
                 "kubernetes-validate>=1.28", "PyYAML>=5.4",
                 # drives Debian's headless Chromium (chromium-driver) in the labelling
                 # page's browser test (tests/test_label_browser.py); no browser download
                 "selenium>=4.15,<5"],
        # Beam >= 2.72 accepts the grpcio (1.85) and protobuf 4.25 tensorflow 2.15 runs
        # with; 2.61-2.71 pin grpcio < 1.66. Python 3.9 gets the last Beam for it.
        "beam": ["apache-beam>=2.72,<3; python_version>='3.10'",
                 "apache-beam>=2.61,<2.72; python_version<'3.10'"],
        # benchmarks/profile_server.py samples a loaded server's Python stacks with it
        "dev": ["py-spy>=0.3"],
    },
    entry_points={"console_scripts": [
        "slimserve-convert=slimserve.cli.convert:run",
        "slimserve-train=slimserve.cli.train:run",
        "slimserve-export=slimserve.cli.export:run",
        "slimserve-server=slimserve.cli.server:run",
        "slimserve-client=slimserve.cli.client:run",
        "slimserve-loadtest=slimserve.cli.loadtest:run",
        "slimserve-compare=slimserve.cli.compare:run",
        "slimserve-tune=slimserve.cli.tune:run",
        "slimserve-tune-batching=slimserve.cli.tune_batching:run",
        "slimserve-predict=slimserve.cli.predict:run",
        "slimserve-label=slimserve.cli.label:run",
        "slimserve-drift=slimserve.cli.drift:run",
        "slimserve-retrain=slimserve.cli.retrain:run",
    ]},
)
