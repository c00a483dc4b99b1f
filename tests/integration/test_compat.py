"""The TF 2.15 / tf_slim seams of estimator/compat.py that a fresh process shows."""
import subprocess
import sys

from tests.helpers import ROOT

_IMPORTS = """
import sys
from slimserve.estimator import model, nets
before = "sklearn" in sys.modules
import sklearn.metrics
print(before, nets.NETS["resnet_v1_50"].name, sklearn.metrics.accuracy_score([1, 0], [1, 1]))
"""


def test_tf_slim_is_imported_without_scikit_learn_which_stays_importable():
    """tf_slim's init would import scikit-learn (and scipy) for a loss no net uses: ~0.7 s
    and 50 MB in every process that trains or exports."""
    process = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True,
                             text=True, cwd=ROOT, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    assert process.stdout.split() == ["False", "resnet_v1_50", "0.5"]
