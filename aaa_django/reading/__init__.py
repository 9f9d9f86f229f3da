"""The read side the REST API and the admin share: what a run's log shows.

- :mod:`.hydrated`: the site's blob store, and events and reads hydrated from it
  (the engine's own :class:`~aaa_django.runtime.view.HydratedView`);
- :mod:`.projections`: the named projections they may fold and show.
"""
