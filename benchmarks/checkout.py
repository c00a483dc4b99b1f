"""Runs a module of another slimserve checkout (the baseline rows' server: the previous
commit in a git worktree, say) with that checkout's libraries, not this install's.

    python benchmarks/checkout.py DIR slimserve.cli.server --port=8500 ...

PYTHONPATH=DIR alone is not enough: it finds DIR's `slimserve` package, but the editable
install maps slimserve.estimator, .export and .serving (setup.py's package_dir) to this
checkout's folders, and that mapping answers for the names DIR's `slimserve` folder does
not hold. Until this runner, every `@DIR` and baseline row since that layout (834c09c)
ran this checkout's serving code.
"""
import importlib.util
import os
import runpy
import sys

# setup.py's LIBRARIES: installed as slimserve.<name> from the checkout's <name>/ folder
LIBRARIES = ("estimator", "export", "serving")


class CheckoutFinder:
    """Finds `slimserve` and its libraries in `root` before any installed copy; their
    modules then come from the packages' own folders (their __path__)."""

    def __init__(self, root):
        self.root = root

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        parts = name.split(".")
        if parts == ["slimserve"]:
            folder = os.path.join(self.root, "slimserve")
        elif len(parts) == 2 and parts[0] == "slimserve" and parts[1] in LIBRARIES:
            folder = os.path.join(self.root, parts[1])
        else:
            return None
        init = os.path.join(folder, "__init__.py")
        if not os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(name, init,
                                                      submodule_search_locations=[folder])


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: checkout.py DIR MODULE [ARGS...]: runs MODULE with DIR's slimserve")
    root = os.path.abspath(argv[1])
    if not os.path.isfile(os.path.join(root, "slimserve", "__init__.py")):
        sys.exit("checkout.py: %s is not a slimserve checkout (no slimserve/__init__.py)"
                 % argv[1])
    sys.meta_path.insert(0, CheckoutFinder(root))
    sys.path.insert(0, root)
    sys.argv = [argv[2]] + argv[3:]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)
