"""slimserve/cpu.py: what the CPU can do, and TensorFlow's oneDNN switch set before
TensorFlow loads on every x86 CPU (a user's own TF_ENABLE_ONEDNN_OPTS wins)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from slimserve import cpu
from tests.helpers import ROOT

AVX2_EPYC = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
             "flags\t\t: fpu sse2 avx avx2 fma\n")
AMX_XEON = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
            "flags\t\t: avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n")


def _cpuinfo(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_flags_model_and_bf16_are_read_from_cpuinfo(tmp_path):
    epyc = _cpuinfo(tmp_path, "epyc", AVX2_EPYC)
    xeon = _cpuinfo(tmp_path, "xeon", AMX_XEON)
    assert cpu.cpu_flags(epyc) >= {"avx2", "fma"}
    assert cpu.cpu_model_name(epyc) == "AMD EPYC 7B13"
    assert cpu.cpu_supports_bf16(epyc) is False and cpu.cpu_supports_bf16(xeon) is True
    assert cpu.cpu_supports_bf16(str(tmp_path / "missing")) is None
    line = cpu.describe(epyc, environ={})
    assert "AMD EPYC 7B13" in line and "avx2 fma" in line and "bf16: no" in line
    assert "TF_ENABLE_ONEDNN_OPTS=TF default (off)" in line
    assert "TF default (on)" in cpu.describe(xeon, environ={})
    assert "amx_bf16" in cpu.describe(xeon, environ={})


def test_onednn_is_set_on_x86_unless_the_user_set_it_or_tensorflow_came_first():
    environ = {}
    assert cpu.enable_onednn(environ, machine="x86_64", modules={}) == "set"
    assert environ == {cpu.ONEDNN_VARIABLE: "1"}
    user = {cpu.ONEDNN_VARIABLE: "0"}
    assert cpu.enable_onednn(user, machine="x86_64", modules={}) == "user"
    assert user == {cpu.ONEDNN_VARIABLE: "0"}
    arm = {}
    assert cpu.enable_onednn(arm, machine="aarch64", modules={}) == "not-x86" and not arm
    late = {}
    assert cpu.enable_onednn(late, machine="AMD64", modules={"tensorflow": object()}) == "late"
    assert not late


def test_frozen_weights_are_assumed_only_where_nobody_chose_and_tensorflow_waits():
    environ = {}
    assert cpu.assume_frozen_weights(environ, modules={}) == "set"
    assert environ == {cpu.FROZEN_WEIGHTS_VARIABLE: "1"}
    user = {cpu.FROZEN_WEIGHTS_VARIABLE: "0"}
    assert cpu.assume_frozen_weights(user, modules={}) == "user" and user[
        cpu.FROZEN_WEIGHTS_VARIABLE] == "0"
    late = {}
    assert cpu.assume_frozen_weights(late, modules={"tensorflow": 1}) == "late" and not late


@pytest.mark.parametrize("command, frozen", [("slimserve-server", "1"),
                                             ("slimserve-predict", "1"),
                                             ("slimserve-train", None),
                                             ("slimserve-retrain", None)])
def test_only_inference_commands_freeze_onednn_weights(command, frozen):
    """The server and bulk inference keep converted filters; training never does (its
    filters change at every step)."""
    env = {k: v for k, v in os.environ.items() if k != cpu.FROZEN_WEIGHTS_VARIABLE}
    code = ("import sys, os\nsys.argv = [%r]\nimport slimserve.cli\n"
            "print(os.environ.get(%r))" % (command, cpu.FROZEN_WEIGHTS_VARIABLE))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300, check=True).stdout.split()
    assert out[-1] == str(frozen)


def _oneDNN_in_child(value):
    """What a fresh interpreter that imports slimserve, then TensorFlow, runs with."""
    env = {k: v for k, v in os.environ.items() if k != cpu.ONEDNN_VARIABLE}
    if value is not None:
        env[cpu.ONEDNN_VARIABLE] = value
    code = ("import slimserve, os\n"
            "from tensorflow.python.util import _pywrap_util_port as port\n"
            "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'), port.IsMklEnabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300, check=True).stdout.split()
    return out[0], out[1] == "True"


def test_a_fresh_process_runs_onednn_and_the_users_zero_turns_it_off():
    if not cpu.is_x86():
        return  # nothing is switched on other CPUs; the unit test above covers the rule
    assert _oneDNN_in_child(None) == ("1", True)
    assert _oneDNN_in_child("0") == ("0", False)


def _probabilities(export_dir, data_dir, value, target):
    """The export's serving_default probabilities on 64 validation digits, computed in a
    child with TF_ENABLE_ONEDNN_OPTS=value (None: slimserve's choice)."""
    env = {k: v for k, v in os.environ.items() if k != cpu.ONEDNN_VARIABLE}
    if value is not None:
        env[cpu.ONEDNN_VARIABLE] = value
    code = ("import sys, numpy as np, slimserve\n"
            "from slimserve.estimator import splits\n"
            "from slimserve.serving.core import servable\n"
            "images = splits.read_images(sys.argv[2], 'validation', 64)[0]\n"
            "s = servable.Servable('m', 1, sys.argv[1])\n"
            "out = s.run(s.signatures['serving_default'],\n"
            "            {'image_bytes': np.array(images, dtype=object)}, ['probabilities'])\n"
            "np.save(sys.argv[3], out['probabilities'])\n")
    subprocess.run([sys.executable, "-c", code, export_dir, data_dir, target], env=env,
                   cwd=ROOT, timeout=600, check=True, capture_output=True)
    return np.load(target)


# How far two kernel libraries may move a probability: the tolerance export verification
# allows between batch compositions of the same network (export/verify.py checks an image
# alone against it in a batch at 1e-4), which sum in different orders just as oneDNN and
# Eigen do. Measured: at most 1.02e-5 on 64 validation digits (AVX2 EPYC).
KERNEL_TOLERANCE = 1e-4


def test_onednn_and_eigen_agree_on_every_class_within_the_batch_tolerance(
        export_dir, digits_data, tmp_path):
    """The switch is safe to turn on: the trained export's probabilities on real digits
    with oneDNN (slimserve's default) and with Eigen (TF_ENABLE_ONEDNN_OPTS=0) give the
    same class on every image and differ by less than KERNEL_TOLERANCE."""
    onednn = _probabilities(export_dir, digits_data, None, str(tmp_path / "onednn.npy"))
    eigen = _probabilities(export_dir, digits_data, "0", str(tmp_path / "eigen.npy"))
    assert onednn.shape == (64, 10)
    assert float(np.max(np.abs(onednn - eigen))) < KERNEL_TOLERANCE
    assert (onednn.argmax(1) == eigen.argmax(1)).all()
