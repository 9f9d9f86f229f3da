"""Contract test suites: one abstract suite per interface, subclassed per backend.

The library's own stores pass them (``tests/``), and a site checks its own store
against the same suite (pytest; ``pip install 'aaa_django[testing]'``):

- :class:`aaa_django.testing.eventstore.EventStoreContract` for an ``EventStore``
  (hooks: ``make_store``, ``same_log``);
- :class:`aaa_django.testing.blobstore.BlobStoreContract` for a ``BlobStore``
  (hooks: ``make_store``, ``tamper``).

Each suite module is registered for pytest's assertion rewriting, so a failing
``assert`` in a suite shows its values like one written in a ``test_*.py`` module.
"""

import pkgutil

import pytest

# The submodules by name: registering this package itself would warn, as it is
# already imported while this runs.
pytest.register_assert_rewrite(*(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)))
