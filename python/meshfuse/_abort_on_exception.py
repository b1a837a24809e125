"""An uncaught exception on one rank ends the whole job (MPI_Abort) instead of leaving the other
ranks to wait for it until MESHFUSE_TIMEOUT, and it skips MPI_Finalize, whose closing barrier would
wait for ranks that are still computing (or stuck in a collective) forever.

The hook runs only for exceptions that would end the interpreter anyway: it first prints the
traceback as usual, then aborts, and only in a world of more than one rank that this process has
joined. An interactive interpreter (whose excepthook runs for every exception it survives) is left
alone. MESHFUSE_ABORT_ON_EXCEPTION=0 keeps the plain exit."""
import os
import sys


def should_abort_on_exception(world_size, interactive, setting):
    """Whether an uncaught exception should end the job: a pure function, so tests can check it."""
    # Case-insensitive, as the C++ exit handler (communicator.cpp) and the settings check read it.
    if setting is not None and setting.strip().lower() in ("0", "false", "no", "off"):
        return False
    return world_size > 1 and not interactive


def _is_interactive():
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def install(communicator_class):
    previous = sys.excepthook

    def abort_on_uncaught_exception(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        try:
            if not communicator_class._exists():  # never joined a world: nothing to abort
                return
            comm = communicator_class.instance()
            if not should_abort_on_exception(comm.size, _is_interactive(), os.environ.get("MESHFUSE_ABORT_ON_EXCEPTION")):
                return
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # the hook must never hide the original error
            return
        comm._abort_job(1, f"an uncaught Python exception ({exc_type.__name__}: {exc}); "
                        "MESHFUSE_ABORT_ON_EXCEPTION=0 exits this rank alone instead")

    abort_on_uncaught_exception.meshfuse_previous = previous
    sys.excepthook = abort_on_uncaught_exception
