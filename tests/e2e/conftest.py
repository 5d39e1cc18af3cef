"""Fixtures of the end-to-end tests: each module defines its own `region`; `api` talks to it."""

import pytest

from tests.e2e.helpers import Api


@pytest.fixture
def api(region):
    return Api(region)
