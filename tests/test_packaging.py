"""Packaging that tells the truth: the version, the license, the changelog."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest
from support.processes import REPO

pytestmark = pytest.mark.pure


def test_version_flag_prints_the_installed_version_without_tensorflow() -> None:
    code = (
        "import sys\n"
        "from tfdp_utils import cli\n"
        "try:\n"
        "    cli.main(['--version'])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    version_line, exit_line = result.stdout.strip().splitlines()
    assert version_line == f"tfdp-utils {metadata.version('tfdp-utils')}"
    assert exit_line == "exit 0 False False"


def test_license_is_the_declared_apache_2() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


def test_changelog_has_unreleased_and_the_current_version() -> None:
    import tfdp_utils

    text = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert f"## [{tfdp_utils.__version__}]" in text
