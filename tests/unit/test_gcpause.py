"""The collector held off around a large answer's decoding, and always given back."""

from __future__ import annotations

import gc

import pytest

from gpumon.runtime.gcpause import gc_paused


def test_held_off_inside_given_back_after_even_on_error_and_left_to_the_outermost() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not turn it back on
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a page that does not convert")
    assert gc.isenabled()


def test_a_caller_that_had_it_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
