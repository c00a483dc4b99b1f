"""Which versions of a model to serve (ModelVersionPolicy: latest N, all, specific) and
which served version goes next, TF Serving's availability-preserving way: a version that
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


def next_unload(aspired, available):
    """The version to unload next, or None (AvailabilityPreservingPolicy::GetNextAction,
    which the manager asks again after each action): the lowest available version no
    longer aspired, when nothing is aspired, when an aspired version is available, or
    when more than one unaspired version is available (the highest of them stays). So an
    unaspired version goes before a new one loads whenever another aspired version keeps
    serving, and stays while every aspired version is still loading or failing."""
    aspired, available = set(aspired), set(available)
    unaspired = sorted(available - aspired)
    if unaspired and (not aspired or aspired & available or len(unaspired) > 1):
        return unaspired[0]
    return None
