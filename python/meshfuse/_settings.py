"""The MESHFUSE_* environment variables of README's table, checked once when meshfuse is imported.

The library reads most of them where they act, in C++, and there a value it does not recognize falls
back to the default without a word: a typo (MESHFUSE_DEBUG=DEBUG, MESHFUSE_UCC_PROGRESS_THREAD=true)
silently changed nothing. Each such value now gives a SettingWarning naming the variable and the
values that mean something. (MESHFUSE_TIMEOUT, MESHFUSE_SEED, MESHFUSE_CPU_CODEGEN and the CUDA mask
settings are errors where they are read; they are listed here for the table's sake.)"""
import os
import warnings


class SettingWarning(UserWarning):
    """A MESHFUSE_* environment variable holds a value meshfuse ignores."""


def _one_of(*values, case_sensitive=True):
    def check(value):
        v = value if case_sensitive else value.lower()
        return v in values
    check.expected = ", ".join(values)
    return check


def _integer(low, high=None):
    def check(value):
        try:
            n = int(value)
        except ValueError:
            return False
        return n >= low and (high is None or n <= high)
    check.expected = f"an integer from {low}" + (f" to {high}" if high is not None else " up")
    return check


def _matmul_autotune(value):
    return value == "0" or _integer(2)(value)


_matmul_autotune.expected = "0, or the number of algorithms to time (2 and up; more than 64 is 64)"


def _anything(value):
    return True


_anything.expected = "any value"

_ON_OFF = _one_of("0", "1")

# Every variable of README's table (tests/python/test_settings.py keeps the two in step), with what it takes.
SETTINGS = {
    "MESHFUSE_TIMEOUT": _anything,  # checked by execute (multidevice/timeout_env.h)
    "MESHFUSE_TRACE": _anything,
    "MESHFUSE_TRACE_HOST": _ON_OFF,
    "MESHFUSE_CHECK_REPLICAS": _ON_OFF,
    "MESHFUSE_ABORT_ON_TIMEOUT": _ON_OFF,
    "MESHFUSE_ABORT_ON_EXCEPTION": _one_of("0", "1", "false", "no", "off", "true", "yes", "on", case_sensitive=False),
    "MESHFUSE_DEBUG": _one_of("info", "warn", "off", "0", case_sensitive=False),
    "MESHFUSE_OVERLAP_SM_MARGIN": _integer(0),
    "MESHFUSE_MATMUL_AUTOTUNE": _matmul_autotune,
    "MESHFUSE_MATMUL_EPILOGUES": _ON_OFF,
    "MESHFUSE_MATMUL_TF32": _ON_OFF,
    "MESHFUSE_CUDA_DGELU_EPILOGUE": _one_of("off", "dgelu", "dgelu_bgrad"),
    "MESHFUSE_MATMUL_TUNE_LOG": _anything,
    "MESHFUSE_DUMP_KERNELS": _anything,
    "MESHFUSE_ATTENTION_MASK": _one_of("narrow", "exact"),
    "MESHFUSE_ATTENTION_BACKWARD_MASK": _one_of("query_major", "key_major"),
    "MESHFUSE_ATTENTION_RNG": _one_of("cudnn", "meshfuse"),
    "MESHFUSE_ATTENTION_AUTOTUNE": _ON_OFF,
    "MESHFUSE_ATTENTION_TUNE_LOG": _anything,
    "MESHFUSE_NORM_CLUSTER": _ON_OFF,
    "MESHFUSE_NORM_PREFETCH": _anything,  # A/B knobs of the CUDA normalization kernels
    "MESHFUSE_NORM_FENCE": _anything,
    "MESHFUSE_NORM_ITEMS": _anything,
    "MESHFUSE_NORM_BUDGET": _anything,
    "MESHFUSE_NORM_RECOMPUTE": _anything,
    "MESHFUSE_NORM_MIN_BLOCKS": _anything,
    "MESHFUSE_NORM_SPLIT": _anything,
    "MESHFUSE_NORM_AUTOTUNE": _one_of("0", "1", "split"),
    "MESHFUSE_CUDA_PLAN_CACHE": _ON_OFF,
    "MESHFUSE_CUDA_BLOCK_CACHE": _ON_OFF,
    "MESHFUSE_CUDA_IPC_PLAIN_COPY": _anything,
    "MESHFUSE_UCC_PROGRESS_THREAD": _ON_OFF,
    "MESHFUSE_UCC": _ON_OFF,  # scripts/setup
    "MESHFUSE_GLOO_IFACE": _anything,
    "MESHFUSE_CPU_GEMM": _one_of("openblas", "onednn"),
    "MESHFUSE_CPU_CODEGEN": _one_of("auto", "always", "off"),
    "MESHFUSE_SEED": _anything,  # checked by execute
}


# Read where they act as errors, not ignored: the warning says what will happen.
RAISED_WHERE_READ = {"MESHFUSE_CPU_CODEGEN", "MESHFUSE_ATTENTION_MASK", "MESHFUSE_ATTENTION_BACKWARD_MASK"}


def ignored_settings(environ):
    """[(name, value, what it takes)] for each variable of SETTINGS whose (non-empty) value means nothing."""
    out = []
    for name, check in SETTINGS.items():
        value = environ.get(name)
        if value and not check(value.strip()):
            out.append((name, value, check.expected))
    return out


def warn_about_ignored_settings(environ=os.environ):
    for name, value, expected in ignored_settings(environ):
        fate = ("the execution that reads it will raise" if name in RAISED_WHERE_READ else "it is ignored")
        warnings.warn(f"{name}={value!r} is not a value meshfuse knows ({expected}); {fate} (README lists "
                      f"the variables)", SettingWarning, stacklevel=3)
