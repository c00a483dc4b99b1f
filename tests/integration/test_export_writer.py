"""Version allocation and cleanup under concurrent exporters, and the listing and
pruning rules, on real directories with real threads and processes.

Writers here use the same claim/publish calls as write_saved_model, each filling its
claimed directory with files that name it, so a shared or stolen directory shows.
"""
import os
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from slimserve import errors as user_errors
from slimserve.export import versions
from tests import helpers

_PROCESS_WRITER = r"""
import os, sys, time
from slimserve.export import versions
base, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
deadline = time.monotonic() + 120
while not os.path.exists(go):  # start together: contention is the point
    assert time.monotonic() < deadline, "no go signal"
    time.sleep(0.001)
for i in range(count):
    version, temp_dir = versions.claim_version(base)
    with open(os.path.join(temp_dir, "owner"), "w") as handle:
        handle.write("%s-%d" % (name, i))
    versions.remove_stale_temp_dirs(base)  # what each export CLI run does first
    versions.publish(base, version, temp_dir)
print("done")
"""


def _write_one(base, owner):
    version, temp_dir = versions.claim_version(base)
    with open(os.path.join(temp_dir, "owner"), "w") as handle:
        handle.write(owner)
    versions.remove_stale_temp_dirs(base)
    return versions.publish(base, version, temp_dir)


def _owners(base):
    """{version: owner} of every published version; fails on leftovers."""
    names = os.listdir(base)
    assert all(name.isdigit() for name in names), names  # no .tmp-* left behind
    owners = {}
    for name in names:
        with open(os.path.join(base, name, "owner")) as handle:
            owners[int(name)] = handle.read()
        assert os.listdir(os.path.join(base, name)) == ["owner"]
    return owners


def test_concurrent_threads_get_distinct_versions(tmp_path):
    base = str(tmp_path / "export")
    threads_count, per_thread = 8, 10
    barrier = threading.Barrier(threads_count)
    failures = []

    def run(name):
        try:
            barrier.wait()
            for i in range(per_thread):
                _write_one(base, "%s-%d" % (name, i))
        except Exception as error:  # pylint: disable=broad-except
            failures.append(error)

    threads = [threading.Thread(target=run, args=("t%d" % n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    owners = _owners(base)
    assert sorted(owners.values()) == sorted(
        "t%d-%d" % (n, i) for n in range(threads_count) for i in range(per_thread))
    assert versions.list_versions(base) == sorted(owners)


def test_concurrent_processes_get_distinct_versions(tmp_path):
    base = str(tmp_path / "export")
    go = str(tmp_path / "go")
    env = dict(os.environ, PYTHONPATH=helpers.ROOT + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    processes = [subprocess.Popen([sys.executable, "-c", _PROCESS_WRITER, base, "p%d" % n,
                                   "15", go], cwd=helpers.ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in range(3)]
    with open(go, "w"):
        pass
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0 and "done" in out, err[-3000:]
    owners = _owners(base)
    assert sorted(owners.values()) == sorted(
        "p%d-%d" % (n, i) for n in range(3) for i in range(15))


def test_a_claimed_version_is_never_reused_and_same_second_writers_differ(tmp_path):
    base = str(tmp_path / "export")
    first, first_dir = versions.claim_version(base)
    second, second_dir = versions.claim_version(base)  # same second, first still writing
    assert second == first + 1 and first_dir != second_dir
    assert versions.next_version(base) == second + 1
    versions.publish(base, first, first_dir)
    versions.publish(base, second, second_dir)
    assert versions.list_versions(base) == [first, second]


def test_stale_temp_dirs_go_by_age_and_live_ones_stay(tmp_path):
    base = tmp_path / "export"
    live_version, live_dir = versions.claim_version(str(base))
    (base / ".tmp-123").mkdir()
    (base / ".tmp-123" / "variables").mkdir()
    old = time.time() - 2 * versions.STALE_TEMP_SECONDS
    for path in (base / ".tmp-123" / "variables", base / ".tmp-123"):
        os.utime(path, (old, old))
    assert versions.remove_stale_temp_dirs(str(base)) == [".tmp-123"]
    assert os.path.isdir(live_dir)
    # An old directory with a recently written file inside is an export in progress.
    (base / ".tmp-124").mkdir()
    (base / ".tmp-124" / "saved_model.pb").write_bytes(b"x")
    os.utime(base / ".tmp-124", (old, old))
    assert versions.remove_stale_temp_dirs(str(base)) == []
    assert live_version not in versions.list_versions(str(base))


def test_the_owner_file_appears_whole_and_a_dead_writers_directory_goes_at_once(tmp_path):
    """The owner file is renamed into place once written: another process never sees it
    empty (a writer SIGKILLed between creating and writing it left an empty one, which
    names nobody, so the next export kept its directory for an hour). A real child
    process claims a version and dies; the next cleanup removes its directory and owner
    file at once, by the dead process, not by age."""
    base = tmp_path / "export"
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from slimserve.export import versions; "
         "print(versions.claim_version(sys.argv[1])[1])", str(base)],
        cwd=helpers.ROOT, capture_output=True, text=True, check=True)
    temp_dir = child.stdout.strip().splitlines()[-1]
    name = os.path.basename(temp_dir)
    assert sorted(os.listdir(base)) == [name, name + versions.OWNER_SUFFIX]  # no part file
    with open(temp_dir + versions.OWNER_SUFFIX) as handle:
        host, pid = handle.read().split()
    assert int(pid) != os.getpid()
    assert versions.remove_stale_temp_dirs(str(base)) == [name]
    assert os.listdir(base) == []
    # A writer killed between writing the part and renaming it leaves no owner: its
    # directory goes by age, and the part file with it; the part file is never taken
    # for a directory of its own.
    (base / ".tmp-7").mkdir()
    (base / (".tmp-7" + versions.OWNER_SUFFIX + ".part")).write_text("")
    assert versions.remove_stale_temp_dirs(str(base)) == []
    old = time.time() - 2 * versions.STALE_TEMP_SECONDS
    os.utime(base / ".tmp-7", (old, old))
    assert versions.remove_stale_temp_dirs(str(base)) == [".tmp-7"]
    assert os.listdir(base) == []


def test_versions_and_claims_through_tf_gfile_on_a_non_posix_file_system():
    """Not a local path: the claim goes through tf.io.gfile (names read by the one
    listing function that also drops GCS's trailing \"/\")."""
    base = "ram://slimserve-writer-test/export"
    for version in (5, 7):
        tf.io.gfile.makedirs("%s/%d" % (base, version))
    tf.io.gfile.makedirs(base + "/not-a-version")
    assert versions.list_versions(base) == [5, 7]
    version, temp_dir = versions.claim_version(base)
    assert version >= 8 and temp_dir.endswith("/.tmp-%d" % version)
    assert versions.next_version(base) == version + 1
    with pytest.raises(FileExistsError):
        versions._mkdir_exclusive(temp_dir)  # pylint: disable=protected-access


@pytest.mark.parametrize("keep", [0, -1, 1.5, None])
def test_exports_to_keep_below_one_is_refused_by_name(keep):
    with pytest.raises(user_errors.UserError, match="--exports_to_keep"):
        versions.check_exports_to_keep(keep)


def test_prune_keeps_the_newest(tmp_path):
    base = tmp_path / "export"
    for version in (3, 10, 7, 12):
        (base / str(version)).mkdir(parents=True)
    (base / ".tmp-13").mkdir()
    assert versions.prune_versions(str(base), 2) == [3, 7]
    assert sorted(os.listdir(base)) == [".tmp-13", "10", "12"]
    with pytest.raises(user_errors.UserError, match="--exports_to_keep"):
        versions.prune_versions(str(base), 0)
    assert sorted(os.listdir(base)) == [".tmp-13", "10", "12"]


def test_pruning_and_cleanup_never_follow_a_symlink_out_of_the_export_base(tmp_path):
    """A version or temporary that is a symlink is removed as a link: what it points to,
    outside the export base, keeps every file."""
    base, outside = tmp_path / "export", tmp_path / "outside"
    (outside / "variables").mkdir(parents=True)
    (outside / "saved_model.pb").write_bytes(b"not ours")
    (base / "12").mkdir(parents=True)
    os.symlink(outside, base / "3")
    os.symlink(outside, base / ".tmp-4")
    assert versions.prune_versions(str(base), 1) == [3]
    assert versions.remove_stale_temp_dirs(str(base), max_age_seconds=0) == [".tmp-4"]
    assert sorted(os.listdir(base)) == ["12"]
    assert (outside / "saved_model.pb").read_bytes() == b"not ours"
    assert (outside / "variables").is_dir()


def test_a_writer_whose_listing_went_stale_moves_on(tmp_path, monkeypatch):
    """The interleaving threads rarely hit: writer B lists the base, then A claims (or
    claims and publishes) the number B picked. B's exclusive mkdir must notice."""
    base = str(tmp_path / "export")
    stale = versions.next_version(base)
    a_version, a_dir = versions.claim_version(base)
    assert a_version == stale
    monkeypatch.setattr(versions, "next_version", lambda _: stale)  # B's stale listing
    b_version, b_dir = versions.claim_version(base)
    assert b_version == stale + 1 and b_dir != a_dir
    versions.publish(base, a_version, a_dir)  # A done: .tmp-<stale> is free again
    c_version, _ = versions.claim_version(base)
    assert c_version == stale + 2  # not the published number, not B's claim
    assert versions.list_versions(base) == [stale]
