"""Skip markers for tests of what models/native builds at first use (a compiler, headers, x86-64 Linux)."""

from collections.abc import Callable

import pytest

from toolrl.models.native import KernelUnavailable


def needs(load: Callable[[], object], what: str) -> pytest.MarkDecorator:
    """Skip, saying why, where `load()` raises KernelUnavailable here."""
    try:
        load()
    except KernelUnavailable as exc:
        return pytest.mark.skipif(True, reason=f"{what} cannot be built here: {exc}")
    return pytest.mark.skipif(False, reason=f"{what} is built")


def fresh_home_forgetting(*cached: Callable) -> Callable:
    """A `fresh_home` fixture: a TOOLRL_HOME with nothing built, and the `cached` functions (a module's load() and
    its log-once) forgetting what they returned, before and after the test. A library already loaded stays in
    the process (tensors it allocated keep it); the next load() opens the fresh home's."""

    @pytest.fixture
    def fresh_home(tmp_path, monkeypatch):
        monkeypatch.setenv("TOOLRL_HOME", str(tmp_path / "home"))
        for function in cached:
            function.cache_clear()
        yield tmp_path / "home"
        for function in cached:
            function.cache_clear()

    return fresh_home
