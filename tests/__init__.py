import pytest

# Helper modules the test modules import: their assert helpers report what differed, as a test's own asserts do.
pytest.register_assert_rewrite("tests.gateway_harness")
