"""Files the tools write at a path the user gave (slimserve/outputs.py): a disk that
fills while they are written is one line naming the flag and the path, the previous file
stays as it was and nothing half-written is left beside it. The disk fills for real: the
writer runs in a child process whose file-size limit (RLIMIT_FSIZE) is 4 KiB, so a write
past it fails with EFBIG as on a full file system."""
import json
import os
import subprocess
import sys

from tests.helpers import ROOT

_WRITER = """
import json, resource, signal, sys
from slimserve import errors
from slimserve import outputs
from slimserve.serving.bulk import report as bulk_report
from slimserve.serving.tuning import batching_tuner, tuner
folder = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
best = {"max_batch_size": 8, "batch_timeout_micros": 0, "num_batch_threads": 1,
        "max_enqueued_batches": 100, "images_per_s": 1.0, "p99_ms": 1.0}
writes = [
    ("summary.json", lambda p: bulk_report.write_summary({"classes": ["x" * 9000]}, p)),
    ("server.flags", lambda p: tuner.write_flagfile(p, ["--model_name=" + "m" * 9000])),
    ("batching.config", lambda p: batching_tuner.write_config(
        p, best, [], 100, 4, measured="| row |\\n" * 2000)),
    ("confusion.png", lambda p: outputs.write_file(
        p, "--confusion_matrix", lambda name: open(name, "wb").write(b"\\0" * 9000))),
]
said = []
for name, write in writes:
    try:
        write(folder + "/" + name)
        said.append("written")
    except errors.UserError as error:
        said.append(str(error))
print(json.dumps(said))
"""


def test_a_full_disk_is_one_line_naming_the_flag_and_nothing_is_half_written(tmp_path):
    names = ["summary.json", "server.flags", "batching.config", "confusion.png"]
    for name in names:
        (tmp_path / name).write_text("the previous run's file\n")
    out = subprocess.run([sys.executable, "-c", _WRITER, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == ["%s %s: File too large" % (flag, tmp_path / name) for flag, name in zip(
        ("--summary", "--output_flags", "--output_config", "--confusion_matrix"), names)]
    assert sorted(os.listdir(tmp_path)) == sorted(names)  # no temporary file left
    for name in names:
        assert (tmp_path / name).read_text() == "the previous run's file\n"
