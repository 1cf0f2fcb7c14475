"""torch's C++ log, quieted where its lines only repeat, with every C++ frame, what hypergrid already says.

A store connection that fails logs a C++ warning (``[W TCPStore.cpp:125] [c10d] recvValue failed ...``) followed by
every frame of the C++ stack, once per connection, before torch raises the error hypergrid reports in its own words
(`hypergrid.errors.StoreLostError`): a lost store printed about 100 ``frame #`` lines per node. torch reads its C++
log level from ``TORCH_CPP_LOG_LEVEL`` once, when it is imported; `quiet_cpp_log` sets the same setting (c10's
``FLAGS_caffe2_log_level``) in a running process. A level the user chose (``TORCH_CPP_LOG_LEVEL`` set) is left as
it is. Errors (``LOG(ERROR)``, NCCL's watchdog among them) and torch's Python-side warnings (``TORCH_WARN``) stay.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

import torch

__all__ = ["LEVEL_ENV", "quiet_cpp_log"]

#: torch's variable for its C++ log level (INFO, WARNING, ERROR, FATAL); read by torch once, at import.
LEVEL_ENV = "TORCH_CPP_LOG_LEVEL"

_ERROR = 2  # c10's severity of an error (INFO 0, WARNING 1)
_FLAG = "FLAGS_caffe2_log_level"  # what TORCH_CPP_LOG_LEVEL sets, in c10's library
_LIBRARY = "libc10.dylib" if sys.platform == "darwin" else "c10.dll" if sys.platform == "win32" else "libc10.so"


def quiet_cpp_log(environ: Mapping[str, str] | None = None) -> bool:
    """Log torch's C++ errors only, from now on in this process, unless ``TORCH_CPP_LOG_LEVEL`` is set in
    ``environ`` (default: ``os.environ``); whether the level is quieted (False also where this torch build has no
    such setting).

    Examples:
        >>> quiet_cpp_log({"TORCH_CPP_LOG_LEVEL": "INFO"})  # the user's choice stands
        False
    """
    if LEVEL_ENV in (os.environ if environ is None else environ):
        return False
    try:
        flag = ctypes.c_int.in_dll(ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", _LIBRARY)), _FLAG)
    except (OSError, ValueError):  # another build of torch: its warnings stay
        return False
    flag.value = max(flag.value, _ERROR)
    return True
