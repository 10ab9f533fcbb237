"""Memory and compute quantities: accepted forms, 128 MiB granularity, clear rejections."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.partition.errors import Kind, PartitionError
from healthd.partition.quantity import check_compute_percent, format_memory, parse_memory_mib


@pytest.mark.parametrize(
    ("text", "mib"),
    [("8GiB", 8192), ("512MiB", 512), ("128MiB", 128), (" 1GiB ", 1024), ("", 0), ("0", 0), ("0MiB", 0)],
)
def test_accepted_forms(text: str, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize(
    "text", ["100MiB", "8", "8G", "8GB", "8gib", "-1GiB", "1.5GiB", "GiB", "1e3MiB", "8 GiB extra", "0x80MiB"]
)
def test_rejected_forms(text: str) -> None:
    with pytest.raises(PartitionError) as err:
        parse_memory_mib(text)
    assert err.value.kind is Kind.INVALID
    assert "memory" in err.value.message


@given(st.integers(min_value=1, max_value=10**6))
def test_mib_values_must_be_multiples_of_128(value: int) -> None:
    text = f"{value}MiB"
    if value % 128 == 0:
        assert parse_memory_mib(text) == value
    else:
        with pytest.raises(PartitionError, match="multiple of 128 MiB"):
            parse_memory_mib(text)


@given(st.integers(min_value=1, max_value=10**5))
def test_gib_always_valid_and_round_trips(gib: int) -> None:
    mib = parse_memory_mib(f"{gib}GiB")
    assert mib == gib * 1024
    assert parse_memory_mib(format_memory(mib)) == mib


@given(st.integers(min_value=1, max_value=10**5))
def test_format_round_trips(units: int) -> None:
    mib = units * 128
    assert parse_memory_mib(format_memory(mib)) == mib


@given(st.text(max_size=20))
def test_arbitrary_text_parses_or_is_rejected_cleanly(text: str) -> None:
    try:
        mib = parse_memory_mib(text)
    except PartitionError as exc:
        kind = exc.kind
        mib = 0
    else:
        kind = None
    assert kind in (None, Kind.INVALID)
    assert mib >= 0
    assert mib % 128 == 0


@given(st.integers(min_value=-(2**40), max_value=2**40))
def test_compute_percent_range(value: int) -> None:
    if 0 <= value <= 100:
        assert check_compute_percent(value) == value
    else:
        with pytest.raises(PartitionError, match="1-100"):
            check_compute_percent(value)
