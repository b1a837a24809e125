"""Reading a host program's text (fd.host_ir()) in tests: the kinds of the segments it launches and
of the communications it posts, in order. Single-process tests import it directly; the mp tests add
tests/python to sys.path first."""


def _kinds(fd, instruction):
    return [line.split()[1].split("(")[0] for line in fd.host_ir().splitlines()
            if line.strip().startswith(instruction)]


def launches(fd):
    """The kinds of fd's LaunchSegments (pointwise, normalization, matmul, view, ...)."""
    return _kinds(fd, "LaunchSegment")


def communications(fd):
    """The types of the communications fd posts (Allgather, Allreduce, ReduceScatter, ...)."""
    return _kinds(fd, "PostOnStream")
