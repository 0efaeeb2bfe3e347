"""Fixtures of the Course tests: one throwaway certificate authority for every bus."""

from __future__ import annotations

import pytest

from tests.support import TlsFiles
from tests.support.tls import generate_tls_files


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return generate_tls_files(tmp_path_factory.mktemp("course-tls"))
