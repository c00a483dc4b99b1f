"""One owner per output directory: a lock file that exists or not, atomically.

Training locks its model_dir (`<model_dir>/train.lock`): two trainers on one model_dir
both ran and interleaved their checkpoints. The converter locks its output_dir
(`<output_dir>/.convert.lock`, `for_output_dir`): two conversions into one folder
published a mixed data set. A retrain locks its model_dir for the whole run
(`<model_dir>/retrain.lock`, `for_retrain`), taken before it writes anything: a second
retrain replaced the first's held-out labels while the first trained. The lock file holds the holder's host, pid, process start
time and start date, so the second run's error names who holds it. A lock whose holder is
gone is stale:
- same host, and that pid is not running (or is a newer process with the same pid):
  taken over, with a log line;
- another host: this host cannot tell whether that trainer still runs, so the lock is
  refused unless `force=True` (--force_unlock), to be used once that run is gone.
Only the chief of a TF_CONFIG cluster takes the training lock (its workers share the
model_dir).
"""
import datetime
import errno
import json
import logging
import os
import socket

from slimserve import errors

LOCK_FILE = "train.lock"
CONVERT_LOCK_FILE = ".convert.lock"  # hidden, as .partial: the folder lists data only
RETRAIN_LOCK_FILE = "retrain.lock"


class LockedError(errors.UserError):
    """Another run holds the directory's lock; the message names it."""


def _process_stat(pid):
    """(state letter, start time in clock ticks since boot) of a process (Linux), or None."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            stat = handle.read()
    except OSError:
        return None
    # Fields 3 and 22, counted after the parenthesised command name (may hold spaces).
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _process_start_ticks(pid):
    stat = _process_stat(pid)
    return stat[1] if stat else None


def _alive(pid, start_ticks):
    """False when pid is gone, a zombie, or a newer process that reuses the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    stat = _process_stat(pid)
    if stat is None:
        return True  # no /proc: trust kill(pid, 0)
    state, ticks = stat
    return state != "Z" and (start_ticks is None or ticks == start_ticks)


def _describe(holder):
    return "pid %s on host %s since %s" % (holder.get("pid"), holder.get("host"),
                                          holder.get("started"))


class RunLock:
    """Context manager; `acquire()` raises LockedError naming the holder.

    directory: what is locked; lock_file: the lock's name in it. The words of the errors:
    `holder` (who runs: "trainer"), `flag` (the flag naming the directory) and `harm`
    (what two runs would do)."""

    def __init__(self, directory, force=False, lock_file=LOCK_FILE, holder="trainer",
                 flag="--model_dir", harm="two trainers on one --model_dir interleave "
                 "checkpoints"):
        # O_EXCL means nothing on object stores (gs://, s3://): no lock is taken there.
        self.remote = "://" in str(directory)
        self.path = os.path.join(str(directory), lock_file)
        self._force = force
        self._held = False
        self._holder_word, self._flag, self._harm = holder, flag, harm

    @classmethod
    def for_output_dir(cls, output_dir, force=False):
        """The converter's lock on its --output_dir."""
        return cls(output_dir, force, CONVERT_LOCK_FILE, "conversion", "--output_dir",
                   "two conversions into one --output_dir publish a mixed data set")

    @classmethod
    def for_retrain(cls, model_dir, force=False):
        """slimserve-retrain's lock on its --model_dir, held from before its first write
        (the new labels converted, the held-out part among them) to its report; the
        fine-tune inside takes the trainer's own lock as well."""
        return cls(model_dir, force, RETRAIN_LOCK_FILE, "retrain", "--model_dir",
                   "two retrains on one --model_dir replace each other's held-out labels "
                   "and data while one trains")

    def _holder(self):
        try:
            with open(self.path) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # not ours: unreadable or half-written by an older version

    def _create(self):
        pid = os.getpid()
        info = {"host": socket.gethostname(), "pid": pid,
                "start_ticks": _process_start_ticks(pid),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
        # Written whole under a private name, then hard-linked into place (fails if the
        # lock exists): a lock file is never seen empty, so a run starting at the same
        # moment cannot mistake a half-written lock for a dead holder's and take it over.
        private = "%s.%s.%d" % (self.path, socket.gethostname(), pid)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(info, handle)
            try:
                os.link(private, self.path)
            except OSError as error:
                if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise  # FileExistsError included
                # No hard links on this file system: create it exclusively instead.
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "w") as handle:
                    json.dump(info, handle)
        finally:
            os.remove(private)
        self._held = True

    def acquire(self):
        if self.remote:
            logging.warning("%s is not on a local filesystem: no lock taken; make sure no "
                            "other %s uses this %s", os.path.dirname(self.path),
                            self._holder_word, self._flag)
            return self
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        for _ in range(3):  # a lost race against another stale-lock taker: look again
            try:
                self._create()
                return self
            except FileExistsError:
                pass
            holder = self._holder()
            if holder is None:
                continue  # released meanwhile
            here = socket.gethostname()
            if not holder:
                reason = "unreadable (its writer died while taking it)"
            elif holder.get("host") == here and not _alive(int(holder.get("pid", 0)),
                                                           holder.get("start_ticks")):
                reason = "stale: %s is no longer running" % _describe(holder)
            elif self._force:
                reason = "held by %s, taken over by --force_unlock" % _describe(holder)
            elif holder.get("host") == here:
                raise LockedError(
                    "%s is held by another %s, %s; wait for it to finish or stop it "
                    "(%s), or use another %s" % (self.path, self._holder_word,
                                                 _describe(holder), self._harm, self._flag))
            else:
                raise LockedError(
                    "%s is held by a %s on another host, %s; this host cannot tell "
                    "whether it still runs. If it is gone, rerun with --force_unlock; "
                    "otherwise use another %s" % (self.path, self._holder_word,
                                                  _describe(holder), self._flag))
            logging.warning("lock %s was %s; taking it over", self.path, reason)
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        raise LockedError("%s: could not take the lock (others keep taking it)" % self.path)

    def release(self):
        if self._held:
            self._held = False
            holder = self._holder()
            if holder and holder.get("pid") == os.getpid() and (
                    holder.get("host") == socket.gethostname()):
                os.remove(self.path)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
