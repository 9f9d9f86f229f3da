"""Contract test suites: one abstract suite per interface, subclassed per backend.

Each suite module is registered for pytest's assertion rewriting, so a failing
``assert`` in a suite shows its values like one written in a ``test_*.py`` module.
"""

import pkgutil

import pytest

# The submodules by name: registering this package itself would warn, as it is
# already imported while this runs.
pytest.register_assert_rewrite(*(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)))
