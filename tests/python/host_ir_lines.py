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


def launched_while_in_flight(fd):
    """For each communication fd posts and later waits for, in posting order: the kinds of the
    segments launched between its PostOnStream and its Wait (the work it overlaps)."""
    flights, open_ = [], {}
    for line in fd.host_ir().splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "PostOnStream":
            out = words[1].split("(")[1]  # Allreduce(T83 <- T82, ...) -> T83
            open_[out] = []
            flights.append(open_[out])
        elif words[0] == "Wait":
            open_.pop(words[1].split("(")[1].rstrip(")"), None)
        elif words[0] == "LaunchSegment":
            for kinds in open_.values():
                kinds.append(words[1].split("(")[0])
    return flights
