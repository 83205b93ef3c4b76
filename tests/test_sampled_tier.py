"""The `sampled` tier (tests/conftest.py): a seeded half of each marked test's cases, stratified by a
parameter when asked, deselected (not skipped); --sample-all keeps every case."""

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CASES = """
import pytest

@pytest.mark.sampled(by="model")
@pytest.mark.parametrize("model", ["a", "b", "c"])
@pytest.mark.parametrize("size", [8, 16, 32, 64])
def test_stratified(model, size):
    pass

@pytest.mark.sampled
@pytest.mark.parametrize("case", range(7))
def test_plain(case):
    pass

@pytest.mark.parametrize("case", range(3))
def test_unmarked(case):
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(Path(__file__).parent / "conftest.py", pytester.path / "conftest.py")
    pytester.makepyfile(test_cases=CASES)
    return pytester


def collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def test_half_of_each_stratum_runs_and_the_rest_is_deselected(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "--sample-seed", "7", "-p", "no:cacheprovider")
    names = collected(result)
    for model in "abc":  # 2 of the 4 sizes of every model
        assert sum(f"[{size}-{model}]" in name for name in names for size in (8, 16, 32, 64)) == 2
    assert sum("test_plain" in name for name in names) == 3  # 7 // 2
    assert sum("test_unmarked" in name for name in names) == 3  # unmarked tests all run
    assert "10 deselected" in result.stdout.str()  # 6 of the 12 stratified cases, 4 of the 7 plain ones
    again = suite.runpytest("--collect-only", "-q", "--sample-seed", "7", "-p", "no:cacheprovider")
    assert collected(again) == names, "a seed repeats its draw"


def test_sample_all_runs_every_case(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "--sample-all", "-p", "no:cacheprovider")
    assert len(collected(result)) == 12 + 7 + 3 and "deselected" not in result.stdout.str()
