"""Which versions of a model to serve (ModelVersionPolicy: latest N, all, specific) and
which served versions may go, TF Serving's availability-preserving way: a version that
is no longer wanted keeps serving until a wanted one is available."""


class VersionPolicy:
    """latest N (default 1), all, or specific versions, as in ModelVersionPolicy."""

    def __init__(self, kind="latest", num_versions=1, versions=()):
        if kind not in ("latest", "all", "specific"):
            raise ValueError("version policy must be latest, all or specific, not %r" % kind)
        self.kind, self.num_versions, self.versions = kind, num_versions, set(versions)

    @classmethod
    def from_proto(cls, policy):
        which = policy.WhichOneof("policy_choice")
        if which == "all":
            return cls("all")
        if which == "specific":
            return cls("specific", versions=list(policy.specific.versions))
        if which == "latest":
            return cls("latest", policy.latest.num_versions or 1)
        return cls()

    def select(self, versions):
        """The aspired subset of the version numbers found on disk."""
        versions = sorted(versions)
        if self.kind == "all":
            return set(versions)
        if self.kind == "specific":
            return self.versions & set(versions)
        return set(versions[-self.num_versions:])

    def __eq__(self, other):
        return isinstance(other, VersionPolicy) and (
            self.kind, self.num_versions, self.versions) == (
                other.kind, other.num_versions, other.versions)

    def __repr__(self):
        if self.kind == "latest":
            return "latest(%d)" % self.num_versions
        if self.kind == "specific":
            return "specific(%s)" % sorted(self.versions)
        return "all"


def versions_to_unload(aspired, available):
    """Available versions that may be unloaded now (AvailabilityPreservingPolicy).

    Unaspired versions go once some aspired version is available, or when nothing is
    aspired at all. While every aspired version is still loading or failing, the highest
    unaspired one stays, so the model never drops to zero available versions because its
    successor is incomplete or broken.
    """
    unaspired = sorted(set(available) - set(aspired))
    if aspired and not set(aspired) & set(available):
        return unaspired[:-1]
    return unaspired
