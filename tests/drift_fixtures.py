"""What the drift, reference and retrain tests share: a cheap real digits model whose
version carries an export's reference (slimserve/testing/digits_traffic.py), images of
the traffic part of the digits (never fitted on, never in the reference), and request
logs a real server wrote for unshifted and for shifted traffic.

Imported by tests/test_drift.py and tests/test_reference.py (fixtures by import).
"""
import os

import pytest

from slimserve.testing import digits_traffic

MODEL = "digits"
UNSHIFTED = 240   # requests of held-out digits
SHIFTED = 160     # then requests of held-out digits written inverted


@pytest.fixture(scope="session")
def drift_parts(digits_dir):
    """{fit, reference, traffic}: disjoint parts of the digits tree."""
    return digits_traffic.split(digits_dir, {"fit": 0.45, "reference": 0.2, "traffic": 0.35})


@pytest.fixture(scope="session")
def drift_model(tmp_path_factory, drift_parts):
    """The base path of the digits model (version 1, with its reference)."""
    work = str(tmp_path_factory.mktemp("drift_model"))
    return digits_traffic.digits_model(work, drift_parts["fit"], drift_parts["reference"])


@pytest.fixture(scope="session")
def traffic_images(drift_parts):
    """[(encoded bytes, class)] of the traffic part."""
    return [(open(path, "rb").read(), name) for path, name in drift_parts["traffic"]]


@pytest.fixture(scope="session")
def drift_logs(tmp_path_factory, drift_model, traffic_images):
    """{"unshifted": glob, "shifted": glob}: logs of UNSHIFTED requests of held-out digits,
    and of the same followed by SHIFTED requests of inverted ones."""
    folder = tmp_path_factory.mktemp("drift_logs")
    plain = [data for data, _ in traffic_images[:UNSHIFTED]]
    inverted = [digits_traffic.shift(data, "invert")
                for data, _ in traffic_images[UNSHIFTED:UNSHIFTED + SHIFTED]]
    return {
        "unshifted": digits_traffic.log_traffic(drift_model, MODEL,
                                                os.path.join(folder, "plain", MODEL), plain),
        "shifted": digits_traffic.log_traffic(drift_model, MODEL,
                                              os.path.join(folder, "shift", MODEL),
                                              plain + inverted),
    }
