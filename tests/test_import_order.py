"""A script that imported numpy before specli, on a CUDA build, is told so once."""

from __future__ import annotations

import subprocess
import sys
import warnings

from specli.llama import backend


def test_numpy_first_on_a_cuda_build_warns(monkeypatch):
    monkeypatch.setattr(backend, "_NUMPY_FIRST", True)
    monkeypatch.setattr(backend, "library_versions", lambda: {"system_info": "CUDA : ARCHS = 900 | USE_GRAPHS = 1"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend._warn_import_order()
    assert [str(w.message) for w in caught] == [
        "numpy was imported before llama.cpp's CUDA libraries, which can crash model loads (SIGSEGV) on some "
        "CUDA builds: import specli before numpy"]


def test_no_warning_without_cuda_or_when_specli_came_first(monkeypatch):
    for numpy_first, info in ((True, "CPU : AVX2 = 1"), (False, "CUDA : ARCHS = 900")):
        monkeypatch.setattr(backend, "_NUMPY_FIRST", numpy_first)
        monkeypatch.setattr(backend, "library_versions", lambda info=info: {"system_info": info})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            backend._warn_import_order()


def test_the_order_is_read_at_import():
    code = "import numpy, specli.llama.backend as b; print(b._NUMPY_FIRST)"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    after = subprocess.run([sys.executable, "-c", code.replace("numpy, ", "")], capture_output=True, text=True,
                           timeout=120)
    assert (first.stdout.strip(), after.stdout.strip()) == ("True", "False"), first.stderr + after.stderr
